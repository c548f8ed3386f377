"""Docker snapshots stay shallow: past `snapshot_max_layers` a snapshot is flattened into one
layer that keeps the files and a commit's config, so generation after generation never
reaches the engine's "max depth exceeded" (a commit fails there: 125 layers), and that refusal,
met elsewhere, says what to do.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator

import docker
import pytest

from sandboxes.backends.base import BackendConfig, ErrorKind
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import DOCKER_MAX_LAYERS, _translate
from sandboxes.backends.docker.snapshots import DEFAULT_SNAPSHOT_MAX_LAYERS, DockerSnapshots
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.backend_conformance import SandboxFactory, run, sandbox_factory, shell_request

pytestmark = [pytest.mark.docker]


def _backend(run_id: str, **options: str) -> DockerBackend:
    return DockerBackend(BackendConfig(kind="docker", options={"network": docker_test_network_name(run_id), **options}))


@pytest.fixture
def engine() -> Iterator[docker.APIClient]:
    client = docker.APIClient(timeout=120)
    yield client
    client.close()


def _layers(engine: docker.APIClient, snapshot_id: str) -> int:
    image = engine.images(filters={"label": "console.kind=snapshot"})
    row = next(r for r in image if r["Id"].split(":", 1)[1].startswith(snapshot_id.removeprefix("snap-")))
    return len(engine.inspect_image(row["Id"])["RootFS"]["Layers"])


def _generations(
    backend: DockerBackend, make: SandboxFactory, base: str, count: int, engine: docker.APIClient
) -> Iterator[tuple[int, str, int]]:
    """`count` generations, each a sandbox from the previous snapshot that writes one file."""
    snapshots = backend.snapshots()
    made: list[str] = []
    template = base
    try:
        for number in range(1, count + 1):
            sandbox = make(template_id=template)
            run(backend, sandbox.sandbox_id, f"echo {number} > /opt/gen-{number}", user="root")
            snapshot = snapshots.create(sandbox.sandbox_id, name=f"g{number}", labels={"gen": str(number)})
            backend.delete(sandbox.sandbox_id)
            made.append(snapshot.snapshot_id)
            template = snapshot.snapshot_id
            yield number, snapshot.snapshot_id, _layers(engine, snapshot.snapshot_id)
    finally:
        for snapshot_id in reversed(made):
            snapshots.delete(snapshot_id)


def test_a_snapshot_past_the_bound_is_one_layer_with_the_files_and_config(
    docker_base_image: str, test_run_id: str, engine: docker.APIClient
) -> None:
    backend = _backend(test_run_id, snapshot_max_layers="3")
    with sandbox_factory(backend, docker_base_image, test_run_id) as make:
        depths = []
        previous = ""
        for number, snapshot_id, depth in _generations(backend, make, docker_base_image, 5, engine):
            depths.append(depth)
            if number == 3:
                flat = engine.inspect_image(backend.snapshot_image(snapshot_id)["Id"])
                committed = engine.inspect_image(backend.snapshot_image(previous)["Id"])
                for key in ("Env", "Entrypoint", "Cmd", "WorkingDir", "User"):
                    assert flat["Config"][key] == committed["Config"][key], key
                assert flat["Config"]["Labels"]["gen"] == "3"
                assert flat["Config"]["Labels"]["console.kind"] == "snapshot"
                assert DockerSnapshots(backend).get(snapshot_id).name == "g3"
                session = make(template_id=snapshot_id)
                listing = run(backend, session.sandbox_id, "cat /opt/gen-1 /opt/gen-2 /opt/gen-3; id -u; pwd")
                assert listing == "1\n2\n3\n1000\n/workspace\n"
                assert backend.exec(session.sandbox_id, shell_request("test -w /workspace")).exit_code == 0
                backend.delete(session.sandbox_id)
            previous = snapshot_id
        # The base has one layer: commit, commit, flatten, commit, commit.
        assert depths == [2, 3, 1, 2, 3]


def test_generations_past_the_engines_limit_all_succeed_at_the_default_bound(
    docker_base_image: str, test_run_id: str, engine: docker.APIClient
) -> None:
    backend = _backend(test_run_id)
    count = DOCKER_MAX_LAYERS + 5
    with sandbox_factory(backend, docker_base_image, test_run_id) as make:
        deepest = 0
        last = ""
        for number, snapshot_id, depth in _generations(backend, make, docker_base_image, count, engine):
            deepest = max(deepest, depth)
            last = snapshot_id
            if number == count:
                session = make(template_id=last)
                assert run(backend, session.sandbox_id, f"cat /opt/gen-1 /opt/gen-{count}") == f"1\n{count}\n"
                backend.delete(session.sandbox_id)
        assert deepest == DEFAULT_SNAPSHOT_MAX_LAYERS


def test_an_image_at_the_engines_limit_snapshots_flat_and_the_engines_refusal_says_what_to_do(
    docker_base_image: str, test_run_id: str, engine: docker.APIClient
) -> None:
    """A template made elsewhere with 125 layers: a commit fails with "max depth exceeded",
    which the adapter words as what to do; the adapter's snapshot is flattened instead."""
    repository = f"sandbox-console/test-deep-{test_run_id}"
    image = docker_base_image
    made: list[str] = []
    backend = _backend(test_run_id)
    try:
        for number in range(DOCKER_MAX_LAYERS - 1):  # the base has one
            container = engine.create_container(image, labels={"test-run": test_run_id})
            engine.put_archive(container["Id"], "/", _one_file(f"layer-{number}"))
            image = engine.commit(container["Id"], repository=repository, tag=str(number))["Id"]
            engine.remove_container(container["Id"])
            made.append(image)
        with sandbox_factory(backend, docker_base_image, test_run_id) as make:
            sandbox = make(template_id=f"{repository}:{DOCKER_MAX_LAYERS - 2}")
            with pytest.raises(docker.errors.APIError) as refused:
                engine.commit(sandbox.sandbox_id, repository=repository, tag="too-deep")
            worded = _translate(refused.value, "snapshot of sandbox x")
            assert worded.kind == ErrorKind.INVALID
            assert "max depth exceeded" in worded.message
            assert "rebuild the template with fewer layers, or flatten it" in worded.message
            snapshot = backend.snapshots().create(sandbox.sandbox_id, name="from-deep")
            made.append(backend.snapshot_image(snapshot.snapshot_id)["Id"])
            assert _layers(engine, snapshot.snapshot_id) == 1
            session = make(template_id=snapshot.snapshot_id)
            assert run(backend, session.sandbox_id, "ls /layer-0 /layer-122") == "/layer-0\n/layer-122\n"
            backend.delete(session.sandbox_id)
            backend.delete(sandbox.sandbox_id)
    finally:
        for image_id in reversed(made):
            engine.remove_image(image_id, force=True)


def _one_file(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return buffer.getvalue()


@pytest.fixture
def probe_template(docker_base_image: str, engine: docker.APIClient, test_run_id: str) -> Iterator[str]:
    """The base template with a HEALTHCHECK, as a custom template may have."""
    tag = f"sandbox-console/flatten-probe:{test_run_id}"
    dockerfile = (
        f"FROM {docker_base_image}\nHEALTHCHECK --interval=30s --timeout=5s --retries=2 CMD test -d /workspace\n"
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    context.seek(0)
    for _ in engine.build(fileobj=context, custom_context=True, tag=tag, network_mode="none", rm=True, decode=True):
        pass
    try:
        yield tag
    finally:
        engine.remove_image(tag, force=True)


def test_a_flattened_snapshot_keeps_the_healthcheck_and_odd_env_values(
    probe_template: str, test_run_id: str, engine: docker.APIClient
) -> None:
    """What a commit keeps, byte for byte: env values with a newline, `$`, quotes and
    backslashes (written as Dockerfile ENV lines for the import), and the template's HEALTHCHECK."""
    env = {"MULTI": "line1\nline2", "DOLLAR": "a$HOME b", "QUOTED": 'say "hi" \\n'}
    committed_backend = _backend(test_run_id)
    flat_backend = _backend(test_run_id, snapshot_max_layers="2")
    made: list[tuple[DockerBackend, str]] = []
    with sandbox_factory(committed_backend, probe_template, test_run_id) as make:
        try:
            configs = []
            for backend in (committed_backend, flat_backend):
                sandbox = make(adapter=backend, env=env)
                snapshot = backend.snapshots().create(sandbox.sandbox_id, name="probe")
                made.append((backend, snapshot.snapshot_id))
                configs.append(engine.inspect_image(backend.snapshot_image(snapshot.snapshot_id)["Id"]))
            committed, flat = configs
            assert len(flat["RootFS"]["Layers"]) == 1, "flattened"
            assert committed["Config"]["Healthcheck"]["Test"] == ["CMD-SHELL", "test -d /workspace"]
            assert "MULTI=line1\nline2" in committed["Config"]["Env"]
            for key in ("Env", "Entrypoint", "Cmd", "WorkingDir", "User", "Healthcheck"):
                assert flat["Config"].get(key) == committed["Config"].get(key), key
        finally:
            for backend, snapshot_id in made:
                backend.snapshots().delete(snapshot_id)
