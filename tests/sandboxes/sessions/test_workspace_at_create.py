"""A new Docker sandbox starts with /workspace laid out: the create writes the layout through
the engine's archive API before the container starts, so no process runs inside it for that
(counted from the engine's own event stream), for sessions, persistent workspaces and pooled
sandboxes alike; what a persistent workspace already holds keeps its modes and times, and a
link planted where a folder belongs is still moved aside by the in-sandbox layout."""

from __future__ import annotations

import time
from typing import Any

import docker
import pytest

from sandboxes.backends.base import ExecRequest
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import MemberState, PoolMember, SandboxConfig
from sandboxes.pools.keeper import refill
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import MemorySessionStore
from tests.personas import World

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

LAYOUT = ["/workspace 1000:1000 755", "/workspace/input 0:0 755", "/workspace/output 1000:1000 755"]
STAT = "stat -c '%n %u:%g %a' /workspace /workspace/input /workspace/output"


def execs_in(container_id: str, since: float) -> list[str]:
    """The exec actions the engine reported for the container since `since` (its event log)."""
    client = docker.from_env()
    try:
        events = client.events(
            since=int(since) - 1, until=int(time.time()) + 1, filters={"container": container_id}, decode=True
        )
        return [str(e.get("Action", "")) for e in events if str(e.get("Action", "")).startswith("exec_")]
    finally:
        client.close()


def sh(config: SandboxConfig, sandbox_id: str, line: str, user: str = "user") -> tuple[int, str]:
    result = get_backend(config).exec(sandbox_id, ExecRequest(shell=line, user=user, timeout_s=30))
    return result.exit_code, (result.stdout + result.stderr).decode()


def check_layout(config: SandboxConfig, sandbox_id: str) -> None:
    assert sh(config, sandbox_id, STAT)[1].splitlines() == LAYOUT
    assert sh(config, sandbox_id, "touch /workspace/output/mine")[0] == 0
    assert sh(config, sandbox_id, "touch /workspace/input/nope")[0] != 0


@pytest.mark.parametrize("persistent", [False, True], ids=["scratch", "persistent"])
def test_a_new_session_starts_laid_out_with_no_exec(
    world: World, session_config: SandboxConfig, persistent: bool
) -> None:
    SandboxConfig.objects.filter(pk=session_config.pk).update(persistent_workspace=persistent)
    started = time.time()
    resolved = Runtime(MemorySessionStore()).resolve(world.space_a, f"laid-out-{persistent}")
    sandbox_id = resolved.sandbox.sandbox_id
    assert execs_in(sandbox_id, started) == []
    check_layout(session_config, sandbox_id)


def rebuilt(world: World, config: SandboxConfig, key: str, change: str, *, user: str = "user") -> tuple[str, float]:
    """A persistent session's second sandbox, after `change` ran in its first one; and when
    the second create began."""
    SandboxConfig.objects.filter(pk=config.pk).update(persistent_workspace=True)
    runtime = Runtime(MemorySessionStore())
    first = runtime.resolve(world.space_a, key).sandbox.sandbox_id
    assert sh(config, first, change, user=user)[0] == 0
    get_backend(config).delete(first)
    started = time.time()
    second = runtime.resolve(world.space_a, key).sandbox.sandbox_id
    assert second != first
    return second, started


def test_a_persistent_workspace_keeps_its_modes_and_times_through_a_rebuild(
    world: World, session_config: SandboxConfig
) -> None:
    change = "chmod 700 /workspace/output && touch -d @1700000000 /workspace/output"
    second, started = rebuilt(world, session_config, "kept-modes", change)
    assert execs_in(second, started) == []
    assert sh(session_config, second, "stat -c '%u %a %Y' /workspace/output") == (0, "1000 700 1700000000\n")
    assert sh(session_config, second, STAT)[1].splitlines()[:2] == LAYOUT[:2]


def test_a_link_planted_where_a_folder_belongs_is_moved_aside_in_the_sandbox(
    world: World, session_config: SandboxConfig
) -> None:
    planted = "rm -rf /workspace/input; ln -s /etc /workspace/input"
    second, started = rebuilt(world, session_config, "planted", planted, user="root")
    assert execs_in(second, started), "the in-sandbox layout ran"
    assert sh(session_config, second, STAT)[1].splitlines() == LAYOUT
    assert sh(session_config, second, "ls -d /workspace/input.replaced-*")[0] == 0
    assert sh(session_config, second, "stat -c '%u' /etc")[1] == "0\n"


def test_a_pooled_sandbox_is_made_laid_out_with_no_exec(
    world: World, session_config: SandboxConfig, tuned: Any
) -> None:
    tuned({"pools.refill_on_change": False})
    SandboxConfig.objects.filter(pk=session_config.pk).update(pool_size=1)
    session_config.pool_size = 1
    started = time.time()
    assert len(refill(session_config).made) == 1
    member = PoolMember.objects.get(config=session_config, state=MemberState.READY)
    assert execs_in(member.sandbox_id, started) == []
    check_layout(session_config, member.sandbox_id)
