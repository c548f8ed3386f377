"""Names people tell things apart by are unique: space names (ignoring case), the names of a
space's tokens in force, user emails (ignoring case, at the database too). Each refusal is a
field error that keeps what was typed, a create racing another included; the constraints'
migrations rename duplicates that exist already (a duplicate email is cleared, audited)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.urls import reverse

from console.models import AuditEvent, Space
from console.services import SYSTEM, Actor, ServiceError, do_create_space, do_update_space
from console.users import do_create_user
from sandboxes.api.tokens import do_create_api_token, do_revoke_api_token
from sandboxes.models import ApiToken
from tests.factories import make_space, make_user
from tests.personas import World

pytestmark = pytest.mark.django_db


def test_a_space_name_is_taken_ignoring_case(world: World) -> None:
    client = world.client_for("root")
    page = client.post(reverse("console:space_create"), {"name": "space a", "slug": "other-a"})
    assert page.status_code == 400
    body = page.content.decode()
    assert "There is already a space named &#x27;space a&#x27;." in body
    assert 'value="space a"' in body  # what was typed stays
    assert not Space.objects.filter(slug="other-a").exists()
    edit = client.post(reverse("console:space_edit", args=[world.space_b.id]), {"name": "SPACE A", "slug": "space-b"})
    assert edit.status_code == 400
    assert "There is already a space named" in edit.content.decode()
    world.space_b.refresh_from_db()
    assert world.space_b.name == "Space B"
    # Its own name, in other letters, is no clash.
    renamed = client.post(
        reverse("console:space_edit", args=[world.space_b.id]), {"name": "SPACE B", "slug": "space-b"}
    )
    assert renamed.status_code == 302


def test_the_services_and_the_database_refuse_a_taken_space_name(world: World) -> None:
    with pytest.raises(ServiceError) as refused:
        do_create_space(name="Space A", actor=Actor(user=world.root))
    assert refused.value.field_errors == {"name": ["There is already a space named 'Space A'."]}
    with pytest.raises(ServiceError):
        do_update_space(world.space_b, name="space a", actor=Actor(user=world.root))
    with pytest.raises(IntegrityError), transaction.atomic():
        Space.objects.create(name="SPACE A", slug="racing")


def test_token_names_are_unique_among_a_spaces_tokens_in_force(world: World) -> None:
    alice = Actor(user=world.alice)
    token, _ = do_create_api_token(world.space_a, name="agent", actor=alice)
    page = world.client_for("alice").post(reverse("sandboxes:token_list", args=[world.space_a.id]), {"name": "Agent"})
    body = page.content.decode()
    assert 'id="id_name_error"' in body
    assert "A token named &#x27;Agent&#x27; is in force in this space" in body
    assert 'value="Agent"' in body
    assert ApiToken.objects.filter(space=world.space_a).count() == 1
    do_create_api_token(world.space_b, name="agent", actor=Actor(user=world.charlie))  # another space
    do_revoke_api_token(token, actor=alice)
    do_create_api_token(world.space_a, name="agent", actor=alice)  # a revoked token frees its name
    assert ApiToken.objects.filter(name="agent").count() == 3


def test_an_email_belongs_to_one_user(world: World) -> None:
    make_user("dora", email="dora@example.test")
    page = world.client_for("root").post(
        reverse("console:user_create"), {"username": "dora2", "email": "DORA@example.test"}
    )
    assert page.status_code == 400
    body = page.content.decode()
    assert "Another user has the email &#x27;DORA@example.test&#x27;." in body
    assert 'value="dora2"' in body
    assert not type(world.root).objects.filter(username="dora2").exists()
    created = world.client_for("root").post(reverse("console:user_create"), {"username": "erin", "email": ""})
    assert created.status_code == 200  # no email is no clash


CONSOLE_BEFORE = ("console", "0010_audit_skill_git_hosts")
SANDBOXES_BEFORE = ("sandboxes", "0024_session_labels_keep_awake")


@pytest.mark.django_db(transaction=True)
def test_the_migrations_rename_existing_duplicates() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([CONSOLE_BEFORE, SANDBOXES_BEFORE])
    old = executor.loader.project_state([CONSOLE_BEFORE, SANDBOXES_BEFORE]).apps
    OldSpace = old.get_model("console", "Space")
    OldToken = old.get_model("sandboxes", "ApiToken")
    first = OldSpace.objects.create(name="Demo", slug="demo")
    OldSpace.objects.create(name="demo", slug="demo-2")
    OldSpace.objects.create(name="Demo", slug="demo-3")
    OldSpace.objects.create(name="Demo (2)", slug="demo-4")
    for index, name in enumerate(["agent", "Agent", "agent"]):
        OldToken.objects.create(space=first, name=name, prefix="sbx_x", token_hash=f"h{index}")
    OldToken.objects.create(
        space=first, name="agent", prefix="sbx_x", token_hash="revoked", revoked="2026-01-01T00:00Z"
    )
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    # The oldest keeps its name; a number already in use is skipped.
    names = dict(Space.objects.values_list("slug", "name"))
    assert names == {"demo": "Demo", "demo-2": "demo (3)", "demo-3": "Demo (4)", "demo-4": "Demo (2)"}
    tokens = ApiToken.objects.filter(revoked__isnull=True).values_list("name", flat=True)
    assert {name.lower() for name in tokens} == {"agent", "agent (2)", "agent (3)"}
    assert ApiToken.objects.get(token_hash="revoked").name == "agent"  # revoked ones keep theirs
    make_space("After")  # the constraint is in place and the table usable


@pytest.mark.django_db(transaction=True)
def test_the_migrations_rename_duplicates_of_the_longest_names() -> None:
    """A name as long as its field is cut to make room for the number: two such duplicates
    (and a space already named like the cut one) still end up with names of their own."""
    executor = MigrationExecutor(connection)
    executor.migrate([CONSOLE_BEFORE, SANDBOXES_BEFORE])
    old = executor.loader.project_state([CONSOLE_BEFORE, SANDBOXES_BEFORE]).apps
    OldSpace = old.get_model("console", "Space")
    OldToken = old.get_model("sandboxes", "ApiToken")
    long = "L" * 200
    first = OldSpace.objects.create(name=long, slug="long-1")
    for number in (2, 3):
        OldSpace.objects.create(name=long, slug=f"long-{number}")
    OldSpace.objects.create(name=f"{long[:190]} (2)", slug="long-cut")
    token_name = "t" * 100
    for index in range(3):
        OldToken.objects.create(space=first, name=token_name, prefix="sbx_x", token_hash=f"long{index}")
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    names = dict(Space.objects.values_list("slug", "name"))
    assert names["long-1"] == long
    assert names["long-cut"] == f"{long[:190]} (2)"
    assert len({name.lower() for name in names.values()}) == len(names)
    assert all(len(name) <= 200 for name in names.values())
    tokens = list(ApiToken.objects.values_list("name", flat=True))
    assert len({name.lower() for name in tokens}) == 3
    assert all(len(name) <= 100 for name in tokens)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_creates_racing_for_one_email_make_one_user_and_one_field_error() -> None:
    """The second create passes the service's check while the first's row is not committed,
    then waits on the database's index: when the first commits it gets the field error the
    check gives, not a 500, and no second user."""
    first_saved, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                do_create_user(username="first", email="race@example.test", actor=SYSTEM)
                first_saved.set()
                release.wait(30)
        finally:
            connection.close()

    def second() -> None:
        try:
            do_create_user(username="second", email="RACE@example.test", actor=SYSTEM)
        except ServiceError as exc:
            outcome["refused"] = exc
        except Exception as exc:  # anything else is the failure this test looks for
            outcome["crashed"] = exc
        finally:
            connection.close()

    one = threading.Thread(target=first)
    one.start()
    assert first_saved.wait(30)
    two = threading.Thread(target=second)
    two.start()
    try:
        waiting = 0
        for _ in range(300):  # the second is past its check, waiting on the index
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
                waiting = cursor.fetchone()[0]
            if waiting:
                break
            time.sleep(0.05)
        assert waiting == 1
    finally:
        release.set()
        one.join(30)
        two.join(30)
    assert "crashed" not in outcome, outcome
    refused = outcome["refused"]
    assert refused.field_errors == {"email": ["Another user has the email 'RACE@example.test'."]}
    User = get_user_model()
    assert list(User.objects.filter(email__iexact="race@example.test").values_list("username", flat=True)) == ["first"]
    assert not User.objects.filter(username="second").exists()


def test_the_database_refuses_a_second_user_with_an_email_in_other_letters() -> None:
    make_user("gil", email="gil@example.test")
    with pytest.raises(IntegrityError), transaction.atomic():
        make_user("gil2", email="GIL@example.test")
    make_user("nomail1", email="")
    make_user("nomail2", email="")  # users without an email are many


EMAILS_BEFORE = ("console", "0013_list_keyset_indexes")


@pytest.mark.django_db(transaction=True)
def test_the_migration_clears_existing_duplicate_emails_and_audits_it() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([EMAILS_BEFORE])
    old = executor.loader.project_state([EMAILS_BEFORE]).apps
    OldUser = old.get_model("auth", "User")
    OldUser.objects.create(username="kept", email="Same@example.test")
    OldUser.objects.create(username="later", email="same@EXAMPLE.test")
    OldUser.objects.create(username="alone", email="alone@example.test")
    OldUser.objects.create(username="none1", email="")
    OldUser.objects.create(username="none2", email="")
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    emails = dict(get_user_model().objects.values_list("username", "email"))
    assert emails == {
        "kept": "Same@example.test",
        "later": "",
        "alone": "alone@example.test",
        "none1": "",
        "none2": "",
    }
    cleared = AuditEvent.objects.get(action="user.email_cleared")
    assert cleared.details["email"] == "same@EXAMPLE.test"  # the address it had is kept
    assert cleared.details["kept_by"] == "kept"
    with pytest.raises(IntegrityError), transaction.atomic():
        make_user("again", email="SAME@example.test")


def test_an_email_equal_only_as_the_index_lowers_it_is_a_field_error(world: World) -> None:
    """The Kelvin sign (U+212A) lowers to "k" but does not upper to "K": the check must
    compare as the unique index does (lower()), or the index refuses what the check let by."""
    make_user("kim", email="k@example.test")
    page = world.client_for("root").post(
        reverse("console:user_create"), {"username": "kelvin", "email": "\u212a@example.test"}
    )
    assert page.status_code == 400
    assert "Another user has the email" in page.content.decode()
    assert not type(world.root).objects.filter(username="kelvin").exists()
