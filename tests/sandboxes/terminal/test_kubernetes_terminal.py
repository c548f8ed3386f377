"""The web terminal into a Kubernetes sandbox: the console's terminal, through the real ASGI
stack, on a session whose sandbox is a pod of the fake cluster (tests/fakes/kube/), its shell
reached through the fake's pods/exec stream. Helpers: tests/support/terminal_support.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from asgiref.sync import sync_to_async

from sandboxes.backends.base import META_INSTALLATION, ListQuery
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.store import MemorySessionStore
from tests.factories import make_config
from tests.fakes.kube import FakeCluster
from tests.personas import World
from tests.support import terminal_support
from tests.support.kube_backend import make_kube_backend
from tests.support.terminal_support import open_terminal, shells_in, wait_closed, wait_no_shell

store = terminal_support.store
fast_terminals = terminal_support.fast_terminals


@pytest.fixture
def kube_config(
    world: World, fake_cluster: FakeCluster, sandbox_template: dict[str, Any], settings: Any
) -> Iterator[SandboxConfig]:
    """Space A's default config on the fake cluster, under an installation id of its own; its
    sandboxes are deleted afterwards."""
    settings.CONSOLE_INSTALLATION_ID = f"test-kube-term-{uuid.uuid4().hex[:8]}"
    backend = make_kube_backend(fake_cluster, world.space_a)
    config = make_config(
        world.space_a,
        backend=backend,
        name="kube",
        default_template=sandbox_template["metadata"]["name"],
        is_default=True,
    )
    try:
        yield config
    finally:
        adapter = get_backend(config)
        for info in adapter.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            adapter.delete(info.sandbox_id)


@pytest.fixture
def kube_session(world: World, kube_config: SandboxConfig, store: MemorySessionStore) -> Session:
    return get_or_create_session(world.space_a, f"kube-term-{uuid.uuid4().hex[:8]}")


def file_in_pod(fake_cluster: FakeCluster, session: Session, path: str) -> bytes:
    """`path` read in the pod's own container, beside the console (docker-py, not our exec)."""
    session.refresh_from_db()
    backend = get_backend(session.config)
    pod = backend.pod_of(session.sandbox_id)  # type: ignore[attr-defined]
    container = docker.from_env().containers.get(fake_cluster.pod_container(pod.namespace, pod.pod))
    code, output = container.exec_run(["cat", path])
    assert code == 0, output
    return bytes(output)


@pytest.mark.docker
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fast_terminals")
async def test_the_terminal_runs_in_the_pod_resizes_and_ends_its_shell(
    world: World, fake_cluster: FakeCluster, kube_session: Session
) -> None:
    from sandboxes.terminal import process as terminal_process

    try:
        comm, screen, terminal_id = await open_terminal(world.bob, kube_session)
        await screen.run("echo hi-$((6*7)); id -u > /tmp/term-mark\n")
        await screen.until_output(b"hi-42")
        assert await sync_to_async(file_in_pod)(fake_cluster, kube_session, "/tmp/term-mark") == b"1000\n"
        await comm.send_to(text_data=json.dumps({"type": "resize", "cols": 123, "rows": 45}))
        await screen.run("sleep 0.3; stty size\n")
        await screen.until_output(b"45 123")
        assert await sync_to_async(shells_in)(kube_session)
        await comm.disconnect(code=1000)
        await wait_no_shell(kube_session)
        terminal = await wait_closed(terminal_id)
        assert terminal.close_reason == "closed by the client"
        assert terminal.bytes_out > 0
    finally:
        await terminal_process.close_all("test finished")
