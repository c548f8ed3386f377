"""A session's /workspace: staged attachments, the user's files, and collected artifacts.

Layout: /workspace/input holds attachments written by root, read-only to the session user
(uid 1000); /workspace/output is what `collect_artifacts` copies out to Django storage at
the end of a turn. Paths from callers are always relative to /workspace and never leave it.

Confinement: the text check of `workspace_path` is only the first gate. Every operation runs
inside the sandbox through the contract's exec, with `workspace_helper.py` (sent as source to
the sandbox's python3 in isolated mode): it walks each path from /workspace one component at
a time with O_NOFOLLOW, so links the session user planted (or swaps in mid-call) are refused,
never followed. Everything the user asks for runs as the session user (uid 1000); only
staging into the root-owned input/ runs as root, and the helper checks input/ is still that
folder. The same path serves every backend, since it needs only exec and python3.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction
from django.utils.http import content_disposition_header

from console.models import AuditAction
from console.services import Actor, ServiceError, record_audit

from ..backends.base import WORKSPACE, Backend, ErrorKind, ExecRequest, FileInfo, RemoteError
from ..catalog.bridge import get_backend
from ..models import Artifact, Session
from .inflight import in_flight
from .provisioning import WORKSPACE_HELPER_SOURCE
from .runtime import Runtime
from .tuning import SESSIONS

P = ParamSpec("P")
R = TypeVar("R")

INPUT = f"{WORKSPACE}/input"
OUTPUT = f"{WORKSPACE}/output"

HELPER_SOURCE = WORKSPACE_HELPER_SOURCE
# The helper's exit codes (see its docstring) and how each is told to the caller.
_MISSING, _WRONG_KIND, _LINK, _DENIED, _STAGING, _BAD, _TOO_MANY = 2, 3, 4, 5, 6, 7, 8
_COMMAND_NOT_FOUND = 127
HELPER_TIMEOUT_S = 120.0
_JSON_MAX = 16 << 20
# Linux's PATH_MAX, with its NUL: a longer path cannot be opened, and one past 128 KiB
# cannot even be passed to the helper (the exec fails with E2BIG, an "internal" 502).
PATH_MAX_BYTES = 4095


def workspace_path(relative: str, *, under: str = WORKSPACE) -> str:
    """The absolute path of `relative` inside `under`; ServiceError if it would leave it."""
    if not relative or "\x00" in relative:
        raise ServiceError("Give a path inside the workspace.", field_errors={"path": ["empty or invalid path"]})
    if len(relative.encode(errors="surrogateescape")) > PATH_MAX_BYTES:
        message = f"the path is too long (more than {PATH_MAX_BYTES} bytes)"
        raise ServiceError(f"The path is too long ({PATH_MAX_BYTES} bytes at most).", field_errors={"path": [message]})
    candidate = relative if relative.startswith("/") else posixpath.join(under, relative)
    normalised = posixpath.normpath(candidate)
    if normalised != under and not normalised.startswith(under + "/"):
        raise ServiceError(
            f"{relative!r} leaves {under}.", field_errors={"path": [f"the path must stay inside {under}"]}
        )
    return normalised


def _relative(path: str) -> str:
    return path.removeprefix(WORKSPACE).lstrip("/") or "."


def run_helper(
    backend: Backend,
    sandbox_id: str,
    op: str,
    path: str,
    *extra: str,
    user: str = "user",
    stdin: bytes | None = None,
    max_output_bytes: int = _JSON_MAX,
) -> bytes:
    """Run one confined operation on `path` (absolute, under /workspace); its stdout."""
    request = ExecRequest(
        argv=("python3", "-I", "-c", HELPER_SOURCE, op, _relative(path), *extra),
        user=user,
        cwd="/",
        stdin=stdin,
        timeout_s=HELPER_TIMEOUT_S,
        max_output_bytes=max_output_bytes,
    )
    result = backend.exec(sandbox_id, request)
    if result.timed_out:
        raise RemoteError(ErrorKind.TIMEOUT, f"{op} {path}: no answer from the sandbox in time")
    if result.exit_code == 0:
        if result.truncated:
            raise ServiceError(f"{op} {path}: the answer is larger than {max_output_bytes} bytes.")
        return result.stdout
    message = result.stderr.decode(errors="replace").strip()[:500] or f"exit code {result.exit_code}"
    if result.exit_code == _MISSING:
        raise FileMissing(message, field_errors={"path": [message]})
    if result.exit_code == _COMMAND_NOT_FOUND:
        raise RemoteError(ErrorKind.UNSUPPORTED, "file access needs python3 in the sandbox's template")
    if result.exit_code in (_WRONG_KIND, _LINK, _DENIED, _STAGING, _BAD, _TOO_MANY):
        raise ServiceError(message, field_errors={"path": [message]})
    raise RemoteError(ErrorKind.INTERNAL, f"{op} {path}: {message}")


class FileMissing(ServiceError):
    """The path names nothing in /workspace (the API's 404, never a backend failure)."""


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise RemoteError(ErrorKind.INTERNAL, f"the sandbox's file helper answered no JSON: {data[:200]!r}") from exc


class SandboxNotRunning(ServiceError):
    """A read that may not wake the session (a GET page) found its sandbox not running."""


def _not_running(session: Session) -> SandboxNotRunning:
    return SandboxNotRunning(f"Session {session.key} has no running sandbox; resume it to see its files.")


def _counted(func: Callable[Concatenate[Runtime, Session, P], R]) -> Callable[Concatenate[Runtime, Session, P], R]:
    """Run a file operation counted in flight on its session (sessions/inflight.py): no pause
    freezes the sandbox between its look and its exec, and a stale rebuild waits for it. A
    failure because a DELETE removed the session meanwhile (its sandbox went first: a read
    found none running, an exec failed, the artifacts' rows lost their session) is
    `SessionDeleted`, told once the count is off the row."""

    @functools.wraps(func)
    def counted(runtime: Runtime, session: Session, *args: P.args, **kwargs: P.kwargs) -> R:
        with (
            runtime.telling_deleted(session, SandboxNotRunning),
            in_flight(session, activity=kwargs.get("wake", True) is not False),
        ):
            return func(runtime, session, *args, **kwargs)

    return counted


def _sandbox(runtime: Runtime, session: Session, *, wake: bool = True) -> tuple[Backend, str]:
    """The session's backend and sandbox id. `wake=False` reads only: a paused, missing or
    deleted sandbox is a `SandboxNotRunning`, never created, resumed or rebuilt. Called
    counted in flight (`_counted`): its own count does not hold up a stale rebuild."""
    if not wake:
        info = runtime.running_sandbox(session)
        if info is None:
            raise _not_running(session)
        return get_backend(session.config), info.sandbox_id
    resolved = runtime.resolve_session(session, own_calls=1)
    return get_backend(session.config), resolved.sandbox.sandbox_id


def _read_helper(runtime: Runtime, session: Session, wake: bool, *args: str, **kwargs: Any) -> bytes:
    """Run a read of the file helper. Without `wake`, a sandbox paused or removed between the
    look and the exec (the idle sweep, a Pause, a DELETE) is the same `SandboxNotRunning`,
    whatever the engine called the failed exec (a conflict, a missing container, or an
    internal error for an exec the pause cut short: seen once in 40 under a pause storm)."""
    backend, sandbox_id = _sandbox(runtime, session, wake=wake)
    try:
        return run_helper(backend, sandbox_id, *args, **kwargs)
    except RemoteError as exc:
        # A conflict is an exec the engine refused on a paused container.
        if not wake and (exc.kind == ErrorKind.CONFLICT or runtime.running_sandbox(session) is None):
            raise _not_running(session) from exc
        raise


@_counted
def stage_input(runtime: Runtime, session: Session, name: str, data: bytes, *, actor: Actor) -> FileInfo:
    """Write an attachment into /workspace/input, owned by root and read-only to the user."""
    if len(data) > SESSIONS.workspace_upload_max_bytes:
        raise ServiceError(f"The file is larger than {SESSIONS.workspace_upload_max_bytes} bytes.")
    path = workspace_path(name, under=INPUT)
    if path == INPUT:
        raise ServiceError("Give the attachment a file name.", field_errors={"path": ["a file name is needed"]})
    backend, sandbox_id = _sandbox(runtime, session)
    row = _json(run_helper(backend, sandbox_id, "stage", path, "444", user="root", stdin=data))
    info = FileInfo.from_stat_row(row)
    record_audit(
        actor,
        AuditAction.SESSION_INPUT_UPLOAD,
        space=session.space,
        target_type="session",
        target_id=session.id,
        target_name=session.key,
        details={"path": path, "size": len(data)},
    )
    return info


@_counted
def list_files(runtime: Runtime, session: Session, relative: str = "", *, wake: bool = True) -> list[FileInfo]:
    path = workspace_path(relative or WORKSPACE)
    entries = [FileInfo.from_stat_row(row) for row in _json(_read_helper(runtime, session, wake, "list", path))]
    return sorted(entries, key=lambda e: (not e.is_dir, e.name))


@_counted
def stat_file(runtime: Runtime, session: Session, relative: str) -> FileInfo:
    path = workspace_path(relative)
    backend, sandbox_id = _sandbox(runtime, session)
    return FileInfo.from_stat_row(_json(run_helper(backend, sandbox_id, "stat", path)))


def download_name(path: str) -> str:
    """The file name a download is saved as: the path's last part, with control and format
    characters and lone surrogates escaped (`\\n`, `\\u202e`). Files are named as their makers
    like: a newline cannot go in a header (Django refuses it: a 500), a bidi override misleads."""
    name = path.rsplit("/", 1)[-1] or "file"
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in {"Cc", "Cf", "Zl", "Zp", "Cs"} else c for c in name)


def download_disposition(path: str, *, inline: bool = False) -> str:
    """Content-Disposition for a download (a workspace or skill file), quoted as RFC 6266 has
    it (`download_name`): the one home of a downloaded file's name."""
    return content_disposition_header(not inline, download_name(path)) or "attachment"  # None only without a name


@_counted
def read_file(
    runtime: Runtime, session: Session, relative: str, *, max_bytes: int | None = None, wake: bool = True
) -> bytes:
    path = workspace_path(relative)
    limit = max_bytes or SESSIONS.workspace_read_max_bytes
    data = _read_helper(runtime, session, wake, "read", path, str(limit + 1), max_output_bytes=limit + 1)
    if len(data) > limit:
        raise ServiceError(f"{relative} is larger than {limit} bytes; collect it as an artifact instead.")
    return data


def _audit_file(actor: Actor, session: Session, op: str, details: dict[str, Any]) -> None:
    record_audit(
        actor,
        AuditAction.SESSION_FILE_WRITE,
        space=session.space,
        target_type="session",
        target_id=session.id,
        target_name=session.key,
        details={"op": op, **details},
    )


@_counted
def write_file(runtime: Runtime, session: Session, relative: str, data: bytes, *, actor: Actor) -> FileInfo:
    """Write a file as the session user. /workspace/input stays read-only (staging is apart)."""
    path = workspace_path(relative)
    if path == INPUT or path.startswith(INPUT + "/"):
        raise ServiceError("/workspace/input is read-only; upload attachments to input instead.")
    if len(data) > SESSIONS.workspace_upload_max_bytes:
        raise ServiceError(f"The file is larger than {SESSIONS.workspace_upload_max_bytes} bytes.")
    backend, sandbox_id = _sandbox(runtime, session)
    info = FileInfo.from_stat_row(_json(run_helper(backend, sandbox_id, "write", path, "644", stdin=data)))
    _audit_file(actor, session, "write", {"path": path, "size": len(data)})
    return info


def _writable(relative: str) -> str:
    """The absolute path of `relative`, refused inside the root-owned input/ (staging only)."""
    path = workspace_path(relative)
    if path == INPUT or path.startswith(INPUT + "/"):
        raise ServiceError("/workspace/input is read-only to the session; upload attachments to input instead.")
    return path


@_counted
def delete_path(runtime: Runtime, session: Session, relative: str, *, actor: Actor) -> str:
    """Delete a file, a link or a folder with all it holds, as the session user; links are
    removed, never followed. /workspace, input/ and output/ themselves are kept."""
    path = _writable(relative)
    backend, sandbox_id = _sandbox(runtime, session)
    run_helper(backend, sandbox_id, "delete", path)
    _audit_file(actor, session, "delete", {"path": path})
    return path


@_counted
def rename_path(runtime: Runtime, session: Session, relative: str, target: str, *, actor: Actor) -> FileInfo:
    """Rename (or move) `relative` to `target`, both inside /workspace; an existing target is
    refused, never replaced."""
    path, destination = _writable(relative), _writable(target)
    backend, sandbox_id = _sandbox(runtime, session)
    info = FileInfo.from_stat_row(_json(run_helper(backend, sandbox_id, "rename", path, _relative(destination))))
    _audit_file(actor, session, "rename", {"path": path, "to": destination})
    return info


@_counted
def make_folder(runtime: Runtime, session: Session, relative: str, *, actor: Actor) -> FileInfo:
    path = _writable(relative)
    backend, sandbox_id = _sandbox(runtime, session)
    info = FileInfo.from_stat_row(_json(run_helper(backend, sandbox_id, "mkdir", path)))
    _audit_file(actor, session, "mkdir", {"path": path})
    return info


@dataclass(frozen=True)
class CollectResult:
    collection: uuid.UUID
    artifacts: list[Artifact]
    refused: list[str]


_KIND_WORDS = {
    "l": "symlink",
    "o": "not a file or folder",
    "changed": "replaced by a link while listing",
    "name": "its name is not UTF-8",
}


def private_media_root() -> None:
    """MEDIA_ROOT readable by the console's user only: new folders and files get 0700/0600
    (FILE_UPLOAD_*_PERMISSIONS), and a root an older console made 0755 is closed too."""
    root = Path(settings.MEDIA_ROOT)
    try:
        info = root.stat()
    except FileNotFoundError:
        return  # the storage makes it, 0700
    if info.st_uid == os.getuid() and info.st_mode & 0o077:
        root.chmod(0o700)


@_counted
def collect_artifacts(runtime: Runtime, session: Session, *, actor: Actor) -> CollectResult:
    """Copy /workspace/output out to Django storage (caps, no symlinks, no traversal).

    Listed and read as the session user through the confined helper: a link planted in
    output/, or swapped in between listing and reading, is skipped, never followed.
    """
    backend, sandbox_id = _sandbox(runtime, session)
    rows = _json(run_helper(backend, sandbox_id, "tree", OUTPUT))
    collection = uuid.uuid4()
    refused: list[str] = []
    wanted: list[tuple[str, int]] = []
    for row in rows:
        kind, name, size = str(row["kind"]), str(row["path"]), int(row["size"])
        if kind == "d":
            continue
        if kind != "f":
            refused.append(f"{name}: not a regular file ({_KIND_WORDS.get(kind, kind)}), skipped")
            continue
        if ".." in name.split("/") or name.startswith("/"):
            refused.append(f"{name}: path leaves the output folder, skipped")
            continue
        wanted.append((name, size))
    total = 0
    picked: list[tuple[str, int]] = []
    for name, size in sorted(wanted):
        if len(picked) >= SESSIONS.artifact_max_files:
            refused.append(f"{name}: more than {SESSIONS.artifact_max_files} files, skipped")
        elif size > SESSIONS.artifact_max_file_bytes:
            refused.append(f"{name}: {size} bytes is over the {SESSIONS.artifact_max_file_bytes}-byte cap, skipped")
        elif total + size > SESSIONS.artifact_max_total_bytes:
            refused.append(f"{name}: the collection would pass {SESSIONS.artifact_max_total_bytes} bytes, skipped")
        else:
            picked.append((name, size))
            total += size
    artifacts: list[Artifact] = []
    stored: list[Artifact] = []
    private_media_root()
    try:
        for name, _ in picked:
            cap = SESSIONS.artifact_max_file_bytes + 1
            try:
                data = run_helper(backend, sandbox_id, "read", f"{OUTPUT}/{name}", str(cap), max_output_bytes=cap)
            except (ServiceError, RemoteError) as exc:
                if isinstance(exc, RemoteError) and exc.kind != ErrorKind.NOT_FOUND:
                    raise  # (a file gone since the listing is a FileMissing: skipped)
                refused.append(f"{name}: changed while collecting ({exc}), skipped")
                continue
            if len(data) > SESSIONS.artifact_max_file_bytes:
                refused.append(f"{name}: grew past the cap while collecting, skipped")
                continue
            artifact = Artifact(
                session=session,
                collection=collection,
                path=name,
                size=len(data),
                sha256=hashlib.sha256(data).hexdigest(),
            )
            artifact.file.save(f"{session.id}/{collection}/{name}", ContentFile(data), save=False)
            stored.append(artifact)
        with transaction.atomic():
            Artifact.objects.bulk_create(stored)
            record_audit(
                actor,
                AuditAction.SESSION_COLLECT_ARTIFACTS,
                space=session.space,
                target_type="session",
                target_id=session.id,
                target_name=session.key,
                details={
                    "collection": str(collection),
                    "files": len(stored),
                    "bytes": sum(a.size for a in stored),
                    "refused": refused[:50],
                },
            )
        artifacts = stored
    except Exception:
        for artifact in stored:  # nothing half-collected
            artifact.file.delete(save=False)
        raise
    return CollectResult(collection=collection, artifacts=artifacts, refused=refused)
