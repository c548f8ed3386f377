"""Skill image generations on the real Docker engine: many installs in a row in one space.

Each install builds a generation on the previous one's snapshot. Before snapshots were
flattened (sandboxes/backends/docker/snapshots.py), the engine refused the 125th with "max
depth exceeded". This runs N installs (default 500) of a small skill, alternating two
versions so each is a real change, and records per generation the build time and the
snapshot's layer count. The baseline beside the figure: the first 50 installs' median.

Usage: python bench/skill_generations.py [N]   (REDIS_URL and DATABASE_URL default to the
local Redis and PostgreSQL; a test database is created and dropped; everything created is
deleted). The last line is one JSON object: ok, failed, n, max_layers, first_median_s,
last_median_s, ratio (last 50 / first 50; flat is about 1), flattened (generations whose
snapshot was one layer) and total_s.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings

SKILL = "generations-skill"
WINDOW = 50


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    sources = Path(tempfile.mkdtemp(prefix="skill-generations-"))
    settings.SKILL_PACKAGE_SOURCES_ROOT = sources
    try:
        with support.bench_database() as run_id:
            figures = run(n, run_id, sources)
    finally:
        shutil.rmtree(sources, ignore_errors=True)
    print(json.dumps(figures))


def write_skill(folder: Path, revision: int) -> Path:
    root = folder / f"r{revision}" / SKILL
    (root / "scripts").mkdir(parents=True)
    (root / "SKILL.md").write_text(
        f"---\nname: {SKILL}\ndescription: Says its revision. Use when benchmarking.\nlicense: MIT\n---\n\nHi.\n"
    )
    script = root / "scripts" / "run.sh"
    script.write_text(f"#!/bin/bash\necho revision {revision}\n")
    script.chmod(0o755)
    return root


class Quiet:
    def log(self, message: str) -> None:
        pass

    def progress(self, percent: int, message: str | None = None) -> None:
        pass


def run(n: int, run_id: str, sources: Path) -> dict[str, Any]:
    from console.models import NetworkPolicy, Space
    from console.services import SYSTEM
    from sandboxes.backends.base import META_INSTALLATION, ListQuery
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig
    from skills.install.build import build_generation
    from skills.install.plan import plan_install
    from skills.install.steps import StepFailed
    from skills.services import import_folder

    versions = [import_folder(write_skill(sources, r), actor=SYSTEM).version for r in (1, 2)]
    space = Space.objects.create(name=f"bench generations {run_id}", slug=f"bench-gen-{run_id}")
    NetworkPolicy.objects.create(space=space)
    local = PlatformBackend.objects.create(name=f"bench generations {run_id}", kind="docker")
    local.spaces.add(space)
    config = SandboxConfig.objects.create(
        space=space,
        name="generations",
        backend=local,
        default_template=DEFAULT_BASE_IMAGE,
        is_default=True,
        persistent_workspace=False,
    )
    backend = get_backend(config)
    api = backend.api  # type: ignore[attr-defined]
    times: list[float] = []
    layers: list[int] = []
    failures: list[str] = []
    began = time.perf_counter()
    try:
        for number in range(1, n + 1):
            version = versions[number % 2]
            started = time.perf_counter()
            try:
                image = build_generation(
                    space, config, plan_install(space, config, version, Quiet()), actor=SYSTEM, reporter=Quiet()
                )
            except StepFailed as exc:
                failures.append(f"{number}: {exc}")
                print(f"  install {number}: FAILED {exc}")
                continue
            times.append(time.perf_counter() - started)
            attrs = backend.snapshot_image(image.snapshot_id)  # type: ignore[attr-defined]
            layers.append(len(api.inspect_image(attrs["Id"])["RootFS"]["Layers"]))
            if number % 25 == 0 or number <= 3:
                print(f"  install {number}: {times[-1]:.2f} s, {layers[-1]} layer(s)", flush=True)
    finally:
        total = time.perf_counter() - began
        for info in list(backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: run_id}))):
            backend.delete(info.sandbox_id)
        snapshots = backend.snapshots()
        if snapshots is not None:
            ours = [
                s
                for s in snapshots.list()
                if settings.CONSOLE_INSTALLATION_ID
                in (s.labels.get(META_INSTALLATION), s.labels.get(f"console.meta.{META_INSTALLATION}"))
            ]
            for snapshot in sorted(ours, key=lambda s: s.created_at or 0, reverse=True):
                snapshots.delete(snapshot.snapshot_id)
    first = statistics.median(times[:WINDOW]) if times else 0.0
    last = statistics.median(times[-WINDOW:]) if times else 0.0
    return {
        "ok": len(times),
        "failed": len(failures),
        "n": n,
        "max_layers": max(layers, default=0),
        "flattened": sum(1 for count in layers if count == 1),
        "first_median_s": round(first, 3),
        "last_median_s": round(last, 3),
        "ratio": round(last / first, 2) if first else None,
        "total_s": round(total, 1),
        "first_failures": failures[:3],
    }


if __name__ == "__main__":
    main()
