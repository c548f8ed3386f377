"""Files of an E2B sandbox through envd's filesystem RPCs and its HTTP upload/download."""

from __future__ import annotations

import builtins
import posixpath
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import httpx

from ..base import ErrorKind, ExecRequest, FileInfo, RemoteError
from ..capabilities import FilesCapability
from .common import parse_time, status_error, translating, transport_error

if TYPE_CHECKING:
    from .backend import E2BBackend


# ---------------------------------------------------------------------------------------
# Files


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise RemoteError(ErrorKind.INVALID, f"{path!r}: paths must be absolute")
    return posixpath.normpath(path)


def file_info(entry: Mapping[str, Any]) -> FileInfo:
    """An envd EntryInfo (filesystem.proto) as a FileInfo."""
    kind = str(entry.get("type") or "")
    mode = int(entry.get("mode") or 0)
    return FileInfo(
        path=str(entry.get("path") or ""),
        name=str(entry.get("name") or ""),
        is_dir=kind == "FILE_TYPE_DIRECTORY",
        size=int(entry.get("size") or 0),
        mode=mode & 0o7777,  # drop Go's type bits (os.ModeDir is 1 << 31)
        is_symlink=kind == "FILE_TYPE_SYMLINK" or bool(entry.get("symlinkTarget")),
        modified=parse_time(entry.get("modifiedTime")),
    )


def _read_capped(response: httpx.Response, max_bytes: int | None) -> bytes:
    if max_bytes is None:
        return response.read()
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


class E2BFiles(FilesCapability):
    """envd `/files` for content (multipart upload, streamed download) and
    `filesystem.Filesystem` for metadata. Modes are set with chmod after upload (envd's
    upload has no mode parameter)."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def write(
        self, sandbox_id: str, path: str, data: bytes, *, mode: int | None = None, user: str = "user"
    ) -> FileInfo:
        path = _absolute(path)
        self.backend._upload(sandbox_id, path, data, user=user)
        if mode is not None:
            result = self.backend.exec(
                sandbox_id, ExecRequest(argv=("chmod", format(mode & 0o7777, "o"), path), user=user)
            )
            if result.exit_code != 0:
                raise RemoteError(ErrorKind.INVALID, f"chmod {path}: {result.stderr.decode(errors='replace')}")
        return self.stat(sandbox_id, path)

    def read(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        path = _absolute(path)
        backend = self.backend
        url = backend.envd_url(sandbox_id) + "/files"
        what = f"reading {path} in sandbox {sandbox_id}"
        attempt = 0
        while True:
            headers = backend._envd_headers(sandbox_id, "root")
            try:
                with backend.http.stream(
                    "GET", url, headers=headers, params={"path": path, "username": "root"}
                ) as response:
                    if response.status_code < 300:
                        return _read_capped(response, max_bytes)
                    response.read()
                    error = backend._envd_failure(sandbox_id, status_error(response, what))
            except RemoteError:
                raise
            except Exception as exc:
                raise transport_error(exc, what) from exc
            # A read is idempotent: retry what the proxy says is passing (Cube's 503).
            if error.kind not in (ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE) or attempt >= backend.retries:
                raise error
            attempt += 1
            backend.sleep(backend._backoff(attempt, error.retry_after))

    def list(self, sandbox_id: str, path: str) -> builtins.list[FileInfo]:
        path = _absolute(path)
        answer = self.backend.rpc(
            sandbox_id, "filesystem.Filesystem/ListDir", {"path": path, "depth": 1}, f"listing {path}"
        )
        return sorted((file_info(entry) for entry in answer.get("entries") or []), key=lambda info: info.name)

    def make_dir(self, sandbox_id: str, path: str, *, user: str = "user") -> None:
        path = _absolute(path)
        try:
            self.backend.rpc(sandbox_id, "filesystem.Filesystem/MakeDir", {"path": path}, f"creating {path}", user=user)
        except RemoteError as exc:
            if exc.kind != ErrorKind.CONFLICT:  # already_exists: fine
                raise

    def remove(self, sandbox_id: str, path: str) -> None:
        path = _absolute(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "refusing to remove /")
        try:
            self.backend.rpc(sandbox_id, "filesystem.Filesystem/Remove", {"path": path}, f"removing {path}")
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise

    def stat(self, sandbox_id: str, path: str) -> FileInfo:
        path = _absolute(path)
        answer = self.backend.rpc(sandbox_id, "filesystem.Filesystem/Stat", {"path": path}, f"stat {path}")
        return file_info(answer.get("entry") or {})


translating(E2BFiles, "write", "read", "list", "make_dir", "remove", "stat")
