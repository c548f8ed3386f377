"""Reading untrusted skill archives (.zip, .skill, tar) and server folders.

Nothing is ever extracted into a folder: every entry is checked (name, type, size, ratio) and
streamed in 1 MiB chunks into one `Spool` per import (a temporary file, in memory up to 8 MiB),
hashed on the way. A `SkillEntry` is the path, mode, size, SHA-256 and where its bytes sit in
the spool, so memory stays bounded whatever the skill's size. The importer stores the result
in one transaction, so a refusal at any point leaves nothing behind.

Packaging leftovers (`node_modules/`, `.git/`, `__pycache__/`, `*.pyc`, `.DS_Store`,
`__MACOSX/`) are skipped before anything else is checked or counted: the file limit counts the
skill's own files. They are still bounded: a tar may hold `ENTRIES_PER_FILE` entries (folders
and left-out files included) per allowed file, and the compression ratio covers the bytes
decompressed to skip them. Names must be UTF-8 and hold no control character (newline, ESC,
DEL...: `skills.names`), whether a member's, the uploaded file's or a folder's; any other name
is refused with the name shown escaped (undecodable bytes as `\\xNN`, controls as `\\n`, `\\x1b`).

Symlinks and hard links are refused, whether they point inside the skill or not: the
installer copies plain files, official skills ship none, and refusing them all removes a
whole class of escapes. The message says whether the link left the skill. Directories are
not stored (empty folders are dropped; the installer creates folders 0755); files keep their
permission bits, without setuid, setgid, sticky or world write, and made readable by everyone
(executable by everyone when any exec bit is set), because the installed skill belongs to root
and the session user reads it as "other" (and must not rewrite it). Each change is named in a
warning.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import lzma
import os
import posixpath
import re
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

from .names import control_problem, same_key, shown
from .parsing import Issue, Severity

MIB = 1024 * 1024
DEFAULT_ARCHIVE_MAX_BYTES = 20 * MIB
DEFAULT_MAX_FILES = 1000
DEFAULT_MAX_UNCOMPRESSED_BYTES = 100 * MIB
DEFAULT_MAX_COMPRESSION_RATIO = 100
# Small files compress very well without being a threat (a 64 KiB run of spaces is ~1000:1),
# so the per-entry ratio is only checked above this size.
RATIO_CHECK_MIN_BYTES = 64 * 1024
# Folders and left-out packaging files do not count as files, but each is a header to read
# (and, in a tar, bytes to decompress to skip): a tar may hold this many entries per allowed file.
ENTRIES_PER_FILE = 100
MAX_PATH_LENGTH = 1024
# One file or folder name, as Linux file systems take it (NAME_MAX).
MAX_NAME_BYTES = 255
SYMLINK_TARGET_MAX = 4096
PERMISSION_BITS = 0o777
# setuid, setgid, sticky: read from the archive so their removal is named, never stored.
SPECIAL_BITS = 0o7000
ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tar", ".zip", ".skill")
# Left out as the reference packager does (package_skill.py), plus macOS resource forks and
# version-control folders.
JUNK_DIRS_ANY_DEPTH = frozenset({"__pycache__", "node_modules", ".git"})
JUNK_DIRS_AT_ROOT = frozenset({"evals"})
JUNK_FILES = frozenset({".DS_Store"})
ARCHIVE_ROOT_JUNK = frozenset({"__MACOSX", ".DS_Store"})
CHUNK_BYTES = MIB
# A spool stays in memory up to this size, then moves to a temporary file.
SPOOL_MEMORY_BYTES = 8 * MIB
HEAD_BYTES = 256


class ArchiveError(ValueError):
    """A refused archive or folder; `message` is shown to the user as is."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Limits:
    """Caps on what one import may contain (tuning skills.*)."""

    archive_bytes: int = DEFAULT_ARCHIVE_MAX_BYTES
    max_files: int = DEFAULT_MAX_FILES
    uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES
    compression_ratio: int = DEFAULT_MAX_COMPRESSION_RATIO

    @classmethod
    def from_settings(cls) -> Limits:
        from .tuning import SKILLS

        return cls(
            archive_bytes=SKILLS.archive_max_bytes,
            max_files=SKILLS.max_files,
            uncompressed_bytes=SKILLS.max_uncompressed_bytes,
            compression_ratio=SKILLS.max_compression_ratio,
        )


class Spool:
    """The file contents of one import, back to back in one temporary file."""

    def __init__(self) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115 (closed by close())
        self._end = 0

    def add(self, path: str, mode: int, chunks: Iterator[bytes], *, declared: int | None = None) -> SkillEntry:
        """Copy `chunks` in, hashing and checking them; refuse more bytes than `declared`."""
        digest = hashlib.sha256()
        decoder = codecs.getincrementaldecoder("utf-8")()
        text = True
        head = b""
        offset = self._end
        self._file.seek(offset)
        size = 0
        for chunk in chunks:
            size += len(chunk)
            if declared is not None and size > declared:
                raise ArchiveError(f"'{shown(path)}': refused: its size differs from the size the archive declares.")
            if len(head) < HEAD_BYTES:
                head += chunk[: HEAD_BYTES - len(head)]
            digest.update(chunk)
            if text:
                try:
                    decoder.decode(chunk)
                    text = b"\x00" not in chunk
                except UnicodeDecodeError:
                    text = False
            self._file.write(chunk)
        if declared is not None and size != declared:
            raise ArchiveError(f"'{shown(path)}': refused: its size differs from the size the archive declares.")
        if text:
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                text = False
        self._end = offset + size
        return SkillEntry(path, mode, size, digest.hexdigest(), text, head, self, offset)

    def read(self, offset: int, size: int) -> bytes:
        self._file.seek(offset)
        return self._file.read(size)

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class SkillEntry:
    """One regular file of a skill: path inside the skill, permission bits, size, SHA-256, and
    where its bytes are (`read()` returns them)."""

    path: str
    mode: int
    size: int
    sha256: str
    is_text: bool
    head: bytes  # the first bytes, for `#!` checks
    spool: Spool = field(repr=False, compare=False)
    offset: int = 0

    @classmethod
    def of(cls, path: str, mode: int, data: bytes) -> SkillEntry:
        """An entry holding `data` in a spool of its own (tests, small callers)."""
        return Spool().add(path, mode, iter([data]))

    def read(self) -> bytes:
        return self.spool.read(self.offset, self.size)


class FileView(Mapping[str, bytes]):
    """{path: bytes} over a skill's entries; bytes are read only when asked for."""

    def __init__(self, entries: list[SkillEntry]) -> None:
        self._entries = {entry.path: entry for entry in entries}

    def __getitem__(self, path: str) -> bytes:
        return self._entries[path].read()

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, path: str) -> SkillEntry | None:
        return self._entries.get(path)


@dataclass
class ExtractedSkill:
    """A skill read from an archive or folder, before parsing and storage; `close()` frees the
    spool holding its bytes."""

    folder_name: str
    files: list[SkillEntry]
    notes: list[Issue] = field(default_factory=list)

    def as_mapping(self) -> FileView:
        return FileView(self.files)

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.files)

    def close(self) -> None:
        for spool in {id(entry.spool): entry.spool for entry in self.files}.values():
            spool.close()


def check_utf8_name(name: str) -> None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ArchiveError(
            f"'{shown(name)}': refused: the name is not valid UTF-8; rename the file (skills keep UTF-8 names)."
        ) from None


def check_controls(name: str) -> None:
    """Refuse a name holding a control character (`skills.names`), shown escaped."""
    problem = control_problem(name)
    if problem:
        raise ArchiveError(f"'{shown(name)}': refused: the name {problem}; rename it.")


def check_name(name: str) -> None:
    check_utf8_name(name)
    check_controls(name)


def human_size(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < MIB:
        return f"{size / 1024:.1f} KiB"
    return f"{size / MIB:.1f} MiB"


# --- Names and modes ---------------------------------------------------------------------


def clean_member_path(name: str) -> str:
    """The member's path relative to the archive root ('' for the root itself), or refuse."""
    check_utf8_name(name)
    if "\x00" in name:
        raise ArchiveError(f"{name!r}: refused: the name contains a NUL byte.")
    check_controls(name)
    if "\\" in name:
        raise ArchiveError(f"{name!r}: refused: backslashes in names are ambiguous (use '/').")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise ArchiveError(f"{name!r}: refused: absolute paths are not allowed in a skill.")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"{name!r}: refused: the path leaves the skill ('..').")
    path = "/".join(parts)
    for part in parts:
        if len(part.encode()) > MAX_NAME_BYTES:
            raise ArchiveError(
                f"{part[:80]!r}...: refused: the name is over {MAX_NAME_BYTES} bytes (a file system's most)."
            )
    if len(path) > MAX_PATH_LENGTH:
        raise ArchiveError(f"{name[:80]!r}...: refused: paths are limited to {MAX_PATH_LENGTH} characters.")
    return path


def refuse_link(path: str, target: str, *, hard: bool = False) -> ArchiveError:
    kind = "hard link" if hard else "symlink"
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target)) if target else ""
    if not target or target.startswith("/") or resolved == ".." or resolved.startswith("../"):
        return ArchiveError(f"{path!r}: refused: a {kind} pointing outside the skill ({target!r}).")
    return ArchiveError(
        f"{path!r}: refused: {kind}s are not imported (it points to {target!r} inside the skill); "
        "replace it with a copy of the file."
    )


def refuse_special(path: str, file_type: int) -> ArchiveError:
    kinds = {
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFIFO: "a FIFO (named pipe)",
        stat.S_IFSOCK: "a socket",
    }
    kind = kinds.get(file_type, "a special file")
    return ArchiveError(f"{path!r}: refused: {kind}; only regular files and folders are imported.")


def file_mode(raw_mode: int, head: bytes) -> int:
    """Permission and special bits as archived (`session_mode` removes the special ones and
    names the change); a default when the archive has none."""
    mode = raw_mode & (PERMISSION_BITS | SPECIAL_BITS)
    if mode & PERMISSION_BITS == 0:
        # Archives made on Windows carry no Unix mode: executable when it looks like a script.
        return 0o755 if head.startswith(b"#!") else 0o644
    return mode


def chunks_of(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK_BYTES):
        yield chunk


def with_mode(entry: SkillEntry, raw_mode: int) -> SkillEntry:
    return replace(entry, mode=file_mode(raw_mode, entry.head))


# --- Limits ------------------------------------------------------------------------------


def check_archive_size(size: int, limits: Limits) -> None:
    if size > limits.archive_bytes:
        raise ArchiveError(
            f"The archive is {human_size(size)}; the limit is {human_size(limits.archive_bytes)} "
            "(skills.archive_max_bytes)."
        )


def check_file_count(count: int, limits: Limits) -> None:
    if count > limits.max_files:
        raise ArchiveError(f"The skill has more than {limits.max_files} files (skills.max_files); refused.")


def check_total(total: int, limits: Limits) -> None:
    if total > limits.uncompressed_bytes:
        raise ArchiveError(
            f"The skill unpacks to more than {human_size(limits.uncompressed_bytes)} "
            "(skills.max_uncompressed_bytes); refused as a possible compression bomb."
        )


def check_entry_count(count: int, limits: Limits) -> None:
    most = limits.max_files * ENTRIES_PER_FILE
    if count > most:
        raise ArchiveError(
            f"The archive has more than {most} entries (files, folders and left-out packaging files; "
            f"{ENTRIES_PER_FILE} per file of skills.max_files); refused."
        )


def check_ratio(name: str, uncompressed: int, compressed: int, limits: Limits) -> None:
    if uncompressed < RATIO_CHECK_MIN_BYTES:
        return
    ratio = uncompressed / max(compressed, 1)
    if ratio > limits.compression_ratio:
        raise ArchiveError(
            f"{name!r}: refused: it compresses {ratio:.0f}:1, over the limit of {limits.compression_ratio}:1 "
            "(skills.max_compression_ratio) that protects against compression bombs."
        )


# --- Archives ----------------------------------------------------------------------------


def read_archive(fileobj: IO[bytes], filename: str, limits: Limits) -> ExtractedSkill:
    """Read a .zip/.skill or a tar (plain, gz, bz2, xz) upload. Raises ArchiveError."""
    check_controls(posixpath.basename(filename.replace("\\", "/")))
    size = _stream_size(fileobj)
    check_archive_size(size, limits)
    fileobj.seek(0)
    spool = Spool()
    try:
        if zipfile.is_zipfile(fileobj):
            fileobj.seek(0)
            entries, dropped = _read_zip(fileobj, spool, limits)
        else:
            fileobj.seek(0)
            entries, dropped = _read_tar(fileobj, size, spool, limits)
        return locate_skill(entries, archive_stem(filename), dropped)
    except BaseException:
        spool.close()
        raise


def _stream_size(fileobj: IO[bytes]) -> int:
    fileobj.seek(0, io.SEEK_END)
    return fileobj.tell()


def archive_stem(filename: str) -> str:
    base = posixpath.basename(filename.replace("\\", "/"))
    for suffix in ARCHIVE_SUFFIXES:
        if base.lower().endswith(suffix):
            return base[: -len(suffix)] or "skill"
    return base or "skill"


def _read_zip(fileobj: IO[bytes], spool: Spool, limits: Limits) -> tuple[list[SkillEntry], int]:
    try:
        with zipfile.ZipFile(fileobj) as archive:
            infos = archive.infolist()
            wanted: list[tuple[zipfile.ZipInfo, str]] = []
            dropped = 0
            for info in infos:
                if not info.filename:  # zipfile's is_dir() and open() fail on it
                    raise ArchiveError("The zip holds an entry without a name; refused.")
                path = clean_member_path(zip_name(info))
                if is_leftover(path):
                    dropped += 0 if info.is_dir() else 1
                elif not info.is_dir() and path:
                    wanted.append((info, path))
            check_file_count(len(wanted), limits)
            check_total(sum(info.file_size for info, _ in wanted), limits)
            entries = [entry for info, path in wanted if (entry := _zip_entry(archive, info, path, spool, limits))]
            return entries, dropped
    except ArchiveError:
        raise
    except UnicodeDecodeError as exc:
        # A name flagged UTF-8 (bit 11) that is not: zipfile fails while reading the directory.
        raw = bytes(exc.object) if isinstance(exc.object, bytes | bytearray) else b""
        name = raw.decode("utf-8", "backslashreplace")
        raise ArchiveError(
            f"'{name}': refused: the name is not valid UTF-8; rename the file (skills keep UTF-8 names)."
        ) from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, RuntimeError, ValueError) as exc:
        raise ArchiveError(f"The zip archive is damaged or uses an unsupported feature ({exc}).") from None


def zip_name(info: zipfile.ZipInfo) -> str:
    """The entry's name as UTF-8; names without the UTF-8 flag are read as UTF-8 when they are.

    zipfile decodes unflagged names as cp437, which never fails: the raw bytes come back by
    encoding to cp437, and bytes that are not UTF-8 are refused (surrogate-escaped here so
    `clean_member_path` names them)."""
    if info.flag_bits & 0x800 or info.filename.isascii():
        return info.filename
    raw = info.filename.encode("cp437")
    return raw.decode("utf-8", "surrogateescape")


def _zip_entry(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str, spool: Spool, limits: Limits
) -> SkillEntry | None:
    # Unix tools keep st_mode in the high 16 bits; Windows tools leave them 0 (see file_mode).
    raw_mode = info.external_attr >> 16
    file_type = stat.S_IFMT(raw_mode)
    if file_type == stat.S_IFDIR:
        return None
    if info.flag_bits & 0x1:
        raise ArchiveError(f"{path!r}: refused: encrypted entries are not supported.")
    if file_type == stat.S_IFLNK:
        with archive.open(info) as member:
            target = member.read(SYMLINK_TARGET_MAX).decode("utf-8", "replace")
        raise refuse_link(path, target)
    if file_type not in (0, stat.S_IFREG):
        raise refuse_special(path, file_type)
    check_ratio(path, info.file_size, info.compress_size, limits)
    with archive.open(info) as member:
        entry = spool.add(path, 0, chunks_of(member), declared=info.file_size)
    return with_mode(entry, raw_mode)


def _read_tar(fileobj: IO[bytes], archive_size: int, spool: Spool, limits: Limits) -> tuple[list[SkillEntry], int]:
    try:
        with tarfile.open(fileobj=fileobj, mode="r:*") as archive:
            return _tar_entries(archive, archive_size, spool, limits)
    except ArchiveError:
        raise
    except tarfile.ReadError:
        raise ArchiveError("This is not a zip, .skill or tar archive.") from None
    except (tarfile.TarError, zlib.error, lzma.LZMAError, EOFError, OSError, ValueError) as exc:
        raise ArchiveError(f"The tar archive is damaged ({exc}).") from None


def _tar_entries(
    archive: tarfile.TarFile, archive_size: int, spool: Spool, limits: Limits
) -> tuple[list[SkillEntry], int]:
    entries: list[SkillEntry] = []
    count = total = dropped = seen = streamed = 0
    # `next()` reads one header at a time, so limits are checked before any data is read or
    # skipped; the members list tarfile keeps is emptied so memory does not grow with entries.
    while (member := archive.next()) is not None:
        archive.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every header read here
        seen += 1
        check_entry_count(seen, limits)
        # Every member's bytes are decompressed, kept or skipped (tarfile skips a file's data and
        # an unknown type's alike): the ratio covers them all. Other types declare size 0.
        streamed += member.size
        path = clean_member_path(member.name)
        if is_leftover(path):
            dropped += 0 if member.isdir() else 1
            check_ratio("the archive", streamed, archive_size, limits)
            continue
        if member.isdir() or not path:
            continue
        count += 1
        check_file_count(count, limits)
        if member.issym() or member.islnk():
            raise refuse_link(path, member.linkname, hard=member.islnk())
        if not member.isreg():
            raise refuse_special(path, _tar_file_type(member))
        total += member.size
        check_total(total, limits)
        check_ratio("the archive", streamed, archive_size, limits)
        extracted = archive.extractfile(member)
        stream = chunks_of(extracted) if extracted is not None else iter(())
        entries.append(with_mode(spool.add(path, 0, stream, declared=member.size), member.mode))
    # A compressed tar has no per-entry sizes, so the ratio is checked for the whole stream
    # (as it grows, above, so a bomb in a left-out folder is not decompressed to the end).
    return entries, dropped


def _tar_file_type(member: tarfile.TarInfo) -> int:
    if member.ischr():
        return stat.S_IFCHR
    if member.isblk():
        return stat.S_IFBLK
    if member.isfifo():
        return stat.S_IFIFO
    return 0


# --- Folders on the server ---------------------------------------------------------------


def read_folder(folder: str | os.PathLike[str], limits: Limits) -> ExtractedSkill:
    """Read a skill folder on this server (the folder holds SKILL.md). Raises ArchiveError."""
    root = Path(folder).resolve()
    if not root.is_dir():
        raise ArchiveError(f"'{shown(str(folder))}' is not a folder.")
    check_name(root.name)
    spool = Spool()
    try:
        entries, dropped = _folder_entries(root, spool, limits)
        return finish_skill(root.name, entries, [], dropped)
    except OSError as exc:
        spool.close()
        # An unreadable file or folder refuses the import rather than leaving it out silently.
        where = shown(str(exc.filename)) if exc.filename else shown(str(folder))
        raise ArchiveError(f"Cannot read {where}: {exc.strerror or exc}.") from None
    except BaseException:
        spool.close()
        raise


def _raise(error: OSError) -> None:
    raise error


def _folder_entries(root: Path, spool: Spool, limits: Limits) -> tuple[list[SkillEntry], int]:
    entries: list[SkillEntry] = []
    total = dropped = 0
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        here = Path(dirpath).relative_to(root).as_posix()
        # Leftover folders are not walked: they may be large and hold links (node_modules/.bin).
        for name in [d for d in dirnames if is_leftover(f"{here}/{d}/x" if here != "." else f"{d}/x")]:
            dirnames.remove(name)
            leftover = Path(dirpath) / name
            # os.walk follows its top even when it is a symlink (`node_modules -> /`): a link is one
            # leftover, never walked.
            dropped += 1 if leftover.is_symlink() else sum(len(files) for _, _, files in os.walk(leftover))
        for name in sorted(dirnames) + sorted(filenames):
            full = Path(dirpath) / name
            relative = clean_member_path(full.relative_to(root).as_posix())
            if is_junk(relative):
                dropped += 1
                continue
            info = full.lstat()
            if stat.S_ISLNK(info.st_mode):
                raise refuse_link(relative, os.readlink(full))
            if stat.S_ISDIR(info.st_mode):
                continue
            if not stat.S_ISREG(info.st_mode):
                raise refuse_special(relative, stat.S_IFMT(info.st_mode))
            check_file_count(len(entries) + 1, limits)
            total += info.st_size
            check_total(total, limits)
            with full.open("rb") as handle:
                entry = spool.add(relative, 0, chunks_of(handle), declared=info.st_size)
            entries.append(with_mode(entry, info.st_mode))
    return entries, dropped


# --- Shape of the skill ------------------------------------------------------------------


def locate_skill(entries: list[SkillEntry], fallback_folder: str, dropped: int = 0) -> ExtractedSkill:
    """Find SKILL.md at the root or in one top-level folder (the .skill shape) and strip it."""
    paths = {entry.path for entry in entries}
    if "SKILL.md" in paths:
        note = Issue(
            Severity.WARNING,
            f"SKILL.md is at the archive root, not in a folder; the folder name is taken from the file name "
            f"({fallback_folder!r}).",
        )
        return finish_skill(fallback_folder, entries, [note], dropped)
    tops = {entry.path.split("/", 1)[0] for entry in entries}
    if len(tops) == 1:
        top = tops.pop()
        if f"{top}/SKILL.md" in paths:
            stripped = [replace(e, path=e.path[len(top) + 1 :]) for e in entries if "/" in e.path]
            return finish_skill(top, stripped, [], dropped)
    raise ArchiveError("No SKILL.md found: put it at the archive root or inside one top-level folder.")


def finish_skill(folder_name: str, entries: list[SkillEntry], notes: list[Issue], dropped: int = 0) -> ExtractedSkill:
    check_name(folder_name)
    kept = [entry for entry in entries if not is_junk(entry.path)]
    kept, changed = normalise_modes(kept)
    dropped += len(entries) - len(kept)
    if dropped:
        notes.append(
            Issue(
                Severity.INFO,
                f"Left out {dropped} packaging leftover(s) (__pycache__, node_modules, .git, *.pyc, .DS_Store, "
                "evals/, __MACOSX).",
            )
        )
    _refuse_duplicates(kept)
    if not any(entry.path == "SKILL.md" for entry in kept):
        raise ArchiveError("No SKILL.md found at the root of the skill folder.")
    kept.sort(key=lambda entry: entry.path)
    if changed:
        notes.append(Issue(Severity.WARNING, modes_changed_message(sorted(changed))))
    notes.extend(script_notes(kept))
    return ExtractedSkill(folder_name=folder_name, files=kept, notes=notes)


# --- Modes and scripts -------------------------------------------------------------------

# Named one by one in the warning up to this many; the rest are counted.
NAMED_CHANGES_MAX = 20


def session_mode(mode: int) -> int:
    """`mode` readable by all, and executable by all when any exec bit is set; never setuid,
    setgid, sticky or writable by others.

    Installed skills belong to root, so the session user (uid 1000) reads them through the
    "other" bits: a 0600 SKILL.md (what Python's `zipfile.writestr` gives) would be unreadable,
    and a 0666 one would be rewritable by every session user. (Group write is left: the group
    is root's.)
    """
    mode = (mode & PERMISSION_BITS & ~0o002) | 0o444
    if mode & 0o111:
        mode |= 0o111
    return mode


def normalise_modes(entries: list[SkillEntry]) -> tuple[list[SkillEntry], list[tuple[str, int, int]]]:
    """The entries with session-readable modes, and (path, old, new) for each change."""
    result: list[SkillEntry] = []
    changed: list[tuple[str, int, int]] = []
    for entry in entries:
        mode = session_mode(entry.mode)
        if mode != entry.mode:
            changed.append((entry.path, entry.mode, mode))
            entry = replace(entry, mode=mode)
        result.append(entry)
    return result, changed


def modes_changed_message(changed: list[tuple[str, int, int]]) -> str:
    named = ", ".join(f"{path} {old:04o}→{new:04o}" for path, old, new in changed[:NAMED_CHANGES_MAX])
    more = f" and {len(changed) - NAMED_CHANGES_MAX} more" if len(changed) > NAMED_CHANGES_MAX else ""
    return (
        f"Modes of {len(changed)} file(s) changed so the session user can read them and not change them "
        f"(exec bits kept; setuid, setgid, sticky and world write removed): {named}{more}."
    )


def runner_for(path: str) -> str:
    if path.endswith(".py"):
        return "python3"
    if path.endswith(".sh"):
        return "bash"
    if path.endswith((".js", ".mjs", ".cjs")):
        return "node"
    return "its interpreter"


def script_notes(entries: list[SkillEntry]) -> list[Issue]:
    """What the install's checks would only log: executables without `#!`, broken `#!` lines."""
    notes: list[Issue] = []
    for entry in entries:
        head = entry.head
        executable = bool(entry.mode & 0o111)
        first = head.split(b"\n", 1)[0] if head.startswith(b"#!") else b""
        if executable and not first:
            notes.append(
                Issue(
                    Severity.WARNING,
                    f"{entry.path} is executable but has no #! line: run it with {runner_for(entry.path)}, "
                    f"not as ./{entry.path}.",
                )
            )
        elif first.endswith(b"\r"):
            notes.append(
                Issue(
                    Severity.WARNING,
                    f"{entry.path}: its #! line ends with a carriage return (Windows line ending); "
                    f"./{entry.path} fails with 'bad interpreter'.",
                )
            )
        elif first and not executable and entry.path.startswith("scripts/"):
            notes.append(
                Issue(
                    Severity.INFO,
                    f"{entry.path} has a #! line but is not executable: run it with {runner_for(entry.path)}.",
                )
            )
    return notes


def is_leftover(path: str) -> bool:
    """Junk wherever the skill's root turns out to be: checked before counting or reading.

    (`evals/` is only junk at the skill root, so it is left to `is_junk` once the root is known.)"""
    parts = path.split("/")
    if parts[0] in ARCHIVE_ROOT_JUNK:
        return True
    if any(part in JUNK_DIRS_ANY_DEPTH for part in parts[:-1]):
        return True
    return parts[-1] in JUNK_FILES or parts[-1].endswith(".pyc")


def is_junk(path: str) -> bool:
    parts = path.split("/")
    if parts[0] in JUNK_DIRS_AT_ROOT and len(parts) > 1:
        return True
    if any(part in JUNK_DIRS_ANY_DEPTH for part in parts[:-1]):
        return True
    return parts[-1] in JUNK_FILES or parts[-1].endswith(".pyc")


def _refuse_duplicates(entries: list[SkillEntry]) -> None:
    seen: set[str] = set()
    for entry in entries:
        key = same_key(entry.path)  # one name in two Unicode forms (NFC, NFD) is one name
        if key in seen:
            raise ArchiveError(f"{entry.path!r}: refused: the path appears twice in the archive.")
        seen.add(key)
    for path in seen:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in seen:
                raise ArchiveError(f"{'/'.join(parts[:depth])!r}: refused: it is both a file and a folder.")
