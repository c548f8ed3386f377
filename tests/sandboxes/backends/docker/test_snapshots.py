"""Docker snapshots ask the engine only what they need: a snapshot of a sandbox the adapter
knows is the connect's one look and the commit (labels and the image's depth are read once,
they never change), and a snapshot's delete is one look and the removal. What is no longer
asked is still right: the source's metadata blanked, the depth counted, a second name kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import docker
import pytest

from sandboxes.backends.base import BackendConfig, SnapshotInfo
from sandboxes.backends.docker import engine as engine_module
from sandboxes.backends.docker.backend import DockerBackend
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.backend_conformance import SandboxFactory, sandbox_factory

pytestmark = [pytest.mark.docker]


def _backend(run_id: str) -> DockerBackend:
    return DockerBackend(BackendConfig(kind="docker", options={"network": docker_test_network_name(run_id)}))


@pytest.fixture
def backend(test_run_id: str) -> Iterator[DockerBackend]:
    adapter = _backend(test_run_id)
    yield adapter
    adapter.close()


@pytest.fixture
def make(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxFactory]:
    with sandbox_factory(backend, docker_base_image, test_run_id) as factory:
        yield factory


@pytest.fixture
def engine() -> Iterator[docker.APIClient]:
    client = docker.APIClient(timeout=120)
    yield client
    client.close()


class EngineCalls:
    """The requests an adapter's own engine clients send, docker-py's and its direct wire's
    (each still goes to the engine)."""

    def __init__(self, backend: DockerBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        api = backend.api
        send: Callable[..., Any] = api.request

        def recorded(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            # The path without the API version: "GET /containers/<id>/json".
            self.calls.append(f"{method} /{url.split('/', 4)[-1]}")
            return send(method, url, *args, **kwargs)

        monkeypatch.setattr(api, "request", recorded)
        wire = backend.engine.wire
        if wire is not None:
            begin: Callable[..., Any] = wire._begin

            def sent(method: str, path: str, *args: Any) -> Any:
                self.calls.append(f"{method} {path}")
                return begin(method, path, *args)

            monkeypatch.setattr(wire, "_begin", sent)

    def during(self, action: Callable[[], Any]) -> list[str]:
        self.calls.clear()
        action()
        return list(self.calls)


def _layers(engine: docker.APIClient, image: str) -> int:
    return len(engine.inspect_image(image)["RootFS"]["Layers"])


def test_a_snapshot_of_a_known_sandbox_is_one_look_and_the_commit(
    backend: DockerBackend,
    make: SandboxFactory,
    engine: docker.APIClient,
    test_run_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sandbox = make(metadata={"console-purpose": "skill-build"})
    snapshots = backend.snapshots()
    first = snapshots.create(sandbox.sandbox_id, labels={"test-run": test_run_id})
    calls = EngineCalls(backend, monkeypatch)
    made: list[str] = [first.snapshot_id]
    try:
        asked = calls.during(lambda: made.append(snapshots.create(sandbox.sandbox_id, name="second").snapshot_id))
        assert asked == [f"GET /containers/{sandbox.sandbox_id}/json", "POST /commit"]
        labels = engine.inspect_image(backend.snapshot_image(made[1])["Id"])["Config"]["Labels"]
        assert labels["console.meta.console-purpose"] == ""  # blanked from the labels read at create
        assert labels["console.snapshot.name"] == "second"
        image = engine.inspect_container(sandbox.sandbox_id)["Image"]
        assert backend.engine.layer_count(sandbox.sandbox_id) == _layers(engine, image)
    finally:
        for snapshot_id in made:
            snapshots.delete(snapshot_id)


def test_a_snapshot_of_a_sandbox_another_adapter_made_reads_its_labels_and_depth(
    make: SandboxFactory, engine: docker.APIClient, test_run_id: str
) -> None:
    sandbox = make(metadata={"console-purpose": "skill-build"})
    other = _backend(test_run_id)  # has never seen the sandbox
    snapshots = other.snapshots()
    snapshot = snapshots.create(sandbox.sandbox_id, labels={"test-run": test_run_id})
    try:
        image = other.snapshot_image(snapshot.snapshot_id)
        assert image["Config"]["Labels"]["console.meta.console-purpose"] == ""
        source = engine.inspect_container(sandbox.sandbox_id)["Image"]
        assert other.engine.layer_count(sandbox.sandbox_id) == _layers(engine, source)
    finally:
        snapshots.delete(snapshot.snapshot_id)
        other.close()


def test_a_forgotten_sandbox_is_looked_at_again_before_its_snapshot(
    backend: DockerBackend, make: SandboxFactory, test_run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox = make(metadata={"console-purpose": "skill-build"})
    backend.engine.forget(sandbox.sandbox_id)
    calls = EngineCalls(backend, monkeypatch)
    snapshots = backend.snapshots()
    made: list[str] = []
    try:
        asked = calls.during(lambda: made.append(snapshots.create(sandbox.sandbox_id).snapshot_id))
        assert asked.count(f"GET /containers/{sandbox.sandbox_id}/json") == 1
        assert asked[-1] == "POST /commit"
        assert backend.snapshot_image(made[0])["Config"]["Labels"]["console.meta.console-purpose"] == ""
    finally:
        for snapshot_id in made:
            snapshots.delete(snapshot_id)


@pytest.fixture
def snapshot(backend: DockerBackend, make: SandboxFactory) -> SnapshotInfo:
    """A snapshot of a fresh sandbox, for a test that deletes it."""
    return backend.snapshots().create(make().sandbox_id)


def test_deleting_a_snapshot_is_one_look_and_the_removal(
    backend: DockerBackend, snapshot: SnapshotInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshots = backend.snapshots()
    image_id = backend.snapshot_image(snapshot.snapshot_id)["Id"]
    calls = EngineCalls(backend, monkeypatch)
    asked = calls.during(lambda: snapshots.delete(snapshot.snapshot_id))
    assert asked == [f"GET /images/{snapshot.snapshot_id.removeprefix('snap-')}/json", f"DELETE /images/{image_id}"]
    assert snapshot.snapshot_id not in {row.snapshot_id for row in snapshots.list()}


def test_a_snapshot_with_a_second_name_loses_both_at_delete(
    backend: DockerBackend, snapshot: SnapshotInfo, engine: docker.APIClient
) -> None:
    snapshots = backend.snapshots()
    engine.tag(backend.snapshot_image(snapshot.snapshot_id)["Id"], "console-test-second-name", "x")
    try:
        snapshots.delete(snapshot.snapshot_id)
        assert not engine.images(filters={"reference": "console-test-second-name:x"})
        assert snapshot.snapshot_id not in {row.snapshot_id for row in snapshots.list()}
    finally:
        if engine.images(filters={"reference": "console-test-second-name:x"}):
            engine.remove_image("console-test-second-name:x", force=True)


def test_the_layer_counts_kept_are_bounded(
    backend: DockerBackend,
    snapshot: SnapshotInfo,
    make: SandboxFactory,
    engine: docker.APIClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each snapshot is a new image and a long-lived adapter is never told one was deleted:
    # the counts it keeps are bounded, and one dropped is asked for again (still right).
    monkeypatch.setattr(engine_module, "LAYER_COUNTS_KEPT", 1, raising=False)
    first = str(snapshot.source_sandbox_id)
    second = make(template_id=snapshot.snapshot_id).sandbox_id
    try:
        image, other = (engine.inspect_container(sandbox_id)["Image"] for sandbox_id in (first, second))
        assert backend.engine.layer_count(first) == _layers(engine, image)
        assert backend.engine.layer_count(second) == _layers(engine, other)
        calls = EngineCalls(backend, monkeypatch)
        assert calls.during(lambda: backend.engine.layer_count(first)) == [f"GET /images/{image}/json"]
        assert backend.engine.layer_count(first) == _layers(engine, image)
    finally:
        backend.delete(second)
        backend.snapshots().delete(snapshot.snapshot_id)
