"""Pure parts of the install pipeline: tar layout, the check-script convention, pip, npm's
folders."""

from __future__ import annotations

import io
import tarfile
import zipfile

import pytest

from skills.install.npm import package_folders
from skills.install.packages import console_pip_wheel, parse_pip_installed, redact_userinfo
from skills.install.steps import SkillPayload, StepFailed, tar_of


def payload(files: dict[str, tuple[int, bytes]], metadata: dict[str, str] | None = None) -> SkillPayload:
    return SkillPayload(
        name="demo",
        version_id="v",
        content_hash="h",
        files=tuple((path, mode, data) for path, (mode, data) in files.items()),
        metadata=metadata or {},
    )


def test_tar_keeps_modes_but_drops_group_and_other_write_and_owns_by_root() -> None:
    archive = tar_of([("scripts/run.sh", 0o777, b"#!/bin/sh\n"), ("SKILL.md", 0o664, b"x"), ("x", 0o4755, b"")])
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["scripts"].isdir()
    assert members["scripts"].mode == 0o755
    assert members["scripts/run.sh"].mode == 0o755
    assert members["SKILL.md"].mode == 0o644
    assert members["x"].mode == 0o755  # no setuid
    assert {m.uid for m in members.values()} == {0}


def test_check_script_convention() -> None:
    assert payload({"SKILL.md": (0o644, b"")}).check_script() is None
    assert payload({"scripts/check.sh": (0o755, b"")}).check_script() == "scripts/check.sh"
    assert payload({"scripts/check.py": (0o644, b"")}).check_script() == "scripts/check.py"
    both = payload(
        {"scripts/check.sh": (0o755, b""), "tests/selftest.py": (0o644, b"")}, {"check": "tests/selftest.py"}
    )
    assert both.check_script() == "tests/selftest.py"
    with pytest.raises(StepFailed, match="not a file of the skill"):
        payload({"SKILL.md": (0o644, b"")}, {"check": "../../bin/true"}).check_script()


def test_pip_output_parsing() -> None:
    out = "Looking in links: /x\nProcessing ./tinydep-1.0-py3-none-any.whl\nSuccessfully installed a-1.0 tinydep-1.0\n"
    assert parse_pip_installed(out) == ["a-1.0", "tinydep-1.0"]
    assert parse_pip_installed("Requirement already satisfied: a\n") == []


def test_console_pip_is_packed_as_a_runnable_wheel() -> None:
    name, data = console_pip_wheel()
    assert name.startswith("pip-")
    assert name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = set(archive.namelist())
    assert "pip/__main__.py" in names
    assert not any(n.endswith(".pyc") for n in names)


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("http://ghp_s3cr3tT0ken@127.0.0.1:8080/simple/", "ghp_s3cr3tT0ken"),  # a token alone
        ("http://user:p%40ss:w0rd@127.0.0.1:8080/simple/", "w0rd"),  # ':' inside the password
        ("http://user:pa@ss@[::1]:8080/simple/?k=v", "pa@ss"),  # '@' inside the password
        ("http://user:s3cret@[::1]:8080/simple/", "s3cret"),  # an IPv6 literal
    ],
    ids=["token-only", "colon-in-password", "at-in-password", "ipv6"],
)
def test_credentials_in_a_source_url_never_reach_the_log(url: str, secret: str) -> None:
    shown = redact_userinfo(url)
    assert secret not in shown
    assert "127.0.0.1:8080" in shown or "[::1]:8080" in shown


def test_npm_packages_install_beside_their_package_json_and_confirmed_ones_at_the_root() -> None:
    # A confirmed need's source says where it was found, not a package.json: the skill's root.
    confirmed = "confirmed (npm install; require/import pptxgenjs at SKILL.md:9, scripts/html2pptx.js:4)"
    npm = [
        {"name": "docx", "version": "^9", "source": "scripts/package.json"},
        {"name": "left-pad", "version": "1.3.0", "source": "package.json"},
        {"name": "pptxgenjs", "version": "*", "source": confirmed},
    ]
    skill = SkillPayload(name="demo", version_id="v", content_hash="h", files=(), dependencies={"npm": npm})
    assert package_folders(skill) == {"": {"left-pad": "1.3.0", "pptxgenjs": "*"}, "scripts": {"docx": "^9"}}
