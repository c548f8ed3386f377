"""Background command calls whose session a DELETE removes mid-call: the agent API answers
404 "(it was deleted)", never a 500.

The DELETE is made to land at the one moment under test by a trigger of the test's own
database: when the call writes the command's row, the session and its rows go.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import BackgroundCommand, Session
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db

DELETE_ON_WRITE = """
CREATE FUNCTION pytest_delete_session_on_write() RETURNS trigger AS $$
BEGIN
    DELETE FROM {commands} WHERE session_id = NEW.session_id;
    DELETE FROM {sessions} WHERE id = NEW.session_id;
    RETURN NULL;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER pytest_delete_session_on_write AFTER UPDATE ON {commands}
    FOR EACH ROW WHEN (NEW.status <> OLD.status) EXECUTE FUNCTION pytest_delete_session_on_write();
"""


def test_reading_a_lost_commands_output_as_its_session_is_deleted_answers_404(world: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the DELETE is timed by a PostgreSQL trigger")
    config = make_config(world.space_a, name="racing")
    session = Session.objects.create(space=world.space_a, config=config, key="racing", sandbox_id="sbx-racing")
    # Running by its row, with no pump alive: the read marks it lost, writing its row.
    command = BackgroundCommand.objects.create(session=session, shell="sleep 600")
    with connection.cursor() as cursor:
        cursor.execute(
            DELETE_ON_WRITE.format(commands=BackgroundCommand._meta.db_table, sessions=Session._meta.db_table)
        )
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    answer = Client(raise_request_exception=False).get(
        f"/api/v1/spaces/{world.space_a.id}/sessions/racing/commands/{command.id}/output",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert not Session.objects.filter(pk=session.pk).exists()
    assert answer.status_code == 404, answer.content[:300]
    assert answer.json()["error"]["message"] == "No session 'racing' in this space (it was deleted)."
