"""Session ready from a 10-skill image against a bare create, on the real Docker engine.

Ten small skills, each with a script and a pure-Python wheel dependency from a local wheel
folder, are installed one after another into one space's skill image through the real
install path (plan_install + build_generation, one generation each). A second space with
the same config has no skill image. Interleaved, N times each (default 7), it measures the
time until a NEW session:
- image: resolved through the runtime from the 10-skill image, runs one skill's script;
- bare: resolved through the runtime from the bare template, runs `true`.

Usage: python bench/skill_image_ready.py [N]   (REDIS_URL and DATABASE_URL default to the
local Redis and PostgreSQL; a test database is created and dropped; everything created is
deleted). The last line is one JSON object: ratio (image median / bare median, goal <= 1.2),
image_median_s, bare_median_s, n, skills, layers (the image's layer count), image_mb and
load (the 1-minute load average at the start and at the end).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings
from skill_ready import Printer, bench_spaces, clean_up, write_skill, write_wheel

SKILLS = 10


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    sources = Path(tempfile.mkdtemp(prefix="skill-image-ready-"))
    settings.SKILL_PACKAGE_SOURCES_ROOT = sources
    try:
        with support.bench_database() as run_id:
            figures = run(n, run_id, sources)
    finally:
        shutil.rmtree(sources, ignore_errors=True)
    print(json.dumps(figures))


def run(n: int, run_id: str, sources: Path) -> dict[str, Any]:
    from console.models import Space
    from console.services import SYSTEM
    from sandboxes.backends.base import ExecRequest
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import Session
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.sessions.store import RedisSessionStore
    from skills.install.build import build_generation
    from skills.install.plan import plan_install
    from skills.services import import_folder

    load_start = os.getloadavg()[0]
    versions = []
    for i in range(SKILLS):
        write_wheel(sources / "wheels", name=f"tendep{i}")
        root = write_skill(sources / "skill-src", name=f"ten-skill-{i}", dependency=f"tendep{i}")
        versions.append(import_folder(root, actor=SYSTEM).version)
    spaces, configs = bench_spaces(run_id, ("image", "bare"))
    image_space, bare_space = spaces
    image_config, _ = configs
    runtime = Runtime(RedisSessionStore(os.environ["REDIS_URL"]))
    backend = get_backend(image_config)
    try:
        started = time.perf_counter()
        for version in versions:
            image = build_generation(
                image_space,
                image_config,
                plan_install(image_space, image_config, version, Printer()),
                actor=SYSTEM,
                reporter=Printer(),
            )
        print(f"{SKILLS} skills installed (generation {image.generation}) in {time.perf_counter() - started:.1f} s")
        api = backend.api  # type: ignore[attr-defined]
        attrs = api.inspect_image(backend.snapshot_image(image.snapshot_id)["Id"])  # type: ignore[attr-defined]
        layers = len(attrs["RootFS"]["Layers"])
        image_mb = round(attrs["Size"] / 2**20, 1)
        base_attrs = api.inspect_image(DEFAULT_BASE_IMAGE)
        print(f"skill image: {layers} layer(s), {image_mb} MB; base: {base_attrs['Size'] / 2**20:.1f} MB")
        script = f"/opt/skills/ten-skill-{SKILLS - 1}/scripts/run.py"

        def timed(space: Space, key: str, shell: str, expect: bytes) -> float:
            began = time.perf_counter()
            session = runtime.resolve(space, key).session
            result = runtime.exec(session, ExecRequest(shell=shell, timeout_s=60))
            elapsed = time.perf_counter() - began
            if result.exit_code != 0 or expect not in result.stdout:
                raise RuntimeError(f"{key} not ready: {result.exit_code} {result.stderr[-300:]!r}")
            return elapsed

        def forget(i: object) -> None:
            for session in Session.objects.filter(key__in=[f"image-{i}", f"bare-{i}"]).select_related(
                "space", "config"
            ):
                runtime.delete(session, actor=SYSTEM)

        # One warm-up each (engine caches), then interleaved samples.
        timed(image_space, "image-warm", script, b"ready 42")
        timed(bare_space, "bare-warm", "true", b"")
        forget("warm")
        image_samples: list[float] = []
        bare_samples: list[float] = []
        for i in range(n):
            image_samples.append(timed(image_space, f"image-{i}", script, b"ready 42"))
            bare_samples.append(timed(bare_space, f"bare-{i}", "true", b""))
            print(f"  round {i + 1}: image {image_samples[-1]:.3f} s   bare {bare_samples[-1]:.3f} s", flush=True)
            forget(i)
        image_median = statistics.median(image_samples)
        bare_median = statistics.median(bare_samples)
        return {
            "ratio": round(image_median / bare_median, 2),
            "image_median_s": round(image_median, 3),
            "bare_median_s": round(bare_median, 3),
            "n": n,
            "skills": SKILLS,
            "layers": layers,
            "image_mb": image_mb,
            "load": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        }
    finally:
        clean_up(backend, runtime)


if __name__ == "__main__":
    main()
