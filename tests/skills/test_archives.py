"""Untrusted archives: every attack is refused with a clear message and nothing is written;
modes and bytes survive exactly; packaging leftovers are dropped."""

from __future__ import annotations

import io
import random
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from console.models import AuditEvent
from console.services import ServiceError
from skills.archives import Limits
from skills.models import Skill, SkillFile, SkillVersion
from skills.services import import_folder, version_files
from tests.support.skills import EXECUTABLE, REGULAR, build_tar, build_zip, import_bytes, skill_md, skill_zip, tar_file
from tests.support.tuning import Tuned

pytestmark = pytest.mark.django_db

SMALL = Limits(archive_bytes=200_000, max_files=5, uncompressed_bytes=3_000_000, compression_ratio=100)


def assert_nothing_written() -> None:
    assert Skill.objects.count() == 0
    assert SkillVersion.objects.count() == 0
    assert SkillFile.objects.count() == 0
    assert AuditEvent.objects.count() == 0


def with_skill(*entries: tuple[str, bytes, int]) -> bytes:
    return build_zip([("my-skill/SKILL.md", skill_md(), REGULAR), *entries])


def tar_with_skill(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    return build_tar([(tar_file("my-skill/SKILL.md"), skill_md()), *members])


ZIP_ATTACKS = {
    "traversal": (with_skill(("my-skill/../x", b"x", REGULAR)), "leaves the skill"),
    "traversal at the root": (with_skill(("../x", b"x", REGULAR)), "leaves the skill"),
    "absolute path": (with_skill(("/etc/x", b"x", REGULAR)), "absolute paths are not allowed"),
    "drive letter": (with_skill(("C:/x", b"x", REGULAR)), "absolute paths are not allowed"),
    "backslash": (with_skill(("my-skill\\..\\x", b"x", REGULAR)), "backslashes"),
    "symlink escaping": (
        with_skill(("my-skill/passwd", b"../../etc/passwd", stat.S_IFLNK | 0o777)),
        "a symlink pointing outside the skill ('../../etc/passwd')",
    ),
    "symlink absolute": (
        with_skill(("my-skill/passwd", b"/etc/passwd", stat.S_IFLNK | 0o777)),
        "pointing outside the skill",
    ),
    "symlink inside": (
        with_skill(("my-skill/scripts/run", b"run.sh", stat.S_IFLNK | 0o777)),
        "symlinks are not imported (it points to 'run.sh' inside the skill)",
    ),
    "device file": (with_skill(("my-skill/null", b"", stat.S_IFCHR | 0o666)), "a character device"),
    "fifo": (with_skill(("my-skill/pipe", b"", stat.S_IFIFO | 0o644)), "a FIFO"),
    "too many files": (
        with_skill(*[(f"my-skill/f{i}.txt", b"x", REGULAR) for i in range(5)]),
        "more than 5 files (skills.max_files)",
    ),
    "bomb by ratio": (with_skill(("my-skill/zeros.bin", b"\0" * 2_000_000, REGULAR)), "compresses"),
    "bomb by total": (
        with_skill(*[(f"my-skill/r{i}.txt", bytes(range(256)) * 4000, REGULAR) for i in range(3)]),
        "unpacks to more than 2.9 MiB (skills.max_uncompressed_bytes)",
    ),
    "duplicate entries": (
        with_skill(("my-skill/a.txt", b"1", REGULAR), ("my-skill/a.txt", b"2", REGULAR)),
        "appears twice",
    ),
    "file and folder": (
        with_skill(("my-skill/a", b"1", REGULAR), ("my-skill/a/b", b"2", REGULAR)),
        "both a file and a folder",
    ),
    "nameless entry": (with_skill(("", b"x", REGULAR)), "an entry without a name"),
    "no SKILL.md": (build_zip([("my-skill/README.md", b"x", REGULAR)]), "No SKILL.md found"),
    "two top folders": (
        build_zip([("a/SKILL.md", skill_md(), REGULAR), ("b/SKILL.md", skill_md(), REGULAR)]),
        "No SKILL.md found",
    ),
    "SKILL.md error": (
        build_zip([("my-skill/SKILL.md", b"---\nname: a\ndescription: b: c\n---\n", REGULAR)]),
        "SKILL.md line 3: Invalid YAML",
    ),
    "SKILL.md without name": (
        build_zip([("my-skill/SKILL.md", b"---\ndescription: b\n---\n", REGULAR)]),
        "line 2: The frontmatter has no 'name'",
    ),
    "not an archive": (b"just some text, not an archive" * 10, "not a zip, .skill or tar archive"),
    "truncated zip": (skill_zip()[:-30], "not a zip, .skill or tar archive"),
}


@pytest.mark.parametrize("case", list(ZIP_ATTACKS))
def test_hostile_zip_is_refused_and_nothing_is_written(case: str) -> None:
    data, fragment = ZIP_ATTACKS[case]
    with pytest.raises(ServiceError) as caught:
        import_bytes(data, limits=SMALL)
    assert fragment in caught.value.message
    assert_nothing_written()


def test_archive_over_the_size_limit_is_refused() -> None:
    data = with_skill(("my-skill/noise.bin", random.Random(1).randbytes(30_000), REGULAR))
    with pytest.raises(ServiceError) as caught:
        import_bytes(data, limits=Limits(archive_bytes=10_000))
    assert "the limit is 9.8 KiB (skills.archive_max_bytes)" in caught.value.message
    assert_nothing_written()


TAR_ATTACKS = {
    "traversal": (tar_with_skill((tar_file("my-skill/../../x"), b"x")), "leaves the skill"),
    "absolute path": (tar_with_skill((tar_file("/etc/x"), b"x")), "absolute paths are not allowed"),
    "symlink escaping": (
        tar_with_skill((tar_file("my-skill/l", kind=tarfile.SYMTYPE, linkname="/etc/shadow"), None)),
        "a symlink pointing outside the skill ('/etc/shadow')",
    ),
    "hard link": (
        tar_with_skill((tar_file("my-skill/h", kind=tarfile.LNKTYPE, linkname="../../etc/shadow"), None)),
        "a hard link pointing outside the skill",
    ),
    "character device": (
        tar_with_skill((tar_file("my-skill/null", kind=tarfile.CHRTYPE), None)),
        "'my-skill/null': refused: a character device",
    ),
    "block device": (tar_with_skill((tar_file("my-skill/sda", kind=tarfile.BLKTYPE), None)), "a block device"),
    "fifo": (tar_with_skill((tar_file("my-skill/p", kind=tarfile.FIFOTYPE), None)), "a FIFO"),
    "too many files": (
        tar_with_skill(*[(tar_file(f"my-skill/f{i}"), b"x") for i in range(5)]),
        "more than 5 files",
    ),
    "bomb by total": (tar_with_skill((tar_file("my-skill/big"), b"\0" * 3_100_000)), "unpacks to more than"),
    "bomb by ratio": (tar_with_skill((tar_file("my-skill/big"), b"\0" * 2_000_000)), "compresses"),
    # Left-out folders are not the skill's files, but their bytes are still decompressed to be skipped.
    "bomb in a left-out folder": (
        tar_with_skill((tar_file("my-skill/node_modules/zeros.bin"), b"\0" * 5_000_000)),
        "'the archive': refused: it compresses",
    ),
    # tarfile skips the data of a member of an unknown type as it does a file's.
    "bomb of an unknown type in a left-out folder": (
        tar_with_skill((tar_file("my-skill/.git/objects/x", kind=b"Z"), b"\0" * 5_000_000)),
        "'the archive': refused: it compresses",
    ),
    # Folders and left-out files do not count as files, yet each one is a header read and kept.
    "entries in a left-out folder": (
        tar_with_skill(*[(tar_file(f"my-skill/node_modules/m{i}.js"), b"") for i in range(600)]),
        "more than 500 entries (files, folders and left-out packaging files; 100 per file of skills.max_files)",
    ),
    "folder entries": (
        tar_with_skill(*[(tar_file(f"my-skill/d{i}", kind=tarfile.DIRTYPE, mode=0o755), None) for i in range(600)]),
        "more than 500 entries",
    ),
}


@pytest.mark.parametrize("case", list(TAR_ATTACKS))
def test_hostile_tar_is_refused_and_nothing_is_written(case: str) -> None:
    data, fragment = TAR_ATTACKS[case]
    with pytest.raises(ServiceError) as caught:
        import_bytes(data, "my-skill.tar.gz", limits=SMALL)
    assert fragment in caught.value.message
    assert_nothing_written()


def test_failure_while_storing_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from skills import services

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(services, "record_audit", explode)
    with pytest.raises(RuntimeError):
        import_bytes(skill_zip({"a.txt": b"a"}))
    assert_nothing_written()


BINARY = bytes(range(256)) * 8 + b"\r\n\r\n\x00end"


def test_zip_keeps_modes_and_bytes_exactly() -> None:
    data = build_zip(
        [
            ("my-skill/SKILL.md", skill_md().replace(b"\n", b"\r\n"), REGULAR),
            ("my-skill/scripts/run.sh", b"#!/bin/sh\necho hi\r\n", EXECUTABLE),
            ("my-skill/scripts/deep/er/tool.py", b"print(1)\n", stat.S_IFREG | 0o750),
            ("my-skill/assets/font.ttf", BINARY, REGULAR),
            ("my-skill/assets/readonly.txt", b"r", stat.S_IFREG | 0o444),
            ("my-skill/assets/setuid", b"s", stat.S_IFREG | 0o4755),
            ("my-skill/assets/", b"", stat.S_IFDIR | 0o755),
        ]
    )
    version = import_bytes(data).version
    files = {f.path: f for f in version_files(version)}
    assert files["scripts/run.sh"].mode == 0o755
    assert files["scripts/run.sh"].data == b"#!/bin/sh\necho hi\r\n"
    assert files["scripts/deep/er/tool.py"].mode == 0o755, "exec bits kept, widened for the session user"
    assert files["assets/font.ttf"].data == BINARY
    assert files["assets/font.ttf"].mode == 0o644
    assert files["assets/readonly.txt"].mode == 0o444
    assert files["assets/setuid"].mode == 0o755, "setuid is dropped"
    assert files["SKILL.md"].data == skill_md().replace(b"\n", b"\r\n"), "line endings are never normalised"
    assert version.folder_name == "my-skill"
    assert list(files) == sorted(files)
    stored = SkillFile.objects.get(version=version, path="assets/font.ttf")
    assert stored.mode_string == "-rw-r--r--"
    assert not stored.is_text
    assert SkillFile.objects.get(version=version, path="scripts/run.sh").mode_string == "-rwxr-xr-x"


def test_zip_without_unix_modes_gets_defaults() -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, body in [("s/SKILL.md", skill_md("s")), ("s/run", b"#!/bin/sh\n"), ("s/data.txt", b"d")]:
            info = zipfile.ZipInfo(name)
            info.create_system = 0  # MS-DOS: no Unix mode
            info.external_attr = 0x20
            archive.writestr(info, body)
    files = {f.path: f.mode for f in version_files(import_bytes(buffer.getvalue()).version)}
    assert files == {"SKILL.md": 0o644, "data.txt": 0o644, "run": 0o755}


def test_tar_keeps_modes_and_bytes_exactly() -> None:
    data = build_tar(
        [
            (tar_file("my-skill/SKILL.md"), skill_md()),
            (tar_file("my-skill/scripts", kind=tarfile.DIRTYPE, mode=0o755), None),
            (tar_file("my-skill/scripts/run.sh", mode=0o755), b"#!/bin/sh\n"),
            (tar_file("my-skill/assets/blob.bin", mode=0o600), BINARY),
        ],
        compression="xz",
    )
    version = import_bytes(data, "my-skill.tar.xz").version
    files = {f.path: (f.mode, f.data) for f in version_files(version)}
    assert files["scripts/run.sh"] == (0o755, b"#!/bin/sh\n")
    assert files["assets/blob.bin"] == (0o644, BINARY), "made readable for the session user"


def test_skill_md_at_the_root_is_a_warning_and_the_name_comes_from_the_file() -> None:
    data = build_zip([("SKILL.md", skill_md("report-maker"), REGULAR), ("a.txt", b"a", REGULAR)])
    version = import_bytes(data, "report-maker.zip").version
    assert version.folder_name == "report-maker"
    assert any("archive root" in w["message"] for w in version.warnings)
    assert sorted(f.path for f in version_files(version)) == ["SKILL.md", "a.txt"]


def test_packaging_leftovers_are_dropped() -> None:
    data = build_zip(
        [
            ("my-skill/SKILL.md", skill_md(), REGULAR),
            ("my-skill/scripts/run.py", b"x", REGULAR),
            ("my-skill/scripts/__pycache__/run.cpython-311.pyc", b"\0", REGULAR),
            ("my-skill/other.pyc", b"\0", REGULAR),
            ("my-skill/.DS_Store", b"\0", REGULAR),
            ("my-skill/node_modules/left-pad/index.js", b"x", REGULAR),
            ("my-skill/evals/case.json", b"{}", REGULAR),
            ("my-skill/scripts/evals/kept.txt", b"kept", REGULAR),
            ("__MACOSX/my-skill/._SKILL.md", b"\0", REGULAR),
        ]
    )
    version = import_bytes(data).version
    assert sorted(f.path for f in version_files(version)) == ["SKILL.md", "scripts/evals/kept.txt", "scripts/run.py"]
    assert any("Left out 6 packaging leftover" in w["message"] for w in version.warnings)


def test_folder_import_keeps_modes(tmp_path: Path) -> None:
    folder = tmp_path / "folder-skill"
    (folder / "scripts").mkdir(parents=True)
    (folder / "SKILL.md").write_bytes(skill_md("folder-skill"))
    (folder / "scripts" / "run.sh").write_bytes(b"#!/bin/sh\n")
    (folder / "scripts" / "run.sh").chmod(0o755)
    (folder / "data.bin").write_bytes(BINARY)
    (folder / "data.bin").chmod(0o644)
    version = import_folder(folder, actor=__import__("console.services").services.SYSTEM).version
    files = {f.path: (f.mode, f.data) for f in version_files(version)}
    assert files["scripts/run.sh"] == (0o755, b"#!/bin/sh\n")
    assert files["data.bin"] == (0o644, BINARY)
    assert version.folder_name == "folder-skill"
    assert version.warnings == []


@pytest.mark.parametrize(("target", "fragment"), [("/etc/passwd", "outside the skill"), ("SKILL.md", "inside")])
def test_folder_with_a_symlink_is_refused(tmp_path: Path, target: str, fragment: str) -> None:
    from console.services import SYSTEM

    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "SKILL.md").write_bytes(skill_md("s"))
    (folder / "link").symlink_to(target)
    with pytest.raises(ServiceError) as caught:
        import_folder(folder, actor=SYSTEM)
    assert fragment in caught.value.message
    assert_nothing_written()


@pytest.mark.parametrize("name", ["node_modules", ".git", "__pycache__"])
def test_a_left_out_folder_that_is_a_symlink_is_not_walked(tmp_path: Path, name: str) -> None:
    """A checkout can hold `node_modules -> /`: counting what is left out must not walk it."""
    from console.services import SYSTEM

    outside = tmp_path / "outside"
    outside.mkdir()
    for index in range(7):
        (outside / f"f{index}").write_bytes(b"x")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "SKILL.md").write_bytes(skill_md("s"))
    (folder / name).symlink_to(outside)
    version = import_folder(folder, actor=SYSTEM).version
    assert [f.path for f in version_files(version)] == ["SKILL.md"]
    assert any("Left out 1 packaging leftover" in w["message"] for w in version.warnings), version.warnings


def test_folder_with_a_fifo_is_refused(tmp_path: Path) -> None:
    import os

    from console.services import SYSTEM

    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "SKILL.md").write_bytes(skill_md("s"))
    os.mkfifo(folder / "pipe")
    with pytest.raises(ServiceError) as caught:
        import_folder(folder, actor=SYSTEM)
    assert "a FIFO" in caught.value.message
    assert_nothing_written()


def test_limits_come_from_settings(tuned: Tuned, settings: object) -> None:
    tuned({"skills.max_files": 1})
    with pytest.raises(ServiceError) as caught:
        import_bytes(skill_zip({"a.txt": b"a"}))
    assert "more than 1 files" in caught.value.message
    assert_nothing_written()


def test_unreadable_folder_is_refused_not_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from console.services import SYSTEM

    folder = tmp_path / "s"
    (folder / "private").mkdir(parents=True)
    (folder / "SKILL.md").write_bytes(skill_md("s"))
    (folder / "private" / "secret.txt").write_bytes(b"x")
    real_open = Path.open

    def refuse(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "secret.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(ServiceError) as caught:
        import_folder(folder, actor=SYSTEM)
    assert "Cannot read" in caught.value.message
    assert "Permission denied" in caught.value.message
    assert_nothing_written()
