"""Scripts that start in a session, before and after confirming inferred needs (real Docker).

Thirteen skills written like published ones (bench/skill_sets.py: prose-only needs, undeclared
imports, a couple of requirements.txt, shell and Node scripts) are written into a temporary
folder and imported. Each is installed twice, each time into a space of its own:

- before: with only what it declares in a form the installer reads (no confirmation);
- after: every inferred need of its dependency report confirmed through the service the
  skill page uses (`do_confirm_dependencies`), then installed.

Then a NEW session starts from that space's skill image and every entry script runs with
`--help` as the session user (uid 1000): started = exit 0. A failed install leaves the skill
out of the image, so its scripts count as not started, with the install's error as why.

Package sources are local: a wheel folder `var/package-sources/skill-bench-wheels`
(downloaded once on the host with `pip download --only-binary=:all:`, reused when present),
the local apt repository `var/package-sources/debian` (scripts/apt_repo.py, with
tesseract-ocr), and, when the backend has an npm tarball folder field, the folder
`var/package-sources/skill-bench-npm` (`npm pack` on the host, once; otherwise npm needs are
reported as not measurable).

Usage: python bench/skill_scripts.py [SKILL...]   (all skills by default; REDIS_URL and
DATABASE_URL default to the local Redis and PostgreSQL; a test database is created and
dropped; everything created is deleted). The last line is one JSON object: skills, scripts,
started_before, started_after, installed_before, installed_after, ratio (after / before,
before counted as at least 1), per_skill ({name: [before, after, total]}), npm_measurable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings
from skill_sets import SKILLS

from tests.support.skill_install import pypi_wheels

ROOT = Path(settings.BASE_DIR) / "var" / "package-sources"
WHEELS = "skill-bench-wheels"
NPM_FOLDER = "skill-bench-npm"
# What the skills import, by distribution; pip resolves their dependencies into the folder.
DISTRIBUTIONS = [
    "pypdf",
    "pdfplumber",
    "pillow",
    "defusedxml",
    "lxml",
    "openpyxl",
    "pandas",
    "python-pptx",
    "imageio",
    "numpy",
    "mcp",
    "playwright",
    "PyYAML",
    "Markdown",
    "pytesseract",
]
NPM_PACKAGES = ("docx", "pptxgenjs")
RUNNERS = {".py": "python3", ".js": "node", ".mjs": "node", ".cjs": "node", ".sh": "bash", ".bash": "bash"}


@dataclass
class Phase:
    installed: bool = False
    error: str = ""
    seconds: float = 0.0
    scripts: dict[str, str] = field(default_factory=dict)  # path -> "ok" or why it did not start

    @property
    def started(self) -> int:
        return sum(1 for why in self.scripts.values() if why == "ok")


def main() -> None:
    if not (ROOT / "debian" / "Packages").is_file():
        sys.exit(f"no local apt repository at {ROOT / 'debian'}: run .ci/docker-up (scripts/apt_repo.py)")
    wheel_folder(ROOT / WHEELS)
    settings.SKILL_PACKAGE_SOURCES_ROOT = ROOT
    with support.bench_database() as run_id:
        figures = run(run_id)
    print(json.dumps(figures))


def wheel_folder(folder: Path) -> None:
    """The wheels of DISTRIBUTIONS and their dependencies, from PyPI on the host, once."""
    failed = pypi_wheels(folder, DISTRIBUTIONS)
    if failed:
        sys.exit(failed)


def npm_tarballs(folder: Path) -> None:
    """The tarballs of NPM_PACKAGES and their dependencies, from the npm registry on the host
    (`npm install --package-lock-only`, then `npm pack` of each locked package), once."""
    stamp = folder / ".complete"
    if stamp.is_file() and stamp.read_text().split() == list(NPM_PACKAGES):
        return
    folder.mkdir(parents=True, exist_ok=True)
    print(f"packing npm tarballs into {folder} (once)")
    quiet = ["--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
    with tempfile.TemporaryDirectory(prefix="skill-bench-npm-") as work:
        subprocess.run(["npm", "install", "--package-lock-only", *quiet, *NPM_PACKAGES], cwd=work, check=True)
        lock = json.loads((Path(work) / "package-lock.json").read_text())
        for path, entry in (lock.get("packages") or {}).items():
            if not path:
                continue
            spec = f"{path.rsplit('node_modules/', 1)[-1]}@{entry['version']}"
            argv = ["npm", "pack", *quiet, "--pack-destination", str(folder), spec]
            subprocess.run(argv, cwd=work, check=True, stdout=subprocess.DEVNULL)
    stamp.write_text(" ".join(NPM_PACKAGES) + "\n")


def npm_folder_field() -> str | None:
    from sandboxes.models import PlatformBackend

    names = {f.name for f in PlatformBackend._meta.get_fields()}
    return next((name for name in ("npm_tarball_folder", "npm_folder") if name in names), None)


def write_skills(folder: Path, only: list[str]) -> list[Path]:
    roots = []
    for name, make in SKILLS.items():
        if only and name not in only:
            continue
        root = folder / name
        for path, (text, executable) in make().items():
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o755 if executable else 0o644)
        roots.append(root)
    return roots


class Quiet:
    def log(self, message: str) -> None:
        pass

    def progress(self, percent: int, message: str | None = None) -> None:
        pass


def run(run_id: str) -> dict[str, Any]:
    from console.models import NetworkPolicy, Space
    from console.services import SYSTEM
    from sandboxes.backends.base import META_INSTALLATION, ExecRequest, ListQuery
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig, Session
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.sessions.store import RedisSessionStore
    from skills.install.build import build_generation
    from skills.install.plan import payload_for, plan_install
    from skills.install.steps import StepFailed, entry_scripts
    from skills.services import do_confirm_dependencies, import_folder

    npm_field = npm_folder_field()
    if npm_field is not None:
        npm_tarballs(ROOT / NPM_FOLDER)
    npm_ready = npm_field is not None and any((ROOT / NPM_FOLDER).glob("*.tgz"))
    extra = {npm_field: NPM_FOLDER} if npm_field and npm_ready else {}
    local = PlatformBackend.objects.create(
        name=f"bench scripts {run_id}", kind="docker", pip_find_links=WHEELS, apt_folder="debian", **extra
    )
    source = Path(tempfile.mkdtemp(prefix="skill-scripts-"))
    try:
        versions = [import_folder(root, actor=SYSTEM).version for root in write_skills(source, sys.argv[1:])]
    finally:
        shutil.rmtree(source, ignore_errors=True)
    runtime = Runtime(RedisSessionStore(os.environ["REDIS_URL"]))
    configs: list[SandboxConfig] = []
    results: dict[str, dict[str, Any]] = {}

    def measure(version: Any, phase_name: str) -> Phase:
        name = version.skill.name
        slug = f"b-{phase_name}-{name}-{run_id}"[:50]
        space = Space.objects.create(name=slug, slug=slug)
        NetworkPolicy.objects.create(space=space)
        local.spaces.add(space)
        config = SandboxConfig.objects.create(
            space=space,
            name="skills",
            backend=local,
            default_template=DEFAULT_BASE_IMAGE,
            is_default=True,
            memory_mb=1024,
            pids_limit=256,
            persistent_workspace=False,
        )
        configs.append(config)
        phase = Phase()
        began = time.perf_counter()
        try:
            build_generation(
                space, config, plan_install(space, config, version, Quiet()), actor=SYSTEM, reporter=Quiet()
            )
            phase.installed = True
        except StepFailed as exc:
            phase.error = f"step {exc.step} failed: {exc.message}"
        phase.seconds = round(time.perf_counter() - began, 1)
        session = runtime.resolve(space, f"{phase_name}-{name}").session
        root = f"/opt/skills/{name}"
        for script in entry_scripts(payload_for(version)):
            runner = RUNNERS.get(Path(script).suffix, "bash")
            shell = f"cd {root} 2>/dev/null || exit 66; {runner} {script} --help"
            result = runtime.exec(session, ExecRequest(shell=shell, user="user", timeout_s=120))
            if result.exit_code == 0:
                phase.scripts[script] = "ok"
            elif result.exit_code == 66:
                phase.scripts[script] = f"not in the image (install {phase.error[:300]})"
            else:
                lines = [line for line in (result.stderr + result.stdout).decode(errors="replace").splitlines() if line]
                phase.scripts[script] = f"exit {result.exit_code}: {(lines or ['(no output)'])[-1][:200]}"
        runtime.delete(session, actor=SYSTEM)
        return phase

    try:
        for version in versions:
            name = version.skill.name
            report = version.dependency_report or {}
            inferred = [str(need["key"]) for need in report.get("inferred") or []]
            declared = [str(need["key"]) for need in report.get("declared") or []]
            before = measure(version, "before")
            if inferred:
                do_confirm_dependencies(version, inferred, actor=SYSTEM)
                version.refresh_from_db()
            after = measure(version, "after")
            results[name] = {"declared": declared, "inferred": inferred, "before": before, "after": after}
            print(
                f"{name}: before {before.started}/{len(before.scripts)} ({before.seconds} s), "
                f"after {after.started}/{len(after.scripts)} ({after.seconds} s)"
            )
    finally:
        backend = get_backend(configs[0]) if configs else None
        if backend is not None:
            for info in list(
                backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}))
            ):
                backend.delete(info.sandbox_id)
            volumes = backend.volumes()
            if volumes is not None:
                for session in Session.objects.all():
                    with contextlib.suppress(Exception):  # best effort; a non-persistent session has none
                        volumes.delete(session.workspace_volume)
            snapshots = backend.snapshots()
            if snapshots is not None:
                for snapshot in snapshots.list():
                    if snapshot.labels.get(META_INSTALLATION) == settings.CONSOLE_INSTALLATION_ID:
                        snapshots.delete(snapshot.snapshot_id)
    print_table(results, npm_ready)
    total = sum(len(r["after"].scripts) for r in results.values())
    started_before = sum(r["before"].started for r in results.values())
    started_after = sum(r["after"].started for r in results.values())
    return {
        "skills": len(results),
        "scripts": total,
        "started_before": started_before,
        "started_after": started_after,
        "installed_before": sum(1 for r in results.values() if r["before"].installed),
        "installed_after": sum(1 for r in results.values() if r["after"].installed),
        "ratio": round(started_after / max(1, started_before), 2),
        "per_skill": {
            name: [r["before"].started, r["after"].started, len(r["after"].scripts)] for name, r in results.items()
        },
        "npm_measurable": npm_ready,
    }


def print_table(results: dict[str, dict[str, Any]], npm_ready: bool) -> None:
    print()
    print(f"{'skill':20} {'before':>7} {'after':>7}  declared / inferred")
    for name, r in results.items():
        total = len(r["after"].scripts)
        print(
            f"{name:20} {r['before'].started:>3}/{total:<3} {r['after'].started:>3}/{total:<3}  "
            f"{', '.join(r['declared']) or '-'} / {', '.join(r['inferred']) or '-'}"
        )
    print()
    for name, r in results.items():
        for label in ("before", "after"):
            phase: Phase = r[label]
            if not phase.installed:
                print(f"{name} {label}: install failed: {phase.error[:400]}")
            for script, why in phase.scripts.items():
                if why != "ok" and (phase.installed or not why.startswith("not in the image")):
                    print(f"{name} {label}: {script}: {why}")
    if not npm_ready:
        npm_skills = [name for name, r in results.items() if any(k.startswith("npm:") for k in r["inferred"])]
        print(f"npm: no npm tarball folder on this backend; not measurable yet: {', '.join(npm_skills)}")
    print()


if __name__ == "__main__":
    main()
