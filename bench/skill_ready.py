"""Skill readiness benchmark on the real Docker engine: skill image against install-per-session.

Measures, in one run and interleaved (this machine is noisy, so the baseline sits beside the
figure), the time until a NEW session can run a skill that has a pip dependency:
- image: the session resolves from the space's skill image (the skill, its dependency and
  the ledger are already in the snapshot), then runs the skill's script once;
- base: the session resolves from the base template, then the same pipeline steps a build
  runs are applied to it (copy to /opt/skills, pip install from the offline wheel folder,
  verify), then it runs the skill's script once.

Usage: python bench/skill_ready.py [N]   (REDIS_URL and DATABASE_URL default to the local
Redis and PostgreSQL; a test database is created and dropped; everything created is deleted)
The last line is one JSON object with speedup (base median / image median, target >= 5),
image_median_s, base_median_s and n.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings

SKILL = "bench-skill"
SCRIPT = f"/opt/skills/{SKILL}/scripts/run.py"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    sources = Path(tempfile.mkdtemp(prefix="skill-bench-sources-"))
    settings.SKILL_PACKAGE_SOURCES_ROOT = sources
    try:
        with support.bench_database() as run_id:
            figures = run(n, run_id, sources)
    finally:
        shutil.rmtree(sources, ignore_errors=True)
    print(json.dumps(figures))


def write_wheel(folder: Path, name: str = "benchdep", version: str = "1.0") -> None:
    """A minimal pure-Python wheel, written by hand (no network, no build backend)."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist_info}/top_level.txt": f"{name}\n".encode(),
    }
    record = [
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for path, data in files.items()
    ]
    files[f"{dist_info}/RECORD"] = ("\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)


def write_skill(folder: Path, name: str = SKILL, dependency: str = "benchdep") -> Path:
    """A skill whose script prints `ready 42` from its one pip dependency."""
    root = folder / name
    (root / "scripts").mkdir(parents=True)
    (root / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: Prints a value from a dependency. Use when benchmarking.\n"
        "license: MIT\n---\n\nRun `scripts/run.py`.\n"
    )
    (root / "requirements.txt").write_text(f"{dependency}>=1.0\n")
    script = root / "scripts" / "run.py"
    script.write_text(f"#!/usr/bin/env python3\nimport {dependency}\nprint('ready', {dependency}.VALUE)\n")
    script.chmod(0o755)
    return root


class Printer:
    def log(self, message: str) -> None:
        print(f"  build: {message}")

    def progress(self, percent: int, message: str | None = None) -> None:
        if message:
            self.log(message)


def run(n: int, run_id: str, sources: Path) -> dict[str, Any]:
    from console.services import SYSTEM
    from sandboxes.backends.base import ExecRequest
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import Session
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.sessions.store import RedisSessionStore
    from skills.install import packages as install_packages
    from skills.install import steps as install
    from skills.install.build import build_generation
    from skills.install.plan import package_sources, payload_for, plan_install
    from skills.services import import_folder

    write_wheel(sources / "wheels")
    version = import_folder(write_skill(sources / "skill-src"), actor=SYSTEM).version
    spaces, configs = bench_spaces(run_id, ("image", "base"))
    image_space, base_space = spaces
    image_config, base_config = configs
    runtime = Runtime(RedisSessionStore(os.environ["REDIS_URL"]))
    backend = get_backend(image_config)
    try:
        started = time.perf_counter()
        image = build_generation(
            image_space,
            image_config,
            plan_install(image_space, image_config, version, Printer()),
            actor=SYSTEM,
            reporter=Printer(),
        )
        print(f"skill image generation {image.generation} built in {time.perf_counter() - started:.2f} s")
        payload = payload_for(version)
        sources_for_base = package_sources(base_config)

        def ready(session: Session) -> None:
            result = runtime.exec(session, ExecRequest(shell=SCRIPT, timeout_s=60))
            if result.exit_code != 0 or b"ready 42" not in result.stdout:
                raise RuntimeError(f"not ready: {result.exit_code} {result.stderr[-300:]!r}")

        def from_image(i: object) -> float:
            began = time.perf_counter()
            session = runtime.resolve(image_space, f"image-{i}").session
            ready(session)
            return time.perf_counter() - began

        def from_base(i: object) -> float:
            began = time.perf_counter()
            resolved = runtime.resolve(base_space, f"base-{i}")
            sandbox_id = resolved.sandbox.sandbox_id
            install.copy_skill(backend, sandbox_id, payload, lambda _: None)
            install_packages.install_dependencies(backend, sandbox_id, [payload], sources_for_base, lambda _: None)
            install.verify_skill(backend, sandbox_id, payload, lambda _: None)
            ready(resolved.session)
            return time.perf_counter() - began

        # One warm-up each (engine caches, the console's pip packing), then interleaved samples.
        def forget(i: object) -> None:
            keys = [f"image-{i}", f"base-{i}"]
            for session in Session.objects.filter(key__in=keys).select_related("space", "config"):
                runtime.delete(session, actor=SYSTEM)

        from_image("warm")
        from_base("warm")
        forget("warm")
        image_samples: list[float] = []
        base_samples: list[float] = []
        for i in range(n):
            image_samples.append(from_image(i))
            base_samples.append(from_base(i))
            print(f"  round {i + 1}: image {image_samples[-1]:.3f} s   base + install {base_samples[-1]:.3f} s")
            forget(i)
        image_median = statistics.median(image_samples)
        base_median = statistics.median(base_samples)
        speedup = round(base_median / image_median, 2)
        print(f"new session ready: from the skill image {image_median:.3f} s, base + install {base_median:.3f} s")
        return {
            "speedup": speedup,
            "image_median_s": round(image_median, 3),
            "base_median_s": round(base_median, 3),
            "build_s": round(sum(float(v) for v in image.timings.values()), 3),
            "n": n,
        }
    finally:
        clean_up(backend, runtime)


def bench_spaces(run_id: str, labels: tuple[str, ...]) -> tuple[list[Any], list[Any]]:
    """A space per label, each with its own Docker backend (wheel folder `wheels`) and config."""
    from console.models import NetworkPolicy, Space
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.models import PlatformBackend, SandboxConfig

    spaces, configs = [], []
    for label in labels:
        space = Space.objects.create(name=f"bench {label} {run_id}", slug=f"bench-{label}-{run_id}")
        NetworkPolicy.objects.create(space=space)
        spaces.append(space)
        local = PlatformBackend.objects.create(name=f"bench {label} {run_id}", kind="docker", pip_find_links="wheels")
        local.spaces.add(space)
        configs.append(
            SandboxConfig.objects.create(
                space=space,
                name=label,
                backend=local,
                default_template=DEFAULT_BASE_IMAGE,
                is_default=True,
                memory_mb=512,
                pids_limit=256,
                persistent_workspace=False,
            )
        )
    return spaces, configs


def clean_up(backend: Any, runtime: Any) -> None:
    """Delete this run's sandboxes, session bindings and snapshots."""
    from sandboxes.backends.base import META_INSTALLATION, ListQuery
    from sandboxes.models import Session

    mine = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
    for info in list(backend.iter_sandboxes(mine)):
        backend.delete(info.sandbox_id)
    for session in Session.objects.all():
        keys = runtime.keys(session)
        runtime.store.end_turn(keys[2])
        binding = runtime.store.get_binding(keys[0])
        if binding is not None:
            runtime.store.delete_binding_if(keys[0], binding)
    snapshots = backend.snapshots()
    if snapshots is not None:
        marks = (META_INSTALLATION, f"console.meta.{META_INSTALLATION}")
        ours = [s for s in snapshots.list() if settings.CONSOLE_INSTALLATION_ID in (s.labels.get(m) for m in marks)]
        for snapshot in sorted(ours, key=lambda s: s.created_at or 0, reverse=True):  # children first
            snapshots.delete(snapshot.snapshot_id)


if __name__ == "__main__":
    main()
