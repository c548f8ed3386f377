"""A session's persistent /workspace on E2B (a team volume) and Cube (a host directory),
through the runtime, against the fake servers (real containers, network none).

A rebuild onto a new sandbox keeps the workspace's files and their owners, the session user
can write /workspace/output but not /workspace/input, and deleting the session deletes the
workspace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.services import SYSTEM
from sandboxes.backends.base import META_INSTALLATION, ExecRequest, ListQuery
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import MemorySessionStore
from sandboxes.sessions.workspace import stage_input
from tests.factories import make_config
from tests.fakes.fixtures import FakeHandle
from tests.personas import World

pytestmark = [pytest.mark.django_db, pytest.mark.docker, pytest.mark.e2b]


@pytest.fixture(params=["e2b", pytest.param("cube", marks=pytest.mark.cube)])
def fake(request: pytest.FixtureRequest) -> FakeHandle:
    handle: FakeHandle = request.getfixturevalue(f"fake_{request.param}")
    return handle


@pytest.fixture
def config(
    world: World, fake: FakeHandle, cube_host_root: Path, settings: Any, test_run_id: str
) -> Iterator[SandboxConfig]:
    """Space A's default config on the fake, under an installation id of its own; whatever
    the test leaves (sandboxes, workspaces) is deleted afterwards."""
    settings.CONSOLE_INSTALLATION_ID = f"test-ws-{test_run_id}-{uuid.uuid4().hex[:6]}"
    cfg: SandboxConfig = make_config(
        world.space_a,
        **fake.platform_fields(sandbox_url=fake.sandbox_url),
        default_template="base",
        is_default=True,
        workspace_host_root=str(cube_host_root) if fake.personality == "cube" else "",
    )
    try:
        yield cfg
    finally:
        backend = get_backend(cfg)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            backend.delete(info.sandbox_id)
        volumes = backend.volumes()
        assert volumes is not None
        for session in Session.objects.filter(config=cfg):
            volumes.delete(session.workspace_volume)


def sh(config: SandboxConfig, sandbox_id: str, line: str, user: str = "user") -> tuple[int, str]:
    result = get_backend(config).exec(sandbox_id, ExecRequest(shell=line, user=user, timeout_s=30))
    return result.exit_code, (result.stdout + result.stderr).decode()


def workspace_exists(fake: FakeHandle, cube_host_root: Path, name: str) -> bool:
    if fake.personality == "cube":
        return (cube_host_root / name).exists()
    return name in {volume["name"] for volume in fake.state()["volumes"]}


def test_a_rebuild_keeps_the_workspace_files_and_owners(world: World, config: SandboxConfig) -> None:
    runtime = Runtime(MemorySessionStore())
    first = runtime.resolve(world.space_a, "ws-rebuild")
    assert sh(config, first.sandbox.sandbox_id, "echo mine > /workspace/output/result.txt")[0] == 0
    assert sh(config, first.sandbox.sandbox_id, "mkdir /workspace/notes && echo n > /workspace/notes/n.txt")[0] == 0
    stage_input(runtime, first.session, "brief.txt", b"read me\n", actor=SYSTEM)

    get_backend(config).delete(first.sandbox.sandbox_id)  # gone: TTL kill, node loss, stale image
    second = runtime.resolve(world.space_a, "ws-rebuild")

    sandbox_id = second.sandbox.sandbox_id
    assert sandbox_id != first.sandbox.sandbox_id
    assert sh(config, sandbox_id, "cat /workspace/output/result.txt /workspace/notes/n.txt") == (0, "mine\nn\n")
    assert sh(config, sandbox_id, "cat /workspace/input/brief.txt") == (0, "read me\n")
    owners = "stat -c '%n %u' /workspace /workspace/output /workspace/output/result.txt /workspace/input/brief.txt"
    assert sh(config, sandbox_id, owners)[1].splitlines() == [
        "/workspace 1000",
        "/workspace/output 1000",
        "/workspace/output/result.txt 1000",
        "/workspace/input/brief.txt 0",
    ]
    assert sh(config, sandbox_id, "touch /workspace/output/again")[0] == 0
    assert sh(config, sandbox_id, "touch /workspace/input/nope")[0] != 0
    assert sh(config, sandbox_id, "echo changed > /workspace/input/brief.txt")[0] != 0


def test_deleting_the_session_deletes_its_workspace(
    world: World, fake: FakeHandle, cube_host_root: Path, config: SandboxConfig
) -> None:
    runtime = Runtime(MemorySessionStore())
    resolved = runtime.resolve(world.space_a, "ws-delete")
    name = resolved.session.workspace_volume
    assert sh(config, resolved.sandbox.sandbox_id, "echo doomed > /workspace/output/x.txt")[0] == 0
    assert workspace_exists(fake, cube_host_root, name)

    runtime.delete(resolved.session, actor=SYSTEM)

    assert not workspace_exists(fake, cube_host_root, name)
    assert not Session.objects.filter(pk=resolved.session.pk).exists()


def test_a_session_without_a_persistent_workspace_deletes_no_workspace(
    world: World, fake: FakeHandle, cube_host_root: Path, config: SandboxConfig
) -> None:
    # On Cube a workspace delete costs a housekeeping sandbox: a session that never had a
    # persistent workspace must not pay it (nor, on E2B, a volume lookup that finds nothing).
    SandboxConfig.objects.filter(pk=config.pk).update(persistent_workspace=False)
    runtime = Runtime(MemorySessionStore())
    resolved = runtime.resolve(world.space_a, "ws-none")
    assert not resolved.session.has_persistent_workspace
    killed_before = set(fake.state()["killed"])

    runtime.delete(resolved.session, actor=SYSTEM)

    assert set(fake.state()["killed"]) - killed_before == {resolved.sandbox.sandbox_id}
    assert not workspace_exists(fake, cube_host_root, resolved.session.workspace_volume)


def test_a_persistent_session_is_marked_so_its_delete_removes_the_workspace(
    world: World, config: SandboxConfig
) -> None:
    runtime = Runtime(MemorySessionStore())
    resolved = runtime.resolve(world.space_a, "ws-marked")
    assert Session.objects.get(pk=resolved.session.pk).has_persistent_workspace


def test_the_connection_test_says_when_workspaces_cannot_be_made(fake: FakeHandle, config: SandboxConfig) -> None:
    from sandboxes.catalog.services import run_connection_test

    steps = run_connection_test(config, lambda step: None)
    assert [s.name for s in steps][:2] == ["health", "persistent workspace"]
    assert all(s.ok for s in steps), steps
    if fake.personality != "e2b":
        return
    # An E2B team without volumes (infra volume_create.go: 403 "use of volumes is not enabled").
    fake.set_fault("status", status=403, path=r"/volumes$", message="use of volumes is not enabled")
    try:
        steps = run_connection_test(config, lambda step: None)
    finally:
        fake.clear_faults()
    assert [s.name for s in steps] == ["health", "persistent workspace"]
    assert not steps[1].ok
    assert steps[1].detail.startswith("unsupported: this E2B team has no volumes")
    assert "turn the persistent /workspace off" in steps[1].detail
