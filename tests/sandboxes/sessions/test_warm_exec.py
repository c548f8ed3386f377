"""The warm exec: a session the runtime knows to be running has its command run with one
call to the engine (no connect, no inspect); when the engine says otherwise (the sandbox
removed or paused behind the console's back) the exec resolves the session and runs there."""

from __future__ import annotations

from typing import Any

import docker
import pytest

from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions.runtime import Runtime
from tests.personas import World
from tests.sandboxes.backends.docker.test_engine_loss import proxied_config, proxy  # noqa: F401 - fixtures
from tests.support.engine_proxy import EngineProxy

pytestmark = pytest.mark.django_db

TRUE = ExecRequest(argv=("echo", "ran"), timeout_s=30)


def fresh(session: Session) -> Session:
    return Session.objects.select_related("config__backend", "space").get(pk=session.pk)


def run(session: Session) -> Any:
    result = Runtime().exec(fresh(session), TRUE)
    assert (result.exit_code, result.stdout) == (0, b"ran\n"), result
    return result


def test_a_warm_exec_asks_the_engine_only_to_run_the_command(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    session = Runtime().resolve(world.space_a, "warm").session
    run(session)  # the first exec of the process may look the sandbox up once
    before = len(proxy.requests(""))
    for _ in range(3):
        run(session)
    asked = proxy.requests("")[before:]
    # Per exec: create, start, and the exit code; never the container's inspect or an unpause.
    assert not [r for r in asked if "/containers/" in r and not r.endswith("/exec")], asked
    assert len([r for r in asked if r.endswith("/exec")]) == 3, asked
    assert len(asked) == 9, asked


def test_a_sandbox_removed_behind_the_consoles_back_is_rebuilt_by_the_next_exec(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    session = Runtime().resolve(world.space_a, "removed").session
    run(session)
    old = fresh(session).sandbox_id
    docker.APIClient(timeout=30).remove_container(old, force=True)
    run(session)
    now = fresh(session)
    assert now.sandbox_id
    assert now.sandbox_id != old
    assert now.state == SessionState.RUNNING
    run(session)  # and the new one is trusted from here on


def test_a_sandbox_paused_behind_the_consoles_back_is_resumed_by_the_next_exec(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    session = Runtime().resolve(world.space_a, "paused").session
    sandbox_id = fresh(session).sandbox_id
    engine = docker.APIClient(timeout=30)
    for idle in (engine.pause, engine.stop):
        idle(sandbox_id)
        run(session)
        assert engine.inspect_container(sandbox_id)["State"]["Status"] == "running"
        assert fresh(session).sandbox_id == sandbox_id  # resumed, not rebuilt
