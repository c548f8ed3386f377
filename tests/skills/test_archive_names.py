"""Names and leftovers at import: names that are not UTF-8 are refused with the file named (in
zip, tar and folders; a 400 on the page, an error line in the command, which goes on with the
other paths), and so are names holding a control character (newline, ESC, DEL, C1) or a
format character or separator (a bidi override, a zero-width space, U+2028), shown escaped,
whether a member's, the uploaded file's or a folder's; one name in two Unicode forms is one
name; `node_modules/`, `.git/` and `__pycache__/` are dropped before the file limit counts."""

from __future__ import annotations

import io
import os
import tarfile
import unicodedata
from pathlib import Path
from typing import Any

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


# --- Control characters in names ----------------------------------------------------------

CONTROLS = {
    "newline": ("\n", "\\n"),
    "escape": ("\x1b[2J", "\\x1b"),
    "carriage return": ("\r", "\\r"),
    "delete": ("\x7f", "\\x7f"),
    "C1 CSI": ("\x9b", "\\x9b"),
    # Names only: what a name looks like is not what it is (a listing reorders or hides it).
    "right-to-left override": ("\u202e", "\\u202e"),
    "line separator": ("\u2028", "\\u2028"),
    "paragraph separator": ("\u2029", "\\u2029"),
    "zero-width space": ("\u200b", "\\u200b"),
    "byte order mark": ("\ufeff", "\\ufeff"),
}


def assert_shown_escaped(message: str, escaped: str) -> None:
    assert escaped in message
    assert "refused: the name contains a control character" in message
    assert not any(unicodedata.category(char) in {"Cc", "Cf", "Zl", "Zp"} for char in message), repr(message)


def zip_with(name: str) -> bytes:
    return build_zip([("my-skill/SKILL.md", skill_md(), REGULAR), (name, b"x", REGULAR)])


def tar_with(name: str) -> bytes:
    """A PAX tar (names of any characters) holding SKILL.md and `name`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for member, data in [("my-skill/SKILL.md", skill_md()), (name, b"x")]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("kind", list(CONTROLS))
@pytest.mark.parametrize("build", [zip_with, tar_with], ids=["zip", "tar"])
def test_member_name_with_a_control_character_is_refused_shown_escaped(kind: str, build: Any) -> None:
    control, escaped = CONTROLS[kind]
    with pytest.raises(ServiceError) as caught:
        import_bytes(build(f"my-skill/notes{control}forged.txt"), "my-skill.tar.gz")
    assert_shown_escaped(caught.value.message, escaped)
    assert f"my-skill/notes{escaped}" in caught.value.message
    assert_nothing_written()


def test_link_target_with_a_control_character_is_shown_escaped() -> None:
    members = [
        (tar_file("my-skill/SKILL.md"), skill_md()),
        (tar_file("my-skill/link", kind=tarfile.SYMTYPE, linkname="x\x1b]0;owned\x07\nforged"), None),
    ]
    with pytest.raises(ServiceError) as caught:
        import_bytes(build_tar(members), "my-skill.tar.gz")
    assert "\\x1b]0;owned\\x07\\nforged" in caught.value.message
    assert "\x1b" not in caught.value.message
    assert "\n" not in caught.value.message
    assert_nothing_written()


@pytest.mark.parametrize("filename", ["my-skill\n2026 INFO forged.zip", "my-skill\x1b[2J.zip"])
def test_uploaded_file_name_with_a_control_character_is_refused(filename: str) -> None:
    with pytest.raises(ServiceError) as caught:
        import_bytes(zip_with("my-skill/notes.txt"), filename)
    assert_shown_escaped(caught.value.message, repr(filename)[1:-1])
    assert_nothing_written()


@pytest.mark.parametrize("build", [zip_with, tar_with], ids=["zip", "tar"])
def test_upload_with_a_control_character_in_a_name_is_a_400_shown_escaped(world: World, build: Any) -> None:
    client: Client = world.client_for("root")
    response = client.post(
        reverse("skills:skill_import"),
        {"archive": SimpleUploadedFile("my-skill.skill", build("my-skill/a\x1b[31mred\nforged.txt"))},
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "my-skill/a\\x1b[31mred\\nforged.txt" in page
    assert "contains a control character" in page
    assert "\x1b" not in page
    assert_nothing_written()


def test_folder_file_with_a_control_character_is_refused_and_the_command_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write_skill(tmp_path / "bad-skill", "bad-skill")
    (bad / "notes\x1b[2J\nforged.md").write_bytes(b"x")
    good = write_skill(tmp_path / "good-skill", "good-skill")
    with pytest.raises(CommandError):
        call_command("import_skill", str(bad), str(good))
    err = capsys.readouterr().err
    assert "'notes\\x1b[2J\\nforged.md': refused: the name contains a control character (\\x1b)" in err
    assert "\x1b" not in err
    assert list(Skill.objects.values_list("name", flat=True)) == ["good-skill"]


# --- Invisible characters and Unicode forms in names ---------------------------------------


def test_folder_with_an_invisible_character_is_refused_shown_escaped(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "my\u202eskill", "my-skill")
    with pytest.raises(ServiceError) as caught:
        import_folder(folder, actor=SYSTEM)
    assert "'my\\u202eskill': refused: the name contains a control character (\\u202e)" in caught.value.message
    assert_nothing_written()


@pytest.mark.parametrize("build", [zip_with, tar_with], ids=["zip", "tar"])
def test_one_name_in_two_unicode_forms_is_refused_as_a_duplicate(build: Any) -> None:
    """caf\u00e9.md (NFC) and cafe\u0301.md (NFD) are one name to a reader and to macOS."""
    files = [("my-skill/SKILL.md", skill_md(), REGULAR), ("my-skill/caf\u00e9.md", b"a", REGULAR)]
    files.append(("my-skill/cafe\u0301.md", b"b", REGULAR))
    data = build_zip(files) if build is zip_with else build_tar([(tar_file(n), d) for n, d, _ in files])
    with pytest.raises(ServiceError) as caught:
        import_bytes(data, "my-skill.tar.gz")
    assert "refused: the path appears twice in the archive" in caught.value.message
    assert_nothing_written()


@pytest.mark.parametrize("build", [zip_with, tar_with], ids=["zip", "tar"])
def test_a_name_longer_than_a_file_system_takes_is_refused_at_import(build: Any) -> None:
    """A part of a path over 255 bytes (86 three-byte characters, well within the path limit
    in characters) would only fail when a sandbox's file system is asked to hold it, at install."""
    long = "\u20ac" * 86  # 258 bytes in 86 characters
    with pytest.raises(ServiceError) as caught:
        import_bytes(build(f"my-skill/docs/{long}.md"), "my-skill.tar.gz")
    assert "is over 255 bytes" in caught.value.message
    assert_nothing_written()
    import_bytes(build(f"my-skill/docs/{long[:80]}.md"), "my-skill.tar.gz")  # 243 bytes: kept
