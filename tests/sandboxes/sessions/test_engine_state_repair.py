"""A container the engine and its freezer cgroup disagree on is repaired, never left
answering 502: on the next call through the runtime, and by the reaper's pass.

The state is the one docker/for-linux#891 leaves behind, made here on purpose on the test's
own container: `docker pause`, then the freezer thawed behind the engine's back (the engine
says paused, runc says running: every unpause and exec failed with an internal error), or
the freezer frozen behind it (the engine says running, every exec failed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import docker
import pytest

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.docker.repair import FROZEN, THAWED
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.reaper import reap_config
from sandboxes.sessions.runtime import Runtime
from tests.personas import World
from tests.sandboxes.api.test_get_never_wakes import Agent
from tests.support.pause_support import answer_of, freezer, thaw_quietly

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

KEY = "engine-state-repair"


@pytest.fixture
def agent(world: World, session_config: SandboxConfig) -> Agent:
    _, token = do_create_api_token(world.space_a, name="repair", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


@pytest.fixture
def sandbox_id(agent: Agent) -> Iterator[str]:
    assert agent.post("resolve", key=KEY).status_code == 200
    container = Session.objects.get(key=KEY).sandbox_id
    try:
        yield container
    finally:
        thaw_quietly(container)


def engine_state(container: str) -> dict[str, object]:
    return docker.APIClient(timeout=10).inspect_container(container)["State"]


def paused_by_engine_running_by_runc(container: str) -> None:
    docker.APIClient(timeout=10).pause(container)
    freezer(container).thaw()
    assert engine_state(container)["Paused"] is True
    assert freezer(container).state() == THAWED
    with pytest.raises(docker.errors.APIError, match="not paused"):  # what every resume met
        docker.APIClient(timeout=10).unpause(container)


def running_by_engine_frozen_by_runc(container: str) -> None:
    cgroup = freezer(container)
    cgroup._write(FROZEN)
    for _ in range(100):
        if cgroup.state() == FROZEN:
            break
        time.sleep(0.05)
    assert engine_state(container)["Running"] is True
    assert engine_state(container)["Paused"] is False


def test_an_exec_on_a_container_paused_by_the_engine_but_running_repairs_it(agent: Agent, sandbox_id: str) -> None:
    paused_by_engine_running_by_runc(sandbox_id)
    ran = agent.post("exec", '{"shell": "echo mended"}', key=KEY)
    assert ran.status_code == 200, ran.content
    assert ran.json()["stdout"] == "mended\n"
    state = engine_state(sandbox_id)
    assert state["Running"] is True
    assert state["Paused"] is False
    assert freezer(sandbox_id).state() == THAWED
    assert Session.objects.get(key=KEY).sandbox_id == sandbox_id  # mended in place, not rebuilt


def test_an_exec_on_a_frozen_container_the_engine_calls_running_answers_in_words(agent: Agent, sandbox_id: str) -> None:
    running_by_engine_frozen_by_runc(sandbox_id)
    answers = []
    for _ in range(3):
        response = agent.post("exec", '{"shell": "echo mended"}', key=KEY)
        status, code = answer_of(response)
        answers.append((status, code or response.json()["stdout"]))
    # Never 502, and never 200 with the runtime's refusal as the command's output (exit 126).
    assert answers[0] in ((200, "mended\n"), (409, "session_not_running")), answers
    assert answers[1:] == [(200, "mended\n")] * 2, answers  # repaired by the first call
    assert freezer(sandbox_id).state() == THAWED


def test_a_resolve_of_such_a_container_is_repaired_too(agent: Agent, sandbox_id: str) -> None:
    paused_by_engine_running_by_runc(sandbox_id)
    resolved = agent.post("resolve", key=KEY)
    assert resolved.status_code == 200, resolved.content
    assert resolved.json()["state"] == "running"


def test_the_reapers_pass_repairs_a_container_nobody_calls(
    agent: Agent, sandbox_id: str, session_config: SandboxConfig
) -> None:
    paused_by_engine_running_by_runc(sandbox_id)
    report = reap_config(session_config, Runtime().store, grace=timedelta(hours=1))
    assert [entry.split(":")[0] for entry in report.repaired] == [sandbox_id], report.as_json()
    state = engine_state(sandbox_id)
    assert state["Paused"] is False
    assert state["Running"] is True
    assert freezer(sandbox_id).state() == THAWED
    # The other way round as well.
    running_by_engine_frozen_by_runc(sandbox_id)
    report = reap_config(session_config, Runtime().store, grace=timedelta(hours=1))
    assert len(report.repaired) == 1, report.as_json()
    assert "thawed" in report.repaired[0], report.as_json()
    assert freezer(sandbox_id).state() == THAWED
    # A container that is simply paused (both agree) is left alone.
    docker.APIClient(timeout=10).pause(sandbox_id)
    report = reap_config(session_config, Runtime().store, grace=timedelta(hours=1))
    assert report.repaired == [], report.as_json()
    assert engine_state(sandbox_id)["Paused"] is True
    assert freezer(sandbox_id).state() == FROZEN
