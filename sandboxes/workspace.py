"""A session's /workspace: staged attachments, the user's files, and collected artifacts.

Layout: /workspace/input holds attachments written by root, read-only to the session user
(uid 1000); /workspace/output is what `collect_artifacts` copies out to Django storage at
the end of a turn. Paths from callers are always relative to /workspace and never leave it.
"""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from dataclasses import dataclass

from django.conf import settings
from django.core.files.base import ContentFile
from django.db import transaction

from console.services import Actor, ServiceError, record_audit

from .backends.base import WORKSPACE, ErrorKind, ExecRequest, FileInfo, FilesCapability, RemoteError
from .models import Artifact, Session
from .runtime import Runtime, backend_for

INPUT = f"{WORKSPACE}/input"
OUTPUT = f"{WORKSPACE}/output"


def workspace_path(relative: str, *, under: str = WORKSPACE) -> str:
    """The absolute path of `relative` inside `under`; ServiceError if it would leave it."""
    if not relative or "\x00" in relative:
        raise ServiceError("Give a path inside the workspace.", field_errors={"path": ["empty or invalid path"]})
    candidate = relative if relative.startswith("/") else posixpath.join(under, relative)
    normalised = posixpath.normpath(candidate)
    if normalised != under and not normalised.startswith(under + "/"):
        raise ServiceError(
            f"{relative!r} leaves {under}.", field_errors={"path": [f"the path must stay inside {under}"]}
        )
    return normalised


def files_of(session: Session) -> FilesCapability:
    files = backend_for(session.config).files()
    if files is None:
        raise RemoteError(ErrorKind.UNSUPPORTED, "this backend has no file access")
    return files


def stage_input(runtime: Runtime, session: Session, name: str, data: bytes, *, actor: Actor) -> FileInfo:
    """Write an attachment into /workspace/input, owned by root and read-only to the user."""
    if len(data) > settings.WORKSPACE_UPLOAD_MAX_BYTES:
        raise ServiceError(f"The file is larger than {settings.WORKSPACE_UPLOAD_MAX_BYTES} bytes.")
    path = workspace_path(name, under=INPUT)
    if path == INPUT:
        raise ServiceError("Give the attachment a file name.", field_errors={"path": ["a file name is needed"]})
    resolved = runtime.resolve_session(session)
    files = files_of(session)
    parent = posixpath.dirname(path)
    if parent != INPUT:
        backend_for(session.config).exec(
            resolved.sandbox.sandbox_id,
            ExecRequest(argv=("mkdir", "-p", parent), user="root", timeout_s=30),
        )
    info = files.write(resolved.sandbox.sandbox_id, path, data, mode=0o444, user="root")
    record_audit(
        actor,
        "session.input_upload",
        space=session.space,
        target_type="session",
        target_id=session.id,
        details={"path": path, "size": len(data)},
    )
    return info


def list_files(runtime: Runtime, session: Session, relative: str = "") -> list[FileInfo]:
    path = workspace_path(relative or WORKSPACE)
    resolved = runtime.resolve_session(session)
    entries = files_of(session).list(resolved.sandbox.sandbox_id, path)
    return sorted(entries, key=lambda e: (not e.is_dir, e.name))


def read_file(runtime: Runtime, session: Session, relative: str, *, max_bytes: int | None = None) -> bytes:
    path = workspace_path(relative)
    resolved = runtime.resolve_session(session)
    limit = max_bytes or settings.WORKSPACE_READ_MAX_BYTES
    data = files_of(session).read(resolved.sandbox.sandbox_id, path, max_bytes=limit + 1)
    if len(data) > limit:
        raise ServiceError(f"{relative} is larger than {limit} bytes; collect it as an artifact instead.")
    return data


def write_file(runtime: Runtime, session: Session, relative: str, data: bytes, *, actor: Actor) -> FileInfo:
    """Write a file as the session user. /workspace/input stays read-only (staging is apart)."""
    path = workspace_path(relative)
    if path == INPUT or path.startswith(INPUT + "/"):
        raise ServiceError("/workspace/input is read-only; upload attachments to input instead.")
    if len(data) > settings.WORKSPACE_UPLOAD_MAX_BYTES:
        raise ServiceError(f"The file is larger than {settings.WORKSPACE_UPLOAD_MAX_BYTES} bytes.")
    resolved = runtime.resolve_session(session)
    info = files_of(session).write(resolved.sandbox.sandbox_id, path, data, user="user")
    record_audit(
        actor,
        "session.file_write",
        space=session.space,
        target_type="session",
        target_id=session.id,
        details={"path": path, "size": len(data)},
    )
    return info


@dataclass(frozen=True)
class CollectResult:
    collection: uuid.UUID
    artifacts: list[Artifact]
    refused: list[str]


# Lists /workspace/output as NUL-separated "type size path" records, without following links.
_LIST_OUTPUT = "cd /workspace/output 2>/dev/null || exit 0; find . -mindepth 1 -printf '%y %s %P\\0'"


def collect_artifacts(runtime: Runtime, session: Session, *, actor: Actor) -> CollectResult:
    """Copy /workspace/output out to Django storage (caps, no symlinks, no traversal)."""
    resolved = runtime.resolve_session(session)
    sandbox_id = resolved.sandbox.sandbox_id
    backend = backend_for(session.config)
    listing = backend.exec(
        sandbox_id, ExecRequest(shell=_LIST_OUTPUT, user="root", timeout_s=60, max_output_bytes=4 << 20)
    )
    if listing.exit_code != 0 or listing.truncated:
        raise RemoteError(ErrorKind.INTERNAL, f"cannot list /workspace/output: {listing.stderr[:200]!r}")
    files = files_of(session)
    collection = uuid.uuid4()
    refused: list[str] = []
    wanted: list[tuple[str, int]] = []
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        kind, size_text, name = record.decode(errors="replace").split(" ", 2)
        if kind == "d":
            continue
        if kind != "f":
            refused.append(f"{name}: not a regular file ({'symlink' if kind == 'l' else kind}), skipped")
            continue
        if ".." in name.split("/") or name.startswith("/"):
            refused.append(f"{name}: path leaves the output folder, skipped")
            continue
        wanted.append((name, int(size_text)))
    total = 0
    picked: list[tuple[str, int]] = []
    for name, size in sorted(wanted):
        if len(picked) >= settings.ARTIFACT_MAX_FILES:
            refused.append(f"{name}: more than {settings.ARTIFACT_MAX_FILES} files, skipped")
        elif size > settings.ARTIFACT_MAX_FILE_BYTES:
            refused.append(f"{name}: {size} bytes is over the {settings.ARTIFACT_MAX_FILE_BYTES}-byte cap, skipped")
        elif total + size > settings.ARTIFACT_MAX_TOTAL_BYTES:
            refused.append(f"{name}: the collection would pass {settings.ARTIFACT_MAX_TOTAL_BYTES} bytes, skipped")
        else:
            picked.append((name, size))
            total += size
    artifacts: list[Artifact] = []
    stored: list[Artifact] = []
    try:
        for name, _ in picked:
            data = files.read(sandbox_id, f"{OUTPUT}/{name}", max_bytes=settings.ARTIFACT_MAX_FILE_BYTES + 1)
            if len(data) > settings.ARTIFACT_MAX_FILE_BYTES:
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
                "session.collect_artifacts",
                space=session.space,
                target_type="session",
                target_id=session.id,
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
