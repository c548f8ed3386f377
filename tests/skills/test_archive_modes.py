"""Modes at import: every file readable by the session user, exec bits kept and widened, each
change named in a warning; script warnings (no `#!`, CRLF `#!`) shown on the skill's page."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from console.models import JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.services import version_files
from tests.conftest import REDIS_URL
from tests.factories import make_config
from tests.support.skill_install import clean_up, job_error, run_install
from tests.support.skills import EXECUTABLE, REGULAR, build_zip, import_bytes, skill_md

from .conftest import World

pytestmark = pytest.mark.django_db


def writestr_zip(files: dict[str, bytes]) -> bytes:
    """A zip as Python's `zipfile.writestr(name, data)` makes it: every entry 0600."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_writestr_zip_entries_are_0600() -> None:
    """The shape the tests below rely on (CPython's ZipFile.writestr default)."""
    data = writestr_zip({"s/SKILL.md": b"x"})
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.infolist()[0].external_attr >> 16 == 0o600


def test_0600_zip_is_made_readable_with_a_warning_naming_the_files(world: World) -> None:
    data = writestr_zip(
        {"my-skill/SKILL.md": skill_md(), "my-skill/reference.md": b"# ref\n", "my-skill/notes/a.txt": b"a"}
    )
    version = import_bytes(data).version
    modes = {f.path: f.mode for f in version_files(version)}
    assert modes == {"SKILL.md": 0o644, "notes/a.txt": 0o644, "reference.md": 0o644}
    warning = next(w["message"] for w in version.warnings if "Modes of" in w["message"])
    assert "Modes of 3 file(s) changed" in warning
    assert "SKILL.md 0600→0644" in warning
    assert "notes/a.txt 0600→0644" in warning
    assert version.warning_count >= 1
    page = world.client_for("bob").get(version.get_absolute_url()).content.decode()
    assert "SKILL.md 0600→0644" in page


def test_exec_bits_are_kept_and_made_usable_by_the_session_user() -> None:
    data = build_zip(
        [
            ("my-skill/SKILL.md", skill_md(), REGULAR),
            ("my-skill/scripts/owner_only.py", b"#!/usr/bin/env python3\n", 0o100700),
            ("my-skill/scripts/group.sh", b"#!/bin/sh\n", 0o100750),
            ("my-skill/scripts/fine.sh", b"#!/bin/sh\n", EXECUTABLE),
            ("my-skill/readonly.txt", b"r", 0o100444),
        ]
    )
    version = import_bytes(data).version
    modes = {f.path: f.mode for f in version_files(version)}
    assert modes["scripts/owner_only.py"] == 0o755
    assert modes["scripts/group.sh"] == 0o755
    assert modes["scripts/fine.sh"] == 0o755
    assert modes["readonly.txt"] == 0o444, "already readable: left as it is (never made writable)"
    warning = next(w["message"] for w in version.warnings if "Modes of" in w["message"])
    assert "Modes of 2 file(s)" in warning
    assert "scripts/owner_only.py 0700→0755" in warning
    assert "fine.sh" not in warning


def test_readable_skill_gets_no_mode_warning() -> None:
    data = build_zip([("my-skill/SKILL.md", skill_md(), REGULAR), ("my-skill/run.sh", b"#!/bin/sh\n", EXECUTABLE)])
    version = import_bytes(data).version
    assert not [w for w in version.warnings if "Modes of" in w["message"]]


def test_script_warnings_are_shown_on_the_skill_page(world: World) -> None:
    data = build_zip(
        [
            ("my-skill/SKILL.md", skill_md(), REGULAR),
            ("my-skill/scripts/no_shebang.py", b"import sys\nprint(sys.argv)\n", EXECUTABLE),
            ("my-skill/scripts/crlf.sh", b"#!/bin/bash\r\necho hi\r\n", EXECUTABLE),
            ("my-skill/scripts/not_exec.py", b"#!/usr/bin/env python3\nprint(1)\n", REGULAR),
        ]
    )
    version = import_bytes(data).version
    messages = [w["message"] for w in version.warnings]
    assert (
        "scripts/no_shebang.py is executable but has no #! line: run it with python3, not as ./scripts/no_shebang.py."
        in messages
    )
    assert any(m.startswith("scripts/crlf.sh: its #! line ends with a carriage return") for m in messages)
    assert "scripts/not_exec.py has a #! line but is not executable: run it with python3." in messages
    page = world.client_for("carol").get(version.skill.get_absolute_url()).content.decode()
    assert "scripts/no_shebang.py is executable but has no #! line" in page
    assert "ends with a carriage return" in page


@pytest.fixture
def docker_config(world: World, docker_base_image: str, settings: Any, test_run_id: str) -> Iterator[SandboxConfig]:
    settings.CONSOLE_INSTALLATION_ID = f"test-{test_run_id}-modes"
    made: SandboxConfig = make_config(
        world.space_a, name="modes", default_template=docker_base_image, is_default=True, persistent_workspace=False
    )
    try:
        yield made
    finally:
        clean_up(made, str(settings.CONSOLE_INSTALLATION_ID))


@pytest.mark.docker
@pytest.mark.redis
def test_session_user_reads_and_runs_a_skill_imported_from_a_0600_zip(
    world: World, docker_config: SandboxConfig
) -> None:
    """The seen failure: a writestr zip installed and verified, then SKILL.md was unreadable."""
    name = "writestr-skill"
    md = f"---\nname: {name}\ndescription: Made with zipfile.writestr. Use when testing modes.\nlicense: MIT\n---\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{name}/SKILL.md", md + "\nRun `scripts/run.py`.\n")
        script = zipfile.ZipInfo(f"{name}/scripts/run.py")
        script.external_attr = 0o100700 << 16  # owner-only executable
        archive.writestr(script, "#!/usr/bin/env python3\nprint('ran')\n")
    version = import_bytes(buffer.getvalue(), f"{name}.zip").version
    job = run_install(world.space_a, docker_config, version)
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    runtime = Runtime(RedisSessionStore(REDIS_URL))
    session = runtime.resolve(world.space_a, "modes").session
    result = runtime.exec(session, ExecRequest(shell=f"cat /opt/skills/{name}/SKILL.md", user="user", timeout_s=60))
    assert result.exit_code == 0, result.stderr.decode()
    assert b"Made with zipfile.writestr" in result.stdout
    result = runtime.exec(session, ExecRequest(shell=f"/opt/skills/{name}/scripts/run.py", user="user", timeout_s=60))
    assert (result.exit_code, result.stdout) == (0, b"ran\n"), result.stderr.decode()


def test_world_writable_setuid_and_setgid_bits_are_removed_and_named() -> None:
    data = build_zip(
        [
            ("my-skill/SKILL.md", skill_md(), 0o100666),
            ("my-skill/scripts/run.sh", b"#!/bin/sh\n", 0o100777),
            ("my-skill/scripts/suid.sh", b"#!/bin/sh\n", 0o106755),
            ("my-skill/group.txt", b"g", 0o100664),
        ]
    )
    version = import_bytes(data).version
    modes = {f.path: f.mode for f in version_files(version)}
    assert modes == {"SKILL.md": 0o664, "scripts/run.sh": 0o775, "scripts/suid.sh": 0o755, "group.txt": 0o664}
    warning = next(w["message"] for w in version.warnings if "Modes of" in w["message"])
    assert "SKILL.md 0666→0664" in warning
    assert "scripts/run.sh 0777→0775" in warning
    assert "scripts/suid.sh 6755→0755" in warning
    assert "group.txt" not in warning, "group write is not the session user's (root's group)"
