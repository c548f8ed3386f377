"""The agent API's session routes and the network explain route, asked about a session key no
session can have (a NUL byte, which the database cannot even compare): 404 as for any unknown
session, never a 500."""

from __future__ import annotations

import pytest
from django.test import Client

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from tests.personas import World

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("suffix", ["", "/files", "/artifacts", "/commands", "/turns/end", "/inbound?port=80"])
def test_a_key_with_a_nul_byte_is_no_session(world: World, suffix: str) -> None:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    client = Client(raise_request_exception=False)
    url = f"/api/v1/spaces/{world.space_a.id}/sessions/a%00b{suffix}"
    answer = client.post(url, headers={"Authorization": f"Bearer {token}"}) if suffix == "/turns/end" else None
    answer = answer or client.get(url, headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 404, answer.content[:200]
    assert answer.json()["error"] == {"code": "not_found", "message": "No session 'a\\x00b' in this space."}


def test_explain_for_a_session_key_with_a_nul_byte_is_no_session(world: World) -> None:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    answer = Client(raise_request_exception=False).get(
        f"/api/v1/spaces/{world.space_a.id}/network/explain",
        {"destination": "pypi.test", "session": "a\x00b"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 404, answer.content[:200]
    assert answer.json()["error"]["code"] == "not_found"


def test_a_key_ending_in_a_newline_is_refused_and_makes_no_session(world: World) -> None:
    from sandboxes.models import Session
    from tests.factories import make_config

    make_config(world.space_a, name="default", is_default=True)
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    answer = Client().post(
        f"/api/v1/spaces/{world.space_a.id}/sessions/abc%0A/turns/begin",
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 400, answer.content[:200]
    assert answer.json()["error"]["field"] == "key"
    assert not Session.objects.filter(space=world.space_a).exists()
