"""Install time of a skill with 30 wheels and 3 Debian packages from local sources (real Docker).

Each sample is a whole skill-image build from the base template (`build_generation`: check,
copy, dependencies, verify, clean, ledger, snapshot, record) on a fresh config whose backend
names a wheel folder (30 hand-made wheels) and the local apt repository
`var/package-sources/debian` (scripts/apt_repo.py; .ci/docker-up prepares it). The baseline,
interleaved in the same run, is the same skill without dependencies, so the ratio is what
the packages cost on top of a build.

Usage: python bench/skill_install_sources.py [N]   (REDIS_URL and DATABASE_URL default to the
local Redis and PostgreSQL; a test database is created and dropped; everything created is
deleted). The last line is one JSON object: install_median_s, baseline_median_s, ratio,
check_median_s and dependencies_median_s (those steps of the install), wheels, debian, n.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings

from tests.support.skill_install import write_wheel

WHEELS = 30
DEBIAN = ("poppler-utils", "qpdf", "fonts-dejavu-core")  # all in the local apt repository
ROOT = Path(settings.BASE_DIR) / "var" / "package-sources"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    if not (ROOT / "debian" / "Packages").is_file():
        sys.exit(f"no local apt repository at {ROOT / 'debian'}: run .ci/docker-up (scripts/apt_repo.py)")
    settings.SKILL_PACKAGE_SOURCES_ROOT = ROOT
    with support.bench_database() as run_id:
        wheels = ROOT / f"bench-wheels-{run_id}"
        try:
            figures = run(n, run_id, wheels)
        finally:
            shutil.rmtree(wheels, ignore_errors=True)
    print(json.dumps(figures))


def write_skill(folder: Path, name: str, *, dependencies: bool) -> Path:
    root = folder / name
    (root / "scripts").mkdir(parents=True)
    modules = [f"benchdep{i:02d}" for i in range(WHEELS)] if dependencies else []
    extra = f'metadata:\n  debian-packages: "{" ".join(DEBIAN)}"\n' if dependencies else ""
    (root / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: Sums values from dependencies. Use when benchmarking.\n"
        f"license: MIT\n{extra}---\n\nRun `scripts/run.py`.\n"
    )
    if dependencies:
        (root / "requirements.txt").write_text("".join(f"{module}>=1.0\n" for module in modules))
    script = root / "scripts" / "run.py"
    imports = "".join(f"import {module}\n" for module in modules)
    total = " + ".join(f"{module}.VALUE" for module in modules) or "0"
    script.write_text(f"#!/usr/bin/env python3\n{imports}print('ready', {total})\n")
    script.chmod(0o755)
    return root


def run(n: int, run_id: str, wheels: Path) -> dict[str, Any]:
    from console.models import NetworkPolicy, Space
    from console.services import SYSTEM
    from sandboxes.backends.base import META_INSTALLATION, ListQuery
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig
    from skills.install.build import build_generation
    from skills.install.plan import plan_install
    from skills.services import import_folder

    for i in range(WHEELS):
        write_wheel(wheels, name=f"benchdep{i:02d}")
    sources = wheels.parent / f"bench-skills-{run_id}"
    try:
        with_deps = import_folder(write_skill(sources, "bench-pdf", dependencies=True), actor=SYSTEM).version
        plain = import_folder(write_skill(sources, "bench-plain", dependencies=False), actor=SYSTEM).version
    finally:
        shutil.rmtree(sources, ignore_errors=True)
    space = Space.objects.create(name=f"bench sources {run_id}", slug=f"bench-sources-{run_id}")
    NetworkPolicy.objects.create(space=space)
    local = PlatformBackend.objects.create(
        name=f"bench sources {run_id}", kind="docker", pip_find_links=wheels.name, apt_folder="debian"
    )
    local.spaces.add(space)
    counter = iter(range(1000))

    def install(version: Any) -> tuple[float, dict[str, float]]:
        config = SandboxConfig.objects.create(
            space=space,
            name=f"c{next(counter)}",
            backend=local,
            default_template=DEFAULT_BASE_IMAGE,
            memory_mb=512,
            pids_limit=256,
            persistent_workspace=False,
        )
        began = time.perf_counter()
        image = build_generation(
            space, config, plan_install(space, config, version, Quiet()), actor=SYSTEM, reporter=Quiet()
        )
        elapsed = time.perf_counter() - began
        snapshots = get_backend(config).snapshots()
        if snapshots is not None:
            snapshots.delete(image.snapshot_id)
        return elapsed, {k: float(v) for k, v in image.timings.items()}

    backend = get_backend(SandboxConfig(space=space, backend=local, name="probe", default_template=DEFAULT_BASE_IMAGE))
    try:
        install(with_deps)  # warm-up: engine caches, the console's pip packing
        install(plain)
        samples: list[float] = []
        baseline: list[float] = []
        checks: list[float] = []
        deps: list[float] = []
        for i in range(n):
            elapsed, timings = install(with_deps)
            samples.append(elapsed)
            checks.append(timings.get("check", 0.0))
            deps.append(timings.get("dependencies", 0.0))
            baseline.append(install(plain)[0])
            print(
                f"  round {i + 1}: {WHEELS} wheels + {len(DEBIAN)} Debian {samples[-1]:.2f} s "
                f"(check {checks[-1]:.2f} s, dependencies {deps[-1]:.2f} s), no dependencies {baseline[-1]:.2f} s"
            )
        median, base = statistics.median(samples), statistics.median(baseline)
        return {
            "install_median_s": round(median, 3),
            "baseline_median_s": round(base, 3),
            "ratio": round(median / base, 2),
            "check_median_s": round(statistics.median(checks), 3),
            "dependencies_median_s": round(statistics.median(deps), 3),
            "wheels": WHEELS,
            "debian": len(DEBIAN),
            "n": n,
        }
    finally:
        mine = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
        for info in list(backend.iter_sandboxes(mine)):
            backend.delete(info.sandbox_id)
        snapshots = backend.snapshots()
        if snapshots is not None:
            label = f"console.meta.{META_INSTALLATION}"
            for snapshot in snapshots.list():
                if snapshot.labels.get(label) == settings.CONSOLE_INSTALLATION_ID:
                    snapshots.delete(snapshot.snapshot_id)


class Quiet:
    """The build's reporter: prints only what the packages cost and failures."""

    def log(self, message: str) -> None:
        if message.startswith(("FAILED", "copied", "installed from")):
            print(f"  build: {message[:200]}")

    def progress(self, percent: int, message: str | None = None) -> None:
        pass


if __name__ == "__main__":
    main()
