"""Files of a Docker sandbox: writes through the engine's archive API, reads and listings
through small probes run in the sandbox.
"""

from __future__ import annotations

import builtins
import io
import json
import posixpath
import tarfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, FileInfo, RemoteError
from ..capabilities import FilesCapability
from .common import _FS_PROBE, _check_path, _engine_call
from .exec import DockerExec

if TYPE_CHECKING:
    from .engine import DockerEngine


# ---------------------------------------------------------------------------------------
# Files


class DockerFiles(FilesCapability):
    """Files through the engine's archive API (writes) and small probes run in the sandbox."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def write(
        self,
        sandbox_id: str,
        path: str,
        data: bytes,
        *,
        mode: int | None = None,
        user: str = "user",
    ) -> FileInfo:
        path = _check_path(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "cannot write to /")
        container_id = self.engine.container_id(sandbox_id)
        uid, _ = DockerExec._exec_user(user)
        parent, name = posixpath.split(path)
        archive = self._tar_one_file(name, data, mode if mode is not None else 0o644, uid)
        try:
            self._put(container_id, parent, archive)
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
            self.make_dir(container_id, parent, user=user)
            self._put(container_id, parent, archive)
        return FileInfo(
            path=path,
            name=name,
            is_dir=False,
            size=len(data),
            mode=(mode if mode is not None else 0o644) & 0o7777,
            modified=datetime.now(UTC),
        )

    @staticmethod
    def _tar_one_file(name: str, data: bytes, mode: int, uid: int) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode = mode & 0o7777
            member.uid = member.gid = uid
            member.mtime = int(time.time())
            tar.addfile(member, io.BytesIO(data))
        return buffer.getvalue()

    def _put(self, container_id: str, directory: str, archive: bytes) -> None:
        with _engine_call(f"writing into {directory}"):
            self.engine.api.put_archive(container_id, directory, archive)

    def read(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """The file's bytes; with max_bytes, at most that many from the start."""
        path = _check_path(path)
        container_id = self.engine.container_id(sandbox_id)
        with _engine_call(f"reading {path}"):
            chunks, stat = self.engine.api.get_archive(container_id, path)
        if stat.get("mode", 0) & (1 << 31):  # Go's os.ModeDir
            raise RemoteError(ErrorKind.INVALID, f"{path} is a directory")
        with (
            _engine_call(f"reading {path}"),
            tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar,
        ):
            for member in tar:
                if not member.isfile():
                    raise RemoteError(ErrorKind.INVALID, f"{path} is not a regular file")
                handle = tar.extractfile(member)
                assert handle is not None
                return handle.read(-1 if max_bytes is None else max_bytes)
        raise RemoteError(ErrorKind.NOT_FOUND, f"{path}: no such file")

    def list(self, sandbox_id: str, path: str) -> builtins.list[FileInfo]:
        path = _check_path(path)
        rows = json.loads(self._probe(sandbox_id, "list", path))
        return [FileInfo.from_stat_row(row) for row in rows]

    def stat(self, sandbox_id: str, path: str) -> FileInfo:
        path = _check_path(path)
        return FileInfo.from_stat_row(json.loads(self._probe(sandbox_id, "stat", path)))

    def _probe(self, sandbox_id: str, op: str, path: str) -> bytes:
        container_id = self.engine.container_id(sandbox_id)
        # -I and cwd "/": as root, python must not import modules the session user planted
        # in the working directory (/workspace by default) or name in PYTHON* variables.
        return self.engine.run_checked(container_id, ("python3", "-I", "-c", _FS_PROBE, op, path), f"{op} {path}")

    def make_dir(self, sandbox_id: str, path: str, *, user: str = "user") -> None:
        path = _check_path(path)
        container_id = self.engine.container_id(sandbox_id)
        self.engine.run_checked(container_id, ("mkdir", "-p", "--", path), f"make_dir {path}", user=user)

    def remove(self, sandbox_id: str, path: str) -> None:
        """Remove a file or a directory tree; a missing path is not_found."""
        path = _check_path(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "refusing to remove /")
        container_id = self.engine.container_id(sandbox_id)
        script = 'test -e "$0" || test -L "$0" || exit 2; rm -rf -- "$0"'
        self.engine.run_checked(container_id, ("/bin/sh", "-c", script, path), f"remove {path}")


class _ChunkReader(io.RawIOBase):
    """A file object over docker-py's chunk generator, for streaming tar reads."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self.rest:
            try:
                self.rest = next(self.chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self.rest))
        target[:size] = self.rest[:size]
        self.rest = self.rest[size:]
        return size
