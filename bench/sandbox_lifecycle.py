"""Sandbox lifecycle through the Docker adapter versus docker-py directly, in one run.

Each operation (create, exec `true`, pause, connect, snapshot, create-from-snapshot,
delete) is timed N times both ways; the table shows medians and the adapter's overhead
ratio. The last line is one JSON object for machines:
{"overhead_ratio": {...}, "median_ms": {...}, "n": N}.

Usage: python bench/sandbox_lifecycle.py [N]    (no Django; needs the Docker engine)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import docker

from sandboxes.backends.base import BackendConfig, ExecRequest, NetworkSpec, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE, build_base_image

OPERATIONS = ("create", "exec", "pause", "connect", "snapshot", "create_from_snapshot", "delete")
BENCH_LABEL = "console.bench-run"


def timed(samples: dict[str, list[float]], name: str, operation: Callable[[], object]) -> object:
    started = time.perf_counter()
    result = operation()
    samples[name].append((time.perf_counter() - started) * 1000)
    return result


def adapter_round(backend: DockerBackend, run_id: str, samples: dict[str, list[float]]) -> None:
    spec = SandboxSpec(
        template_id=DEFAULT_BASE_IMAGE,
        network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
        metadata={"bench-run": run_id},
    )
    info = timed(samples, "create", lambda: backend.create(spec))
    sandbox_id = info.sandbox_id  # type: ignore[attr-defined]
    timed(samples, "exec", lambda: backend.exec(sandbox_id, ExecRequest(argv=("true",))))
    timed(samples, "pause", lambda: backend.pause(sandbox_id))
    timed(samples, "connect", lambda: backend.connect(sandbox_id))
    snapshots = backend.snapshots()
    snapshot = timed(samples, "snapshot", lambda: snapshots.create(sandbox_id, labels={"bench-run": run_id}))
    snapshot_id = snapshot.snapshot_id  # type: ignore[attr-defined]
    child_spec = SandboxSpec(template_id=snapshot_id, network=spec.network, metadata=spec.metadata)
    child = timed(samples, "create_from_snapshot", lambda: backend.create(child_spec))
    backend.delete(child.sandbox_id)  # type: ignore[attr-defined]
    timed(samples, "delete", lambda: backend.delete(sandbox_id))
    snapshots.delete(snapshot_id)


def direct_round(client: docker.DockerClient, run_id: str, samples: dict[str, list[float]]) -> None:
    """The same operations with docker-py alone: the floor the adapter is measured against."""
    api = client.api
    labels = {BENCH_LABEL: run_id}

    def create(image: str) -> str:
        host_config = api.create_host_config(network_mode="none", dns=["127.0.0.1"])
        container_id = str(api.create_container(image, labels=labels, host_config=host_config)["Id"])
        api.start(container_id)
        api.inspect_container(container_id)
        return container_id

    def exec_true(container_id: str) -> None:
        exec_id = api.exec_create(container_id, ["true"], user="1000:1000")["Id"]
        api.exec_start(exec_id)
        api.exec_inspect(exec_id)

    container_id = str(timed(samples, "create", lambda: create(DEFAULT_BASE_IMAGE)))
    timed(samples, "exec", lambda: exec_true(container_id))
    timed(samples, "pause", lambda: api.pause(container_id))
    timed(samples, "connect", lambda: api.unpause(container_id))
    image = timed(samples, "snapshot", lambda: api.commit(container_id, changes=[f'LABEL {BENCH_LABEL}="{run_id}"']))
    image_id = str(image["Id"])  # type: ignore[index]
    child_id = str(timed(samples, "create_from_snapshot", lambda: create(image_id)))
    api.remove_container(child_id, force=True)
    timed(samples, "delete", lambda: api.remove_container(container_id, force=True))
    api.remove_image(image_id)


def clean_up(client: docker.DockerClient, run_id: str) -> None:
    """Whatever a failed round left behind: containers first, then images."""
    api = client.api
    for key in (BENCH_LABEL, "console.meta.bench-run", "bench-run"):
        for row in api.containers(all=True, filters={"label": f"{key}={run_id}"}):
            api.remove_container(row["Id"], force=True)
    for key in (BENCH_LABEL, "console.meta.bench-run", "bench-run"):
        for row in api.images(filters={"label": f"{key}={run_id}"}):
            try:
                api.remove_image(row["Id"], force=True)
            except docker.errors.APIError:
                continue


def main(argv: list[str]) -> int:
    runs = int(argv[1]) if len(argv) > 1 else 5
    run_id = uuid.uuid4().hex[:12]
    client = docker.from_env(timeout=120)
    backend = DockerBackend(BackendConfig(kind="docker"))
    build_base_image(client=client)
    adapter: dict[str, list[float]] = {name: [] for name in OPERATIONS}
    direct: dict[str, list[float]] = {name: [] for name in OPERATIONS}
    try:
        # Both sides warmed once (a console's adapter is long-lived: its client and what it
        # read of an image are kept), then interleaved, each side first in every other round,
        # so drift on the machine and the order within a round hit both sides alike.
        direct_round(client, run_id, {name: [] for name in OPERATIONS})
        adapter_round(backend, run_id, {name: [] for name in OPERATIONS})
        sides = (lambda: adapter_round(backend, run_id, adapter), lambda: direct_round(client, run_id, direct))
        for number in range(runs):
            for side in sides if number % 2 == 0 else reversed(sides):
                side()
    finally:
        clean_up(client, run_id)
        backend.close()
        client.close()
    adapter_ms = {name: round(statistics.median(adapter[name]), 2) for name in OPERATIONS}
    direct_ms = {name: round(statistics.median(direct[name]), 2) for name in OPERATIONS}
    ratios = {name: round(adapter_ms[name] / direct_ms[name], 2) if direct_ms[name] else None for name in OPERATIONS}
    print(f"{'operation':<22}{'adapter ms':>12}{'docker-py ms':>14}{'ratio':>8}")
    for name in OPERATIONS:
        print(f"{name:<22}{adapter_ms[name]:>12.1f}{direct_ms[name]:>14.1f}{ratios[name]:>8.2f}")
    summary = {"overhead_ratio": ratios, "median_ms": adapter_ms, "direct_median_ms": direct_ms, "n": runs}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
