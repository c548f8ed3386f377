"""Changing a session's labels through the agent API (PATCH on the session): replace, add and
remove, checked as at create, audited, described in the OpenAPI document, and within the
token's scope and space."""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest
from django.db import connection, connections, transaction

from console.models import AuditEvent
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import Session
from sandboxes.sessions.labels import MAX_LABELS, stored
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import DOC, Agent, validate

pytestmark = pytest.mark.django_db

PATH = "/spaces/{space_id}/sessions/{key}"
NUMBERS = itertools.count()


def agent_of(world: World, scope: str = "run", space: Any = None) -> Agent:
    space = space or world.space_a
    owner = world.alice if space == world.space_a else world.charlie
    name = f"labels-{scope}-{next(NUMBERS)}"
    _, secret = do_create_api_token(space, name=name, actor=Actor(user=owner), scope=scope)
    return Agent(space.id, secret)


def patch(agent: Agent, key: str, body: Any, *, slash: str = "") -> Any:
    data = body if isinstance(body, str) else json.dumps(body)
    return agent.client.patch(agent.url(key) + slash, data, content_type="application/json", headers=agent.headers)


@pytest.fixture
def session(world: World) -> Session:
    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    return Session.objects.create(space=world.space_a, key="labelled", config=config, labels=stored(["a", "b"]))


def labels_of(session: Session) -> list[str]:
    session.refresh_from_db()
    return session.label_list


def test_labels_replace_all_and_are_audited(world: World, session: Session) -> None:
    answer = patch(agent_of(world), "labelled", {"labels": ["nightly", "team=ml", "nightly"]})
    assert answer.status_code == 200, answer.content
    assert answer.json()["labels"] == ["nightly", "team=ml"]
    validate(answer, PATH, "patch")
    assert labels_of(session) == ["nightly", "team=ml"]
    event = AuditEvent.objects.get(action="session.update", target_id=str(session.id))
    assert event.details["labels"] == ["nightly", "team=ml"]
    assert event.details["labels_before"] == ["a", "b"]
    assert event.details["api_token"].startswith("labels-run")  # who: the token
    assert patch(agent_of(world), "labelled", {"labels": []}, slash="/").json()["labels"] == []
    assert labels_of(session) == []
    assert Session.objects.filter(space=world.space_a, labels="").count() == 1


def test_add_and_remove_merge_into_the_labels_kept(world: World, session: Session) -> None:
    answer = patch(agent_of(world), "labelled", {"add_labels": ["c", "a"], "remove_labels": ["b", "zz"]})
    assert answer.status_code == 200, answer.content
    assert answer.json()["labels"] == ["a", "c"]
    assert labels_of(session) == ["a", "c"]
    assert patch(agent_of(world), "labelled", {"remove_labels": ["a"]}).json()["labels"] == ["c"]


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"labels": ["bad label"]}, "labels", "is not allowed"),
        ({"add_labels": ["ok", "no<"]}, "add_labels", "is not allowed"),
        ({"remove_labels": ["%"]}, "remove_labels", "is not allowed"),
        ({"labels": ["a"], "add_labels": ["b"]}, "labels", "not both"),
        ({}, "labels", "Nothing to change"),
        ({"labels": "a b"}, "labels", "wrong type"),
        ({"labels": [f"l{n}" for n in range(MAX_LABELS + 1)]}, "labels", f"At most {MAX_LABELS}"),
        ("[1]", "body", "JSON object"),
    ],
)
def test_bad_changes_are_400_naming_the_field_and_change_nothing(
    world: World, session: Session, body: Any, field: str, says: str
) -> None:
    answer = patch(agent_of(world), "labelled", body)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["field"] == field
    assert says in error["message"]
    validate(answer, PATH, "patch")
    assert labels_of(session) == ["a", "b"]
    assert not AuditEvent.objects.filter(action="session.update").exists()


def test_a_merge_past_the_limit_is_refused_whole(world: World, session: Session) -> None:
    adding = [f"l{n}" for n in range(MAX_LABELS - 1)]  # with a and b: one too many
    answer = patch(agent_of(world), "labelled", {"add_labels": adding})
    assert answer.status_code == 400
    assert f"At most {MAX_LABELS}" in answer.json()["error"]["message"]
    assert labels_of(session) == ["a", "b"]


def test_scope_and_space_are_checked_before_anything_changes(world: World, session: Session) -> None:
    refused = patch(agent_of(world, "read"), "labelled", {"labels": ["x"]})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "out_of_scope"
    assert patch(agent_of(world, "full"), "labelled", {"labels": ["x"]}).status_code == 200
    intruder = agent_of(world, "full", space=world.space_b)
    forged = Agent(world.space_a.id, intruder.token)
    assert patch(forged, "labelled", {"labels": ["y"]}).status_code == 404
    assert patch(agent_of(world), "nobody", {"labels": ["y"]}).status_code == 404
    assert labels_of(session) == ["x"]


def test_the_openapi_document_describes_the_change() -> None:
    operation = DOC["paths"][PATH]["patch"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == {"labels", "add_labels", "remove_labels"}
    assert {"200", "400", "401", "403", "404"} <= set(operation["responses"])


@pytest.mark.django_db(transaction=True)
def test_two_agents_adding_labels_at_once_keep_both(world: World, session: Session) -> None:
    """Each merge reads the labels it adds to under the row's lock: the test holds the row
    while both PATCHes arrive, so neither writes what it read before the other wrote."""
    agents = [agent_of(world), agent_of(world)]
    answers: list[int] = []

    def add(agent: Agent, label: str) -> None:
        try:
            answers.append(patch(agent, "labelled", {"add_labels": [label]}).status_code)
        finally:
            connections.close_all()

    with transaction.atomic():
        Session.objects.select_for_update().filter(pk=session.pk).get()
        threads = [threading.Thread(target=add, args=pair) for pair in zip(agents, ["one", "two"], strict=True)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while _waiting_on_locks() < 2:
            assert time.monotonic() < deadline, "the PATCHes never reached the row"
            time.sleep(0.02)
    for thread in threads:
        thread.join(30)
    assert answers == [200, 200]
    assert sorted(labels_of(session)) == ["a", "b", "one", "two"]
    befores = sorted(event.details["labels_before"] for event in AuditEvent.objects.filter(target_id=str(session.id)))
    assert befores in (
        [["a", "b"], ["a", "b", "one"]],
        [["a", "b"], ["a", "b", "two"]],
    )  # each audit row says what the labels were when it wrote


def _waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else read once per transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        row = cursor.fetchone()
        return int(row[0]) if row else 0
