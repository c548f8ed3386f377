"""Names and leftovers at import: names that are not UTF-8 are refused with the file named (in
zip, tar and folders; a 400 on the page, an error line in the command, which goes on with the
other paths); `node_modules/`, `.git/` and `__pycache__/` are dropped before the file limit
counts."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent
from console.services import SYSTEM, ServiceError
from skills.archives import Limits
from skills.models import Skill, SkillFile, SkillVersion
from skills.services import import_folder, version_files
from tests.support.skills import REGULAR, build_tar, build_zip, import_bytes, skill_md, tar_file

from .conftest import World

pytestmark = pytest.mark.django_db

LATIN1_NAME = b"my-skill/caf\xe9.txt"


def assert_nothing_written() -> None:
    assert SkillVersion.objects.count() == 0
    assert SkillFile.objects.count() == 0
    assert AuditEvent.objects.count() == 0


def tar_with_raw_name(raw: bytes) -> bytes:
    """A ustar archive holding a member whose name is the raw bytes (GNU tar keeps them so)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.USTAR_FORMAT, errors="surrogateescape") as tar:
        for name, data in [("my-skill/SKILL.md", skill_md()), (raw.decode("utf-8", "surrogateescape"), b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def zip_with_raw_name(raw_tail: bytes, *, utf8_flag: bool) -> bytes:
    """A zip whose second entry's name ends with `raw_tail` bytes, flagged UTF-8 or not.

    zipfile writes what it is given as UTF-8 (flagged) or ASCII; the name is patched after."""
    placeholder = "é".encode() if utf8_flag else b"XX"
    assert len(raw_tail) == len(placeholder)
    name = "my-skill/caf" + placeholder.decode() + ".txt"
    data = build_zip([("my-skill/SKILL.md", skill_md(), REGULAR), (name, b"x", REGULAR)])
    assert data.count(placeholder + b".txt") == 2  # local header and central directory
    return data.replace(placeholder + b".txt", raw_tail + b".txt")


def test_tar_with_a_latin1_name_is_refused_naming_the_file() -> None:
    with pytest.raises(ServiceError) as caught:
        import_bytes(tar_with_raw_name(LATIN1_NAME), "my-skill.tar.gz")
    assert caught.value.message == (
        "'my-skill/caf\\xe9.txt': refused: the name is not valid UTF-8; rename the file (skills keep UTF-8 names)."
    )
    assert_nothing_written()


def test_zip_flagged_utf8_with_bad_bytes_is_refused_naming_the_file() -> None:
    with pytest.raises(ServiceError) as caught:
        import_bytes(zip_with_raw_name(b"\xe9X", utf8_flag=True))
    assert caught.value.message.startswith("'my-skill/caf\\xe9X.txt': refused: the name is not valid UTF-8")
    assert_nothing_written()


def test_zip_unflagged_latin1_name_is_refused_and_unflagged_utf8_is_read_as_utf8() -> None:
    with pytest.raises(ServiceError) as caught:
        import_bytes(zip_with_raw_name(b"\xe9X", utf8_flag=False))
    assert caught.value.message.startswith("'my-skill/caf\\xe9X.txt': refused: the name is not valid UTF-8")
    assert_nothing_written()
    version = import_bytes(zip_with_raw_name("é".encode(), utf8_flag=False)).version
    assert sorted(f.path for f in version_files(version)) == ["SKILL.md", "café.txt"]


def test_upload_with_a_bad_name_is_a_400_naming_the_file(world: World) -> None:
    client: Client = world.client_for("root")
    response = client.post(
        reverse("skills:skill_import"),
        {"archive": SimpleUploadedFile("my-skill.tar.gz", tar_with_raw_name(LATIN1_NAME))},
    )
    assert response.status_code == 400
    assert "my-skill/caf\\xe9.txt" in response.content.decode()
    assert "not valid UTF-8" in response.content.decode()
    assert_nothing_written()


def write_skill(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_bytes(skill_md(name))
    return folder


def test_folder_with_a_bad_name_is_refused_naming_it(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "my-skill", "my-skill")
    (folder / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"x")
    with pytest.raises(ServiceError) as caught:
        import_folder(folder, actor=SYSTEM)
    assert caught.value.message.startswith("'caf\\xe9.txt': refused: the name is not valid UTF-8")
    assert_nothing_written()


def test_command_names_the_bad_folder_goes_on_and_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_skill(tmp_path / "bad-skill", "bad-skill")
    (bad / "scripts").mkdir()
    (bad / "scripts" / os.fsdecode(b"r\xe9sum\xe9.py")).write_bytes(b"print(1)\n")
    badly_named = write_skill(tmp_path / os.fsdecode(b"odd-\xff"), "odd-skill")
    good = write_skill(tmp_path / "good-skill", "good-skill")
    with pytest.raises(CommandError) as caught:
        call_command("import_skill", str(bad), str(badly_named), str(good))
    assert "2 of 3 path(s) were refused" in str(caught.value)
    err = capsys.readouterr()
    assert f"{bad}: 'scripts/r\\xe9sum\\xe9.py': refused: the name is not valid UTF-8" in err.err
    assert "odd-\\xff': refused: the name is not valid UTF-8" in err.err
    assert "Traceback" not in err.err
    assert list(Skill.objects.values_list("name", flat=True)) == ["good-skill"]
    assert f"{good}: Skill good-skill imported" in err.out


BULK = 1500


def test_node_modules_bulk_is_dropped_before_the_file_limit_zip_and_tar() -> None:
    junk = [(f"my-skill/node_modules/pkg{i}/index.js", b"x", REGULAR) for i in range(BULK)]
    real = [("my-skill/SKILL.md", skill_md(), REGULAR), ("my-skill/scripts/run.js", b"require('pkg1')\n", REGULAR)]
    limits = Limits(max_files=1000)
    version = import_bytes(build_zip(real + junk), limits=limits).version
    assert sorted(f.path for f in version_files(version)) == ["SKILL.md", "scripts/run.js"]
    assert any(f"Left out {BULK} packaging leftover" in w["message"] for w in version.warnings)
    tar_members = [(tar_file(name), data) for name, data, _ in real + junk]
    tar_members[1] = (tar_file("my-skill/scripts/run.js"), b"require('pkg2')\n")
    version = import_bytes(build_tar(tar_members), "my-skill.tar.gz", limits=limits).version
    assert version.file_count == 2


def test_git_folder_and_node_modules_links_are_dropped_in_a_folder(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "my-skill", "my-skill")
    for i in range(1200):
        path = folder / ".git" / "objects" / f"{i:02x}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"blob")
    (folder / "node_modules" / ".bin").mkdir(parents=True)
    (folder / "node_modules" / ".bin" / "tool").symlink_to("../tool/cli.js")  # npm makes these
    (folder / "scripts").mkdir()
    (folder / "scripts" / "run.py").write_bytes(b"print(1)\n")
    version = import_folder(folder, actor=SYSTEM).version
    assert sorted(f.path for f in version_files(version)) == ["SKILL.md", "scripts/run.py"]
    assert any("Left out 1201 packaging leftover" in w["message"] for w in version.warnings)


def test_a_skill_over_the_limit_without_leftovers_is_still_refused() -> None:
    files = [("my-skill/SKILL.md", skill_md(), REGULAR)] + [(f"my-skill/f{i}", b"x", REGULAR) for i in range(5)]
    with pytest.raises(ServiceError) as caught:
        import_bytes(build_zip(files), limits=Limits(max_files=5))
    assert "more than 5 files" in caught.value.message
