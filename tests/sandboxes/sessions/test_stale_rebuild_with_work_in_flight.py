"""A stale rebuild never cuts someone else's work silently.

Client 1 runs a command; client 2 begins a turn on the session, which a skill install made
stale. The rebuild waits (sessions.rebuild_wait_s) for client 1's exec to end, or is deferred
to the next turn: client 1 gets its real result, never HTTP 200 with exit code 137. A
rebuild that must go on (a member's Rebuild) cuts the exec, which then answers 409
`sandbox_replaced` in words.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.utils import timezone

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from tests.personas import World
from tests.sandboxes.api.test_get_never_wakes import Agent
from tests.support.tuning import Tuned

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

KEY = "stale-rebuild"


@pytest.fixture
def agents(world: World, session_config: SandboxConfig) -> tuple[Agent, Agent]:
    _, one = do_create_api_token(world.space_a, name="client-1", actor=Actor(user=world.alice))
    _, two = do_create_api_token(world.space_a, name="client-2", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, one), Agent(world.space_a.id, two)


def run_in_thread(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        from django.db import connections

        try:
            out["response"] = call()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def started_exec(agent: Agent, seconds: int) -> tuple[threading.Thread, dict[str, Any]]:
    thread, out = run_in_thread(lambda: agent.post("exec", f'{{"shell": "sleep {seconds}; echo done"}}', key=KEY))
    session = Session.objects.get(key=KEY)
    for _ in range(100):  # until the exec is counted in flight
        session.refresh_from_db()
        if session.execs_in_flight:
            break
        threading.Event().wait(0.05)
    threading.Event().wait(0.5)  # and running in the sandbox
    return thread, out


def make_stale() -> str:
    session = Session.objects.get(key=KEY)
    Session.objects.filter(pk=session.pk).update(stale_at=timezone.now())
    return session.sandbox_id


def test_a_stale_rebuild_is_deferred_while_another_clients_exec_runs(
    tuned: Tuned, agents: tuple[Agent, Agent], settings: Any
) -> None:
    tuned({"sessions.rebuild_wait_s": 1})
    one, two = agents
    assert one.post("resolve", key=KEY).status_code == 200
    thread, out = started_exec(one, 5)
    before = make_stale()
    assert two.post("turns/begin", key=KEY).status_code == 200
    resolved = two.post("resolve", key=KEY)
    assert resolved.status_code == 200, resolved.content
    assert resolved.json()["action"] == "bound"  # deferred: the stale sandbox stays this turn
    assert resolved.json()["sandbox_id"] == before
    thread.join(30)
    result = out["response"]
    assert result.status_code == 200, result.content
    assert result.json()["exit_code"] == 0
    assert result.json()["stdout"] == "done\n"
    # The next turn, with nothing in flight, rebuilds it.
    two.post("turns/end", key=KEY)
    assert two.post("turns/begin", key=KEY).status_code == 200
    again = two.post("resolve", key=KEY)
    assert again.json()["action"] == "rebuilt", again.content
    assert again.json()["sandbox_id"] != before


def test_a_stale_rebuild_waits_for_a_short_exec_to_end(
    tuned: Tuned, agents: tuple[Agent, Agent], settings: Any
) -> None:
    tuned({"sessions.rebuild_wait_s": 15})
    one, two = agents
    assert one.post("resolve", key=KEY).status_code == 200
    thread, out = started_exec(one, 2)
    before = make_stale()
    assert two.post("turns/begin", key=KEY).status_code == 200
    resolved = two.post("resolve", key=KEY)
    thread.join(30)
    assert out["response"].status_code == 200, out["response"].content
    assert out["response"].json()["exit_code"] == 0  # finished before the rebuild, not 137
    assert resolved.json()["action"] == "rebuilt", resolved.content
    assert resolved.json()["sandbox_id"] != before


def test_an_exec_whose_sandbox_a_forced_rebuild_replaced_answers_sandbox_replaced(
    agents: tuple[Agent, Agent], world: World
) -> None:
    one, _ = agents
    assert one.post("resolve", key=KEY).status_code == 200
    thread, out = started_exec(one, 20)
    session = Session.objects.select_related("config", "space").get(key=KEY)
    Runtime().rebuild(session, actor=Actor(user=world.alice))  # a member's Rebuild: it goes now
    thread.join(30)
    response = out["response"]
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "sandbox_replaced"
    assert "replaced or removed while the command ran" in error["message"]
    assert "run it again" in error["message"]
