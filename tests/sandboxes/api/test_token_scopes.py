"""API token scopes and expiry: which routes each scope may call, what an expired token gets,
and that a token of another space learns nothing whatever its scope.

read-only takes the GET routes; run adds the POST, PUT and PATCH routes within a session; full adds
DELETE. The calls name a session the space does not hold, so an allowed call reaches its view
(which answers 404 for the session) and a refused one never does (403 out_of_scope).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEvent
from console.services import Actor, ServiceError
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import ApiToken
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent

pytestmark = pytest.mark.django_db

# (route class, method, suffix after the session, body)
ROUTES: list[tuple[str, str, str, Any]] = [
    ("read", "GET", "", None),
    ("read", "GET", "files", None),
    ("read", "GET", "commands", None),
    ("read", "GET", "artifacts", None),
    ("run", "POST", "pause", None),
    ("run", "POST", "turns/begin", None),
    ("run", "POST", "commands", {"argv": ["true"]}),
    ("run", "PUT", "files/content?path=notes.txt", b"hello"),
    ("run", "PUT", "input/notes.txt", b"hello"),
    ("run", "PATCH", "", {"labels": ["x"]}),
    ("delete", "DELETE", "", None),
]
ALLOWED = {"read": {"read"}, "run": {"read", "run"}, "full": {"read", "run", "delete"}}


def call(agent: Agent, method: str, suffix: str, body: Any) -> Any:
    key = "nobody-here"
    if method == "GET":
        return agent.get(key, suffix)
    if method == "POST":
        return agent.post(key, suffix, body)
    if method == "PUT":
        return agent.put(key, suffix, body)
    if method == "PATCH":
        return agent.client.patch(
            agent.url(key), json.dumps(body), content_type="application/json", headers=agent.headers
        )
    return agent.delete(key)


def agent_of(world: World, scope: str, **kwargs: Any) -> Agent:
    _, secret = do_create_api_token(
        world.space_a, name=f"t-{scope}", actor=Actor(user=world.alice), scope=scope, **kwargs
    )
    return Agent(world.space_a.id, secret)


@pytest.mark.parametrize("scope", ["read", "run", "full"])
def test_each_scope_calls_its_routes_and_is_refused_the_others(world: World, scope: str) -> None:
    agent = agent_of(world, scope)
    for route_class, method, suffix, body in ROUTES:
        answer = call(agent, method, suffix, body)
        error = json.loads(answer.content)["error"]
        if route_class in ALLOWED[scope]:
            assert answer.status_code != 403, (scope, method, suffix, error)
            assert error["code"] != "out_of_scope"
        else:
            assert answer.status_code == 403, (scope, method, suffix, answer.status_code)
            assert error["code"] == "out_of_scope"
            assert error["scope"] == scope
            assert method in error["message"]


def test_an_expired_token_is_refused_with_401_naming_the_expiry(world: World) -> None:
    token, secret = do_create_api_token(
        world.space_a, name="short", actor=Actor(user=world.alice), expires=timezone.now() + timedelta(hours=1)
    )
    agent = Agent(world.space_a.id, secret)
    assert agent.get("nobody").status_code == 404  # in force: the route answers
    ApiToken.objects.filter(pk=token.pk).update(expires=timezone.now() - timedelta(seconds=1))
    answer = agent.get("nobody")
    assert answer.status_code == 401
    error = json.loads(answer.content)["error"]
    assert error["code"] == "token_expired"
    assert "expired" in error["message"]
    assert "short" in error["message"]
    assert error["expires"]
    # An expired token of full scope is refused on every method, deletion included.
    assert agent.delete("nobody").status_code == 401


def test_a_token_cannot_be_made_already_expired_or_of_an_unknown_scope(world: World) -> None:
    actor = Actor(user=world.alice)
    with pytest.raises(ServiceError) as past:
        do_create_api_token(world.space_a, name="x", actor=actor, expires=timezone.now() - timedelta(minutes=1))
    assert "future" in past.value.message
    with pytest.raises(ServiceError) as unknown:
        do_create_api_token(world.space_a, name="x", actor=actor, scope="admin")
    assert "scope" in unknown.value.field_errors
    assert not ApiToken.objects.filter(space=world.space_a).exists()


@pytest.mark.parametrize("scope", ["read", "run", "full"])
def test_a_token_of_another_space_learns_nothing_whatever_its_scope(world: World, scope: str) -> None:
    _, secret = do_create_api_token(world.space_b, name="b", actor=Actor(user=world.charlie), scope=scope)
    forged = Agent(world.space_a.id, secret)  # space B's token, space A's routes
    for _class, method, suffix, body in ROUTES:
        answer = call(forged, method, suffix, body)
        assert answer.status_code == 404, (scope, method, suffix)
        assert json.loads(answer.content)["error"]["message"] == "No such space."
    # An expired one of another space: the same 404, not a 401 saying it exists.
    ApiToken.objects.filter(space=world.space_b).update(expires=timezone.now() - timedelta(days=1))
    assert forged.get("nobody").status_code == 404


def test_tokens_made_before_scopes_are_full_and_never_expire(world: World) -> None:
    token, _ = do_create_api_token(world.space_a, name="old", actor=Actor(user=world.alice))
    assert (token.scope, token.expires) == ("full", None)


def test_the_page_makes_a_scoped_expiring_token_and_shows_it_once_with_a_curl_example(world: World) -> None:
    client = world.client_for("alice")
    url = reverse("sandboxes:token_list", kwargs={"space_id": world.space_a.id})
    made = client.post(url, {"name": "reader", "scope": "read", "expires_in_days": "7"})
    page = made.content.decode()
    token = ApiToken.objects.get(space=world.space_a, name="reader")
    assert token.scope == "read"
    assert token.expires is not None
    assert timedelta(days=6, hours=23) < token.expires - timezone.now() <= timedelta(days=7)
    assert made["Cache-Control"] == "no-store"
    secret = page.split('id="new-token-secret">')[1].split("<")[0]
    assert secret.startswith("sck_")
    curl = page.split('id="new-token-curl">')[1].split("</pre>")[0]
    assert f"http://testserver/api/v1/spaces/{world.space_a.id}/sessions/demo" in curl
    assert secret in curl
    assert "-X POST" not in curl
    audit = AuditEvent.objects.get(action="api_token.create", details__name="reader")
    assert audit.details["scope"] == "read"
    # The list shows the scope and the expiry, never the secret again.
    listed = client.get(url).content.decode()
    assert secret not in listed
    assert "read-only" in listed
    assert "expires" in listed
    # A run token's example resolves a session.
    run = client.post(url, {"name": "runner", "scope": "run", "expires_in_days": ""}).content.decode()
    assert "-X POST" in run.split('id="new-token-curl">')[1].split("</pre>")[0]


@pytest.mark.parametrize(
    ("form", "said"),
    [
        ({"name": "x", "scope": "root", "expires_in_days": ""}, "scope"),
        ({"name": "x", "scope": "run", "expires_in_days": "-3"}, "expiry"),
        ({"name": "x", "scope": "run", "expires_in_days": "lots"}, "expiry"),
    ],
)
def test_the_page_refuses_bad_choices_in_words_and_keeps_the_name(
    world: World, form: dict[str, str], said: str
) -> None:
    client = world.client_for("alice")
    url = reverse("sandboxes:token_list", kwargs={"space_id": world.space_a.id})
    answer = client.post(url, form)
    assert answer.status_code == 200
    page = answer.content.decode()
    assert said in page.lower()
    assert 'value="x"' in page
    assert not ApiToken.objects.filter(space=world.space_a).exists()


def test_only_space_admins_make_tokens_and_csrf_is_enforced(world: World) -> None:
    url = reverse("sandboxes:token_list", kwargs={"space_id": world.space_a.id})
    assert world.client_for("bob").post(url, {"name": "m", "scope": "full"}).status_code == 403
    assert world.client_for("charlie").post(url, {"name": "m", "scope": "full"}).status_code == 404
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.alice)
    assert strict.post(url, {"name": "m", "scope": "full"}).status_code == 403
    assert not ApiToken.objects.filter(space=world.space_a).exists()
