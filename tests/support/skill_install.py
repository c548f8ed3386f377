"""Builders for the install tests: a hand-made wheel, skills with dependencies, the Docker
config and its clean-up; and their fixtures (registered in tests/skills/conftest.py):
`installation` (one id per test module), `wheels` (tinydep in an `offline` source), `runtime`,
`examples_source` and `apt_folder` (the examples' wheel folder, the local apt repository; also
imported by the browser tests)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import stat
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from console.models import AdminJob, Space
from console.services import SYSTEM, Actor
from sandboxes.backends.base import META_INSTALLATION, META_PURPOSE, ListQuery
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import PlatformBackend, SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.install.start import do_start_install, do_start_uninstall
from skills.models import SkillVersion
from tests.conftest import IN_CI, REDIS_URL
from tests.factories import make_config
from tests.support.jobs import run_to_end
from tests.support.skills import EXECUTABLE, REGULAR, build_zip, import_bytes

WHEEL_PACKAGE = "tinydep"


def write_wheel(folder: Path, name: str = WHEEL_PACKAGE, version: str = "1.0", value: int = 42) -> Path:
    """A minimal pure-Python wheel written by hand (no network, no build backend)."""
    return write_wheel_tree(folder, name, version, {f"{name}/__init__.py": f"VALUE = {value}\n".encode()})


def write_wheel_tree(folder: Path, name: str, version: str, files: dict[str, bytes], *, top_level: bool = True) -> Path:
    """A wheel of `files` (paths inside the wheel), written by hand. `top_level=False` leaves
    out top_level.txt, as numpy's wheels do."""
    dist_info = f"{name}-{version}.dist-info"
    entries = dict(files)
    entries[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    entries[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if top_level:
        tops = sorted({path.split("/")[0].removesuffix(".py") for path in files})
        entries[f"{dist_info}/top_level.txt"] = ("\n".join(tops) + "\n").encode()
    record_lines = []
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{dist_info}/RECORD,,")
    entries[f"{dist_info}/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in entries.items():
            archive.writestr(path, data)
    return target


def pypi_wheels(folder: Path, distributions: list[str]) -> str:
    """Wheels of `distributions` and their dependencies, downloaded from PyPI on the host
    (`pip download --only-binary=:all:`) into `folder` once (a stamp names them). Returns ""
    or why the download failed."""
    stamp = folder / ".complete"
    if stamp.is_file() and stamp.read_text().split() == distributions:
        return ""
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--dest", str(folder)]
    result = subprocess.run([*argv, *distributions], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return f"cannot download {' '.join(distributions)} into {folder}: {result.stderr[-500:]}"
    stamp.write_text(" ".join(distributions) + "\n")
    return ""


def skill_zip(
    name: str, files: dict[str, bytes], *, executable: tuple[str, ...] = (), body: str = "Hi.", extra_md: str = ""
) -> bytes:
    """A skill zip: SKILL.md (`extra_md` added to its frontmatter) plus `files` (paths inside
    the skill); `executable` ones get 0755."""
    md = f"---\nname: {name}\ndescription: Made by a test. Use when testing installs.\nlicense: MIT\n{extra_md}"
    md += f"---\n\n{body}\n"
    entries: list[tuple[str, bytes, int]] = [(f"{name}/SKILL.md", md.encode(), REGULAR)]
    for path, data in files.items():
        entries.append((f"{name}/{path}", data, EXECUTABLE if path in executable else REGULAR))
    return build_zip(entries)


def skill_with_dependency(
    name: str = "tiny-skill", *, check: str | None = None, requirement: str = "tinydep>=1.0", extra_md: str = ""
) -> bytes:
    """A skill zip: requirements.txt, an executable script using the dependency, a check."""
    md = f"---\nname: {name}\ndescription: Prints a value from a dependency. Use when testing installs.\n"
    md += f"license: MIT\n{extra_md}---\n\nRun `scripts/run.py`.\n"
    entries: list[tuple[str, bytes, int]] = [
        (f"{name}/SKILL.md", md.encode(), stat.S_IFREG | 0o644),
        (f"{name}/requirements.txt", f"{requirement}\n".encode(), REGULAR),
        (
            f"{name}/scripts/run.py",
            b"#!/usr/bin/env python3\nimport tinydep\nprint('tinydep says', tinydep.VALUE)\n",
            EXECUTABLE,
        ),
    ]
    if check is not None:
        entries.append((f"{name}/scripts/check.sh", check.encode(), EXECUTABLE))
    return build_zip(entries)


def plain_skill(name: str, *, extra_md: str = "") -> bytes:
    md = f"---\nname: {name}\ndescription: Just instructions. Use when testing installs.\nlicense: MIT\n"
    md += f"{extra_md}---\n\nHi.\n"
    return build_zip(
        [
            (f"{name}/SKILL.md", md.encode(), REGULAR),
            (f"{name}/scripts/hello.sh", b"#!/bin/bash\necho hello from " + name.encode() + b"\n", EXECUTABLE),
        ]
    )


def import_skill(data: bytes) -> SkillVersion:
    return import_bytes(data, "skill.zip").version


def run_install(space: Space, config: SandboxConfig, version: SkillVersion, actor: Actor = SYSTEM) -> AdminJob:
    """Start the install job and run it to its end (tests/support/jobs.py)."""
    job = do_start_install(space, config, version, actor=actor)
    return run_to_end(str(job.id))


def run_uninstall(space: Space, config: SandboxConfig, name: str, actor: Actor = SYSTEM) -> AdminJob:
    job = do_start_uninstall(space, config, name, actor=actor)
    return run_to_end(str(job.id))


def build_sandboxes(config: SandboxConfig, installation: str) -> list[str]:
    query = ListQuery(metadata={META_INSTALLATION: installation, META_PURPOSE: "skill-build"})
    return [info.sandbox_id for info in get_backend(config).iter_sandboxes(query)]


def clean_up(config: SandboxConfig, installation: str) -> None:
    """Delete this run's sandboxes, session volumes and snapshots (children before parents)."""
    backend = get_backend(config)
    for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: installation})):
        backend.delete(info.sandbox_id)
    volumes = backend.volumes()
    if volumes is not None:
        for session in Session.objects.filter(config=config):
            volumes.delete(session.workspace_volume)
    snapshots = backend.snapshots()
    assert snapshots is not None
    # Skill-image snapshots carry the console's metadata as their own labels (the source
    # sandbox's console.meta.* labels are blanked in a snapshot: docker/snapshots.py).
    ours = [s for s in snapshots.list() if s.labels.get(META_INSTALLATION) == installation]
    for _ in range(len(ours) + 1):
        remaining = []
        for snapshot in sorted(ours, key=lambda s: s.created_at or 0, reverse=True):
            try:
                snapshots.delete(snapshot.snapshot_id)
            except Exception:
                remaining.append(snapshot)
        ours = remaining
        if not ours:
            break


def make_skills_config(space: Space, template: str, **extra: Any) -> SandboxConfig:
    """The install tests' Docker config: the space's default, no persistent workspace."""
    made: SandboxConfig = make_config(
        space,
        **{
            "name": "skills",
            "default_template": template,
            "is_default": True,
            "persistent_workspace": False,
            **extra,
        },
    )
    return made


@contextlib.contextmanager
def skills_config(space: Space, template: str, installation: str, **extra: Any) -> Iterator[SandboxConfig]:
    """`make_skills_config`, with this run's sandboxes and snapshots cleaned up afterwards."""
    made = make_skills_config(space, template, **extra)
    try:
        yield made
    finally:
        clean_up(made, installation)


def job_error(job: AdminJob) -> str:
    return f"{job.status}: {job.error}\n" + "\n".join(str(line.get("message")) for line in job.log)


def log_lines(job: AdminJob) -> list[str]:
    return [str(line.get("message")) for line in job.log]


def set_sources(config: SandboxConfig, **fields: str) -> None:
    """Set package sources, which are the config's platform backend's."""
    PlatformBackend.objects.filter(pk=config.backend_id).update(**fields)
    config.refresh_from_db()


def settings_sources(settings: Any, root: Path) -> None:
    settings.SKILL_PACKAGE_SOURCES_ROOT = root


def prepared_source(settings: Any, name: str, sample: str, how: str) -> Path:
    """A package source folder the setup scripts prepare under var/package-sources, holding
    a file matching `sample`, made the package sources' root. Missing: skipped locally,
    failed in CI."""
    folder = Path(django_settings.BASE_DIR) / "var" / "package-sources" / name
    if not any(folder.glob(sample)):
        message = f"the package source {folder} is missing: run {how}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    settings_sources(settings, folder.parent)
    return folder


@pytest.fixture
def installation(settings: Any, test_run_id: str, request: pytest.FixtureRequest) -> str:
    """This run's installation id for the test's module (`test-<run>-<module>`): everything the
    test creates carries it, and `clean_up` deletes by it."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    settings.CONSOLE_INSTALLATION_ID = f"test-{test_run_id}-{module}"
    return str(settings.CONSOLE_INSTALLATION_ID)


@pytest.fixture
def wheels(settings: Any, tmp_path: Path) -> Path:
    """The package source folder `offline` holding tinydep 1.0, under the sources' root."""
    root = tmp_path / "package-sources"
    write_wheel(root / "offline")
    settings_sources(settings, root)
    return root / "offline"


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(RedisSessionStore(REDIS_URL))


@pytest.fixture
def examples_source(settings: Any) -> Path:
    """The examples' wheel folder that scripts/setup.sh downloads."""
    return prepared_source(settings, "examples", "tabulate-*.whl", "scripts/setup.sh")


@pytest.fixture
def apt_folder(settings: Any) -> Path:
    """The local apt repository `debian` (poppler-utils, qpdf, nodejs, npm, tesseract-ocr and what the base
    image lacks of their dependencies, with its Packages index) that scripts/apt_repo.py
    prepares."""
    folder = prepared_source(settings, "debian", "qpdf_*.deb", ".ci/docker-up (scripts/apt_repo.py)")
    assert (folder / "Packages").is_file(), f"{folder} has no Packages index: run scripts/apt_repo.py"
    return folder
