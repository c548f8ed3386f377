"""A new Docker sandbox's /workspace laid out before it starts: no process run inside it.

The engine's archive API works on a created container that has not started, its binds and
volumes mounted as they will be: each path is looked at (`HEAD …/archive`: type, mode, time)
and one archive of folder entries is written with `noOverwriteDirNonDir`, so the engine sets
each folder's owner and mode on the folder itself (never through a link: a link or file where
a folder belongs makes the engine refuse the whole archive). Modes and times a folder already
has are written back unchanged; only owners (and a folder the layout gives a mode) change.

Anything unusual — /workspace missing or not a folder, a link or file in a folder's place, an
engine that refuses — leaves the layout to the caller (`SandboxInfo.workspace_ready` false),
which lays it out in the running sandbox as before.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
import posixpath
import tarfile
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..base import WORKSPACE, RemoteError, WorkspaceLayout
from .common import _engine_call, _parse_time

if TYPE_CHECKING:
    import docker

logger = logging.getLogger(__name__)

# Go's os.FileMode bits, as the engine reports a path's mode.
_GO_DIR = 1 << 31
_GO_SYMLINK = 1 << 27
_GO_SPECIAL = ((1 << 23, 0o4000), (1 << 22, 0o2000), (1 << 20, 0o1000))  # setuid, setgid, sticky


@dataclass(frozen=True)
class PathStat:
    is_dir: bool
    mode: int  # Unix permission bits, with setuid/setgid/sticky
    mtime: datetime | None


def stat_path(api: docker.APIClient, container_id: str, path: str) -> PathStat | None:
    """What the engine says is at `path` in the container (not following a last link), or
    None when nothing is."""
    with _engine_call(f"looking at {path}"):
        response = api.head(api._url("/containers/{0}/archive", container_id), params={"path": path})
    if response.status_code == 404:
        return None
    with _engine_call(f"looking at {path}"):
        api._raise_for_status(response)
    try:
        found: dict[str, Any] = json.loads(base64.b64decode(response.headers["X-Docker-Container-Path-Stat"]))
        go_mode = int(found["mode"])
    except (KeyError, ValueError, TypeError, binascii.Error):
        return PathStat(is_dir=False, mode=0, mtime=None)  # unreadable: treated as in the way
    mode = go_mode & 0o777
    for bit, unix in _GO_SPECIAL:
        if go_mode & bit:
            mode |= unix
    is_dir = bool(go_mode & _GO_DIR) and not go_mode & _GO_SYMLINK and not found.get("linkTarget")
    return PathStat(is_dir=is_dir, mode=mode, mtime=_parse_time(str(found.get("mtime") or "")))


def lay_out(api: docker.APIClient, container_id: str, layout: WorkspaceLayout) -> bool:
    """Lay /workspace out in the created, not yet started container; False: left to the
    caller (see the module's note)."""
    entries: list[tuple[str, int, PathStat | None, int]] = []  # (path, owner, found, mode when made)
    try:
        top = stat_path(api, container_id, WORKSPACE)
        if top is None or not top.is_dir:
            return False
        entries.append((WORKSPACE, layout.owner_uid, top, top.mode))
        for folder in layout.folders:
            path = posixpath.join(WORKSPACE, folder.name)
            found = stat_path(api, container_id, path)
            if found is not None and not found.is_dir:
                return False  # a link or file the user left: the in-sandbox layout moves it aside
            entries.append((path, folder.owner_uid, found, 0o755 if folder.mode is None else folder.mode))
        with _engine_call("laying out /workspace"):
            response = api._put(
                api._url("/containers/{0}/archive", container_id),
                params={"path": "/", "noOverwriteDirNonDir": "1"},
                data=_archive(entries, layout),
            )
            api._raise_for_status(response)
    except RemoteError as exc:
        logger.info(
            "laying out /workspace at create left to the sandbox: %s",
            exc.message,
            extra={"sandbox_id": container_id},
        )
        return False
    return True


def _archive(entries: list[tuple[str, int, PathStat | None, int]], layout: WorkspaceLayout) -> bytes:
    modes = {posixpath.join(WORKSPACE, f.name): f.mode for f in layout.folders if f.mode is not None}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, owner, found, made_mode in entries:
            member = tarfile.TarInfo(path.lstrip("/"))
            member.type = tarfile.DIRTYPE
            member.uid = member.gid = owner
            # A folder the layout gives a mode gets it; otherwise it keeps its own.
            member.mode = modes.get(path, found.mode if found is not None else made_mode)
            if found is not None and found.mtime is not None:
                member.mtime = found.mtime.timestamp()  # kept: the engine sets what the entry says
            else:
                member.mtime = datetime.now().timestamp()
            tar.addfile(member)
    return buffer.getvalue()
