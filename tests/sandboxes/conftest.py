"""Fixtures for the sandbox-layer tests.

`test_run_id` labels everything a run creates. The Docker fixtures make sure the base
template image exists (built from Debian packages, never pulled) and sweep every container,
image, volume and network carrying this run's label when the session ends, so a failed test
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_service

# The conformance suite puts {"test-run": id} in sandbox metadata and snapshot labels; the
# Docker backend stores metadata as `console.meta.<key>` labels.
DOCKER_RUN_LABELS = ("console.meta.test-run", "test-run")


@pytest.fixture(scope="session")
def test_run_id() -> str:
    return f"pytest-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def docker_base_image(test_run_id: str) -> Iterator[str]:
    """The base template image (built once if missing; left in place for later runs)."""
    # Session fixtures run before the function-scoped service check in tests/conftest.py,
    # so ask it directly: skip locally, fail in CI.
    require_service("docker")
    import docker

    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE, build_base_image

    client = docker.from_env(timeout=120)
    build_base_image(client=client)
    try:
        yield DEFAULT_BASE_IMAGE
    finally:
        sweep_docker_leftovers(client, test_run_id)
        client.close()


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    """The real engine's low-level API (a docker.APIClient), for looking behind a backend's
    back. A module that needs another client defines its own `engine`."""
    import docker

    client = docker.APIClient(timeout=60)
    yield client
    client.close()


def sweep_docker_leftovers(client: object, run_id: str) -> None:
    """Remove this run's containers, then images (snapshots before their parents), volumes
    and networks, and the bounded disks (loop-mounted images) of those containers and volumes."""
    import docker
    from django.conf import settings

    from sandboxes.backends.docker.disk import LABEL_SCRATCH, VOLUME_PREFIX
    from sandboxes.backends.docker.loopfs import LoopFs

    assert isinstance(client, docker.DockerClient)
    api = client.api
    disks = Path(settings.WORKSPACE_DISK_DIR)
    for key in DOCKER_RUN_LABELS:
        selector = {"label": f"{key}={run_id}"}
        for row in api.containers(all=True, filters=selector):
            api.remove_container(row["Id"], force=True)
            if scratch := (row.get("Labels") or {}).get(LABEL_SCRATCH):
                with contextlib.suppress(Exception):
                    LoopFs(disks, scratch).destroy()
    for _ in range(3):  # children first: a parent image with a child refuses removal
        rows = [row for key in DOCKER_RUN_LABELS for row in api.images(filters={"label": f"{key}={run_id}"})]
        for row in sorted(rows, key=lambda row: row["Created"], reverse=True):
            try:
                api.remove_image(row["Id"], force=True)
            except docker.errors.APIError:
                continue
    for key in DOCKER_RUN_LABELS:
        for volume in api.volumes(filters={"label": f"{key}={run_id}"}).get("Volumes") or []:
            api.remove_volume(volume["Name"], force=True)
            with contextlib.suppress(Exception):
                LoopFs(disks, f"{VOLUME_PREFIX}{volume['Name']}").destroy()
    # The per-space networks are named "<the run's network>-<space>".
    prefix = docker_test_network_name(run_id)
    for network in api.networks(names=[prefix]):
        if network["Name"] == prefix or network["Name"].startswith(prefix + "-"):
            with contextlib.suppress(docker.errors.APIError):  # still in use by a leftover
                api.remove_network(network["Id"])


@pytest.fixture(scope="session")
def cube_host_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Cube nodes' shared workspace storage, for the fake Cube (whose nodes are this
    machine's Docker host). World-traversable, so a daemon that is not root here (rootless,
    userns-remap) can still bind-mount from it. Whatever a test left inside is removed."""
    root = tmp_path_factory.mktemp("cube-workspaces")
    temp = Path(tempfile.gettempdir())
    for path in (root, *root.parents):  # pytest makes its folders 0700
        if path == temp or not path.is_relative_to(temp):
            break
        path.chmod(0o755)
    yield root
    for leftover in root.iterdir():
        shutil.rmtree(leftover, ignore_errors=True)


def docker_test_network_name(run_id: str) -> str:
    """The managed bridge network the Docker tests use instead of the production one."""
    return f"sandbox-console-{run_id}"


@pytest.fixture
def session_config(world: Any, docker_base_image: str, settings: Any, test_run_id: str) -> Iterator[Any]:
    """Space A's default Docker config, under an installation id of its own.

    On teardown every sandbox that installation made is deleted, with the workspace volumes
    of the config's sessions, so a failing test leaves nothing running.
    """
    from sandboxes.backends.base import META_INSTALLATION, ListQuery
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import Session
    from tests.factories import make_config

    settings.CONSOLE_INSTALLATION_ID = f"test-{test_run_id}-{uuid.uuid4().hex[:6]}"
    config = make_config(world.space_a, name="sessions", default_template=docker_base_image, is_default=True)
    try:
        yield config
    finally:
        backend = get_backend(config)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            backend.delete(info.sandbox_id)
        volumes = backend.volumes()
        if volumes is not None:
            for session in Session.objects.filter(config=config):
                volumes.delete(session.workspace_volume)
