"""Files of a sandbox's pod, through `exec` (`KubernetesFiles`): the pods/exec channels are
binary, so content goes as it is, on stdin (writes) and stdout (reads); metadata comes from
GNU find's `-printf`, one NUL-ended record per entry (names may hold any byte but NUL).

Paths are absolute and NUL-free, normalised (`/a/./b/` is `/a/b`); `/` is never written or
removed. Writes and new folders are made as the caller's user (its permissions hold); reads,
listings and removals run as root, as the Docker adapter's do. Keeping the session's file
operations inside /workspace is the session layer's (`sessions/workspace.py`).

May import: the contract.
"""

from __future__ import annotations

import builtins
import posixpath
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NoReturn

from ..base import ErrorKind, ExecRequest, ExecResult, FileInfo, RemoteError
from ..capabilities import FilesCapability

Run = Callable[[str, ExecRequest], ExecResult]

# One entry: type, permission bits (octal), size, mtime, path.
_FORMAT = r"%y\t%m\t%s\t%T@\t%p\0"
# $1 path; exit 2: missing, 3: not a directory.
_STAT = '[ -e "$1" ] || [ -L "$1" ] || exit 2; find "$1" -maxdepth 0 -printf "$2"'
_LIST = '[ -e "$1" ] || [ -L "$1" ] || exit 2; [ -d "$1" ] || exit 3; find "$1" -mindepth 1 -maxdepth 1 -printf "$2"'
# $1 path, $2 byte limit ("" = all); exit 2: missing, 3: a directory, 4: not a regular file.
_READ = (
    '[ -e "$1" ] || exit 2; [ -d "$1" ] && exit 3; [ -f "$1" ] || exit 4; '
    'if [ -n "$2" ]; then head -c "$2" -- "$1"; else cat -- "$1"; fi'
)
# $1 path, $2 mode (octal); the content on stdin.
_WRITE = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"'
_REMOVE = 'test -e "$1" || test -L "$1" || exit 2; rm -rf -- "$1"'
_UNLIMITED = 1 << 62
# Seconds per MiB moved, on top of the base deadline.
_BASE_TIMEOUT_S = 60.0
_PER_MIB_S = 1.0


def check_path(path: str) -> str:
    """Absolute, NUL-free paths only; returned normalised ("/a/./b/" -> "/a/b")."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise RemoteError(ErrorKind.INVALID, f"path must be absolute: {path!r}")
    return "/" + posixpath.normpath(path).lstrip("/")


def _deadline(size: int) -> float:
    return _BASE_TIMEOUT_S + _PER_MIB_S * size / (1024 * 1024)


def _fail(result: ExecResult, what: str) -> NoReturn:
    text = result.stderr.decode(errors="replace").strip()
    if "Permission denied" in text or "Operation not permitted" in text:
        raise RemoteError(ErrorKind.FORBIDDEN, f"{what}: permission denied")
    if result.exit_code == 2 or "No such file" in text:
        raise RemoteError(ErrorKind.NOT_FOUND, f"{what}: no such file or directory")
    if result.exit_code == 3 or "Not a directory" in text:
        raise RemoteError(ErrorKind.INVALID, f"{what}: not a directory")
    if result.timed_out:
        raise RemoteError(ErrorKind.TIMEOUT, f"{what}: the sandbox did not finish in time")
    raise RemoteError(ErrorKind.INVALID, f"{what}: {text[:500] or f'exit code {result.exit_code}'}")


def parse_entries(output: bytes) -> builtins.list[FileInfo]:
    entries = []
    for record in output.split(b"\0"):
        if not record:
            continue
        kind, mode, size, mtime, raw_path = record.split(b"\t", 4)
        path = raw_path.decode(errors="surrogateescape")
        entries.append(
            FileInfo(
                path=path,
                name=posixpath.basename(path.rstrip("/")) or "/",
                is_dir=kind == b"d",
                size=int(size),
                mode=int(mode, 8) & 0o7777,
                is_symlink=kind == b"l",
                modified=datetime.fromtimestamp(float(mtime), UTC),
            )
        )
    return entries


class KubernetesFiles(FilesCapability):
    """Files through `run` (the backend's `exec`)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def _checked(self, sandbox_id: str, request: ExecRequest, what: str) -> bytes:
        result = self.run(sandbox_id, request)
        if result.exit_code != 0 or result.timed_out:
            _fail(result, what)
        return result.stdout

    def write(
        self, sandbox_id: str, path: str, data: bytes, *, mode: int | None = None, user: str = "user"
    ) -> FileInfo:
        path = check_path(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "cannot write to /")
        bits = (mode if mode is not None else 0o644) & 0o7777
        request = ExecRequest(
            argv=("/bin/sh", "-c", _WRITE, "sh", path, format(bits, "o")),
            stdin=data,
            user=user,
            cwd="/",
            timeout_s=_deadline(len(data)),
        )
        self._checked(sandbox_id, request, f"write {path}")
        return FileInfo(
            path=path,
            name=posixpath.basename(path),
            is_dir=False,
            size=len(data),
            mode=bits,
            modified=datetime.now(UTC),
        )

    def read(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """The file's bytes; with max_bytes, at most that many from the start."""
        path = check_path(path)
        limit = "" if max_bytes is None else str(max(max_bytes, 0))
        request = ExecRequest(
            argv=("/bin/sh", "-c", _READ, "sh", path, limit),
            user="root",
            cwd="/",
            timeout_s=_deadline(max_bytes or 0) * 10,
            max_output_bytes=_UNLIMITED if max_bytes is None else max(max_bytes, 1),
        )
        result = self.run(sandbox_id, request)
        if result.exit_code == 3:
            raise RemoteError(ErrorKind.INVALID, f"{path} is a directory")
        if result.exit_code == 4:
            raise RemoteError(ErrorKind.INVALID, f"{path} is not a regular file")
        if result.exit_code != 0 or result.timed_out:
            _fail(result, f"read {path}")
        return result.stdout

    def list(self, sandbox_id: str, path: str) -> builtins.list[FileInfo]:
        path = check_path(path)
        request = ExecRequest(argv=("/bin/sh", "-c", _LIST, "sh", path, _FORMAT), user="root", cwd="/")
        entries = parse_entries(self._checked(sandbox_id, request, f"list {path}"))
        return sorted(entries, key=lambda entry: entry.name)

    def stat(self, sandbox_id: str, path: str) -> FileInfo:
        path = check_path(path)
        request = ExecRequest(argv=("/bin/sh", "-c", _STAT, "sh", path, _FORMAT), user="root", cwd="/")
        entries = parse_entries(self._checked(sandbox_id, request, f"stat {path}"))
        if not entries:
            raise RemoteError(ErrorKind.NOT_FOUND, f"stat {path}: no such file or directory")
        return entries[0]

    def make_dir(self, sandbox_id: str, path: str, *, user: str = "user") -> None:
        path = check_path(path)
        request = ExecRequest(argv=("mkdir", "-p", "--", path), user=user, cwd="/")
        self._checked(sandbox_id, request, f"make_dir {path}")

    def remove(self, sandbox_id: str, path: str) -> None:
        """Remove a file or a directory tree; a missing path is not_found."""
        path = check_path(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "refusing to remove /")
        request = ExecRequest(argv=("/bin/sh", "-c", _REMOVE, "sh", path), user="root", cwd="/")
        self._checked(sandbox_id, request, f"remove {path}")
