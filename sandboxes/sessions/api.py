"""The agent API's session routes: the session, its sandbox (resolve, pause, turns, exec), its
files, its artifacts and its background commands, under
/api/v1/spaces/{space_id}/sessions/{key}. Each route's request and response schemas sit
beside it; the OpenAPI description is generated from them (`sandboxes.api.urls`).

A view looks its session up first (404), then reads its body (400). A GET never wakes a
sandbox: a read that needs a running one answers 409 session_not_running
(`sandboxes.api.errors`).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any
from uuid import UUID

from django.http import FileResponse, HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Path, Query, Router, Schema, Status
from pydantic import BaseModel, ValidationInfo, WithJsonSchema, field_validator, model_validator

from console.middleware import REQUEST_STARTED
from console.models import Space

from ..api.auth import caller
from ..api.errors import BYTES, JSON_BODY, documented
from ..api.wire import (
    ANY_OBJECT_DOC,
    RAW_BODY_DOC,
    ApiError,
    IntText,
    as_int,
    b64_bytes,
    b64_checked,
    body_doc,
    invalid,
    json_body,
    page_of,
    read_body,
    upload_body,
)
from ..backends.base import ExecRequest
from ..models import Artifact, BackgroundCommand, Session
from .commands import kill_command, read_output, send_input, start_command
from .labels import MAX_LABELS, InvalidLabels, parse_labels
from .labels import RULE as LABEL_RULE
from .lookup import get_or_create_session
from .runtime import Resolved, Runtime
from .services import do_set_session_labels
from .teardown import delete_session
from .workspace import collect_artifacts, list_files, read_file, stage_input, write_file

router = Router(tags=["sessions"], exclude_unset=True)  # a key a view leaves out stays out

SESSION = "/spaces/{uuid:space_id}/sessions/{key}"
SpaceId = Annotated[UUID, Path()]
# The key's pattern is described, not checked here: the session's lookup answers a bad key.
Key = Annotated[
    str,
    WithJsonSchema({"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"}),
    Path(description="The platform's session id: letters, digits, '.', '_', ':' and '-', at most 128"),
]
PAGE = "Page size, 1 to 500 (default: {} {})"
CURSOR = "The `next_cursor` of the page before"
NEXT_CURSOR = "Pass as ?cursor= for the next page; null: last page"
# A GET never creates, resumes or rebuilds a sandbox: the reads that need a running one say so.
NOT_RUNNING = (
    "code session_not_running: the session's sandbox is paused, stopped or gone, and a GET never wakes it;"
    " the message names the POST that does (…/resolve, or any POST that runs in it such as …/exec)."
    " Otherwise a backend conflict or quota"
)


def existing_session(space: Space, key: str) -> Session:
    # A NUL byte is in no key, and the database cannot compare one: no lookup, not a 500.
    rows = Session.objects.select_related("config__backend", "space")
    session = None if "\x00" in key else rows.filter(space=space, key=key).first()
    if session is None:
        raise ApiError(404, "not_found", f"No session {key!r} in this space.")
    return session


def callers_session(request: HttpRequest, key: str) -> Session:
    """`existing_session` of the caller's space, as read with the token when it was (the
    warm exec path: one query for both)."""
    who = caller(request)
    read, session = who.session_named(key)
    if not read:
        return existing_session(who.space, key)
    if session is None:
        raise ApiError(404, "not_found", f"No session {key!r} in this space.")
    return session


# --- The session -------------------------------------------------------------------------

Timestamp = Annotated[str | None, WithJsonSchema({"type": ["string", "null"], "format": "date-time"})]


class SessionOut(Schema):
    key: str
    id: UUID
    config: str
    state: str = Field(
        json_schema_extra={"enum": ["new", "running", "paused", "stopped", "gone", "starting", "pausing"]}
    )
    sandbox_id: str | None
    binding_version: int
    template_id: str | None
    stale_at: Timestamp
    last_activity: Timestamp
    labels: list[str]

    model_config = {"title": "Session"}

    @classmethod
    def of(cls, session: Session) -> dict[str, Any]:
        return {
            "key": session.key,
            "id": session.id,
            "config": session.config.name,
            "state": session.state,
            "sandbox_id": session.sandbox_id or None,
            "binding_version": session.binding_version,
            "template_id": session.template_id or None,
            "stale_at": session.stale_at.isoformat() if session.stale_at else None,
            "last_activity": session.last_activity.isoformat() if session.last_activity else None,
            "labels": session.label_list,
        }


class ResolvedOut(SessionOut):
    action: str = Field(json_schema_extra={"enum": ["bound", "claimed", "pooled", "created", "rebuilt"]})

    model_config = {"title": "ResolvedSession"}

    @classmethod
    def of_resolved(cls, resolved: Resolved) -> dict[str, Any]:
        return {
            **cls.of(resolved.session),
            "state": str(resolved.sandbox.state),
            "sandbox_id": resolved.sandbox.sandbox_id,
            "action": resolved.action,
        }


class TurnOut(Schema):
    key: str
    turn: str

    model_config = {"title": "Turn"}


@router.get(SESSION, url_name="session", summary="The session's last known state", **documented({200: SessionOut}))
@router.get(SESSION + "/", include_in_schema=False)
def session_get(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    return SessionOut.of(existing_session(caller(request).space, key))


# As described (no trailing slash), and with one: APPEND_SLASH would answer a DELETE without
# it with a redirect that clients do not follow.
@router.delete(
    SESSION,
    url_name="session",
    summary="Delete the session, its sandbox, binding and persistent workspace",
    **documented({204: None}),
)
@router.delete(SESSION + "/", include_in_schema=False)
def session_delete(request: HttpRequest, space_id: SpaceId, key: Key) -> HttpResponse:
    who = caller(request)
    delete_session(existing_session(who.space, key), actor=who.actor)  # its unused old skill image too
    return HttpResponse(status=204)


class SessionPatch(BaseModel):
    """`labels` replaces the session's labels; `add_labels` and `remove_labels` merge into them
    (added in order after those kept, removed where present). Give `labels`, or one or both of
    the others. Each label is checked as at create."""

    labels: list[str] | None = Field(
        None, description=f"The new labels, replacing all: at most {MAX_LABELS}; each {LABEL_RULE}"
    )
    add_labels: list[str] | None = Field(None, description="Labels to add to those the session has")
    remove_labels: list[str] | None = Field(None, description="Labels to take off (absent ones are ignored)")

    model_config = {"title": "SessionPatch"}

    @field_validator("labels", "add_labels", "remove_labels", mode="before")
    @classmethod
    def _labels(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, list):
            try:
                return parse_labels(value)
            except InvalidLabels as exc:
                raise invalid(str(info.field_name), exc.message) from None
        return value

    @model_validator(mode="after")
    def _one_way(self) -> SessionPatch:
        merging = self.add_labels is not None or self.remove_labels is not None
        if self.labels is not None and merging:
            raise invalid("labels", "Give 'labels' (replace) or 'add_labels'/'remove_labels' (merge), not both.")
        if self.labels is None and not merging:
            raise invalid("labels", "Nothing to change: give 'labels', 'add_labels' or 'remove_labels'.")
        return self

    def labels_of(self, held: list[str]) -> list[str]:
        """The labels after this change to `held` (the session's, read under its row lock)."""
        if self.labels is not None:
            return self.labels
        removed = set(self.remove_labels or ())
        kept = [label for label in held if label not in removed]
        return kept + [label for label in self.add_labels or () if label not in kept and label not in removed]


@router.patch(
    SESSION,
    url_name="session",
    summary="Change the session's labels (replace, or add and remove); audited as session.update",
    **documented({200: SessionOut}, errors=JSON_BODY, body=body_doc(SessionPatch)),
)
@router.patch(SESSION + "/", include_in_schema=False)
def session_patch(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    who = caller(request)
    session = existing_session(who.space, key)
    change = read_body(request, SessionPatch)
    do_set_session_labels(session, change.labels_of, actor=who.actor)
    return SessionOut.of(session)


class ResolveIn(BaseModel):
    """Optional. `labels` are set when this call creates the session (PATCH on the session, or
    the console's page, edits them later); an existing session keeps its own. Other members
    are ignored."""

    labels: list[str] | None = Field(
        None,
        description=f"At most {MAX_LABELS}; each {LABEL_RULE}",
        json_schema_extra={"maxItems": MAX_LABELS},
    )

    model_config = {"title": "ResolveRequest"}

    @field_validator("labels", mode="before")
    @classmethod
    def _labels(cls, value: Any) -> Any:
        if isinstance(value, list):
            try:
                return parse_labels(value)
            except InvalidLabels as exc:
                raise invalid("labels", exc.message) from None
        return value


@router.post(
    SESSION + "/resolve",
    url_name="resolve",
    summary="Resolve the session to a live sandbox (created, claimed, resumed or rebuilt as needed):"
    " what wakes a paused, stopped or gone session for the GETs",
    **documented({200: ResolvedOut}, errors=JSON_BODY, body=body_doc(ResolveIn, required=False)),
)
def resolve(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    body = read_body(request, ResolveIn)
    who = caller(request)
    resolved = Runtime().resolve(
        who.space,
        key,
        actor=who.actor,
        labels=body.labels or (),
        found=who.session_named(key),
        started=request.META.get(REQUEST_STARTED),
    )
    return ResolvedOut.of_resolved(resolved)


@router.post(
    SESSION + "/pause",
    url_name="pause",
    summary="Pause the session's sandbox (the next resolve or exec resumes it)",
    **documented(
        {200: SessionOut},
        errors=JSON_BODY,
        say={
            409: "code session_busy: an exec, file call, background command or open terminal is in flight"
            " (the message says which); nothing was paused. Otherwise a backend conflict"
        },
        body=ANY_OBJECT_DOC,
    ),
)
def pause(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    """Paused, or stopped, per its config's idle mode. Through the one guarded pause: 409
    session_busy (in words) while an exec, a file call, a background command or a terminal
    is in flight."""
    json_body(request)
    who = caller(request)
    session = existing_session(who.space, key)
    Runtime().pause(session, actor=who.actor)
    return SessionOut.of(session)


@router.post(
    SESSION + "/turns/begin",
    url_name="turn_begin",
    summary="Begin a turn: its first resolve may rebuild a stale sandbox",
    **documented({200: TurnOut}, errors=JSON_BODY, body=ANY_OBJECT_DOC),
)
def turn_begin(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    json_body(request)
    who = caller(request)
    Runtime().begin_turn(get_or_create_session(who.space, key, actor=who.actor))
    return {"key": key, "turn": "begun"}


@router.post(SESSION + "/turns/end", url_name="turn_end", summary="End the turn", **documented({200: TurnOut}))
def turn_end(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    Runtime().end_turn(existing_session(caller(request).space, key))
    return {"key": key, "turn": "ended"}


# --- Exec --------------------------------------------------------------------------------


class ExecIn(BaseModel):
    """Exactly one of argv or shell. Runs as the session user (uid 1000)."""

    argv: list[str] | None = Field(None, min_length=1)
    shell: str | None = None
    env: dict[str, str] | None = None
    timeout_s: float | None = Field(None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 3600})
    max_output_bytes: int | None = Field(None, json_schema_extra={"minimum": 1, "maximum": 16 * 1024 * 1024})
    cwd: str | None = Field(None, description="An absolute path (default: /workspace)")
    stdin_b64: str | None = Field(None, json_schema_extra={"contentEncoding": "base64"})

    model_config = {"title": "ExecRequest"}

    @model_validator(mode="before")
    @classmethod
    def _one_command(cls, data: Any) -> Any:
        argv, shell = data.get("argv"), data.get("shell")
        if (argv is not None and not isinstance(argv, list)) or (shell is not None and not isinstance(shell, str)):
            return data  # the field says it has the wrong type
        if (argv is None) == (shell is None):
            raise invalid("argv", "Give exactly one of 'argv' (a list of strings) or 'shell'.")
        return data

    @field_validator("argv", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, list) and (not value or not all(isinstance(a, str) for a in value)):
            raise invalid("argv", "'argv' must be a non-empty list of strings.")
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        if isinstance(value, dict) and not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise invalid("env", "'env' maps strings to strings.")
        return value

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 3600:
            raise invalid("timeout_s", "'timeout_s' is between 0 and 3600.")
        return value

    @field_validator("max_output_bytes")
    @classmethod
    def _cap(cls, value: int | None) -> int | None:
        if value is not None and not 0 < value <= 16 * 1024 * 1024:
            raise invalid("max_output_bytes", "'max_output_bytes' is between 1 and 16 MiB.")
        return value

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise invalid("cwd", "'cwd' is an absolute path.")
        return value

    @field_validator("stdin_b64")
    @classmethod
    def _stdin(cls, value: str | None) -> str | None:
        return b64_checked("stdin_b64", value)

    def request(self) -> ExecRequest:
        return ExecRequest(
            argv=tuple(self.argv) if self.argv is not None else None,
            shell=self.shell,
            cwd=self.cwd or "/workspace",
            env=self.env or {},
            stdin=b64_bytes(self.stdin_b64),
            timeout_s=float(self.timeout_s or 60),
            max_output_bytes=self.max_output_bytes or 1024 * 1024,
        )


class ExecOut(Schema):
    exit_code: int | None  # the contract says int; a lost process may leave none
    stdout: str
    stderr: str
    stdout_b64: str
    stderr_b64: str
    duration_s: float
    truncated: bool
    timed_out: bool

    model_config = {"title": "ExecResult"}


@router.post(
    SESSION + "/exec",
    url_name="exec",
    summary="Run a command in the session's sandbox",
    **documented({200: ExecOut}, errors=JSON_BODY, body=body_doc(ExecIn)),
)
def exec_command(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    session = callers_session(request, key)
    result = Runtime().exec(session, read_body(request, ExecIn).request())
    return {
        "exit_code": result.exit_code,
        "stdout": result.stdout.decode(errors="replace"),
        "stderr": result.stderr.decode(errors="replace"),
        "stdout_b64": base64.b64encode(result.stdout).decode(),
        "stderr_b64": base64.b64encode(result.stderr).decode(),
        "duration_s": round(result.duration_s, 4),
        "truncated": result.truncated,
        "timed_out": result.timed_out,
    }


# --- Files -------------------------------------------------------------------------------


class FileWritten(Schema):
    path: str
    size: int
    mode: str | None = None


class FileEntry(Schema):
    name: str
    path: str
    is_dir: bool
    size: int
    mode: str
    is_symlink: bool


class FileList(Schema):
    entries: list[FileEntry]


@router.put(
    SESSION + "/input/{path:path}",
    url_name="input_upload",
    summary="Upload an attachment to /workspace/input (read-only to the session user)",
    **documented({201: FileWritten}, body=RAW_BODY_DOC),
)
def input_upload(request: HttpRequest, space_id: SpaceId, key: Key, path: str) -> Any:
    who = caller(request)
    session = existing_session(who.space, key)
    info = stage_input(Runtime(), session, path, upload_body(request), actor=who.actor)
    return Status(201, {"path": info.path, "size": info.size, "mode": oct(info.mode)})


@router.get(
    SESSION + "/files",
    url_name="files",
    summary="List a folder of /workspace of the running sandbox (reads only: never wakes it)",
    **documented({200: FileList}, say={409: NOT_RUNNING}),
)
def files(
    request: HttpRequest,
    space_id: SpaceId,
    key: Key,
    path: Annotated[str, Query("", description="Folder, relative to /workspace (default: /workspace)")] = "",
) -> dict[str, Any]:
    session = existing_session(caller(request).space, key)
    entries = list_files(Runtime(), session, path, wake=False)  # a GET never wakes
    return {
        "entries": [
            {
                "name": e.name,
                "path": e.path,
                "is_dir": e.is_dir,
                "size": e.size,
                "mode": oct(e.mode),
                "is_symlink": e.is_symlink,
            }
            for e in entries
        ]
    }


FilePath = Annotated[str, Query("", description="File, relative to /workspace (required)")]
CONTENT = SESSION + "/files/content"


@router.get(
    CONTENT,
    url_name="file_content",
    summary="Read a file of /workspace of the running sandbox (reads only: never wakes it)",
    **documented(
        {200: BYTES},
        say={
            409: NOT_RUNNING,
            404: "Unknown space or session, or (code not_found, field path) no such file in /workspace",
        },
    ),
)
def file_read(request: HttpRequest, space_id: SpaceId, key: Key, path: FilePath = "") -> HttpResponse:
    session = existing_session(caller(request).space, key)
    if not path:
        raise ApiError(400, "invalid", "'path' is required.", field="path")
    data = read_file(Runtime(), session, path, wake=False)  # a GET never wakes
    return HttpResponse(data, content_type="application/octet-stream")


@router.put(
    CONTENT,
    summary="Write a file of /workspace as the session user",
    **documented({201: FileWritten}, body=RAW_BODY_DOC),
)
def file_write(request: HttpRequest, space_id: SpaceId, key: Key, path: FilePath = "") -> Any:
    who = caller(request)
    session = existing_session(who.space, key)
    if not path:
        raise ApiError(400, "invalid", "'path' is required.", field="path")
    info = write_file(Runtime(), session, path, upload_body(request), actor=who.actor)
    return Status(201, {"path": info.path, "size": info.size})


# --- Artifacts ---------------------------------------------------------------------------


class ArtifactOut(Schema):
    id: UUID
    path: str
    size: int
    sha256: str
    download_url: str

    model_config = {"title": "Artifact"}

    @classmethod
    def of(cls, request: HttpRequest, space: Space, key: str, artifact: Artifact) -> dict[str, Any]:
        url = reverse("api:artifact_download", kwargs={"space_id": space.id, "key": key, "artifact_id": artifact.id})
        return {
            "id": artifact.id,
            "path": artifact.path,
            "size": artifact.size,
            "sha256": artifact.sha256,
            "download_url": request.build_absolute_uri(url),
        }


class Collection(Schema):
    collection: UUID
    artifacts: list[ArtifactOut]
    refused: list[str]


class ArtifactList(Schema):
    artifacts: list[ArtifactOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


@router.get(
    SESSION + "/artifacts",
    url_name="artifacts",
    summary="Collected artifacts (newest first, a page at a time)",
    **documented({200: ArtifactList}),
)
def artifacts(
    request: HttpRequest,
    space_id: SpaceId,
    key: Key,
    limit: Annotated[IntText, Query(None, description=PAGE.format(500, "artifacts"))] = None,
    cursor: Annotated[str | None, Query(None, description=CURSOR)] = None,
) -> dict[str, Any]:
    space = caller(request).space
    session = existing_session(space, key)
    rows, next_cursor = page_of(request, session.artifacts.all(), time_field="created", default_limit=500)
    return {"artifacts": [ArtifactOut.of(request, space, key, a) for a in rows], "next_cursor": next_cursor}


@router.post(
    SESSION + "/artifacts/collect",
    url_name="collect",
    summary="Copy /workspace/output to storage (size caps; symlinks and traversal refused)",
    **documented({200: Collection}),
)
def collect(request: HttpRequest, space_id: SpaceId, key: Key) -> dict[str, Any]:
    who = caller(request)
    session = existing_session(who.space, key)
    result = collect_artifacts(Runtime(), session, actor=who.actor)
    return {
        "collection": result.collection,
        "artifacts": [ArtifactOut.of(request, who.space, key, a) for a in result.artifacts],
        "refused": result.refused,
    }


@router.get(
    SESSION + "/artifacts/{uuid:artifact_id}",
    url_name="artifact_download",
    summary="Download one artifact",
    **documented({200: BYTES}),
)
def artifact_download(request: HttpRequest, space_id: SpaceId, key: Key, artifact_id: UUID) -> FileResponse:
    session = existing_session(caller(request).space, key)
    artifact = session.artifacts.filter(pk=artifact_id).first()
    if artifact is None:
        raise ApiError(404, "not_found", "No such artifact in this session.")
    return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=artifact.path.rsplit("/", 1)[-1])


# --- Background commands -----------------------------------------------------------------


class CommandOut(Schema):
    id: UUID
    command: str
    status: str = Field(json_schema_extra={"enum": ["running", "exited", "killed", "lost"]})
    exit_code: int | None
    started: str = Field(json_schema_extra={"format": "date-time"})
    finished: Timestamp

    model_config = {"title": "Command"}

    @classmethod
    def of(cls, command: BackgroundCommand) -> dict[str, Any]:
        return {
            "id": command.id,
            "command": command.display_command,
            "status": command.status,
            "exit_code": command.exit_code,
            "started": command.started.isoformat(),
            "finished": command.finished.isoformat() if command.finished else None,
        }


class CommandList(Schema):
    commands: list[CommandOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


Words = Annotated[list[Any], WithJsonSchema({"type": "array", "items": {"type": "string"}, "minItems": 1})]


class CommandIn(BaseModel):
    """Exactly one of argv or shell; runs as the session user in /workspace."""

    argv: Words | None = None
    shell: str | None = None

    model_config = {"title": "CommandRequest"}

    @model_validator(mode="after")
    def _one_command(self) -> CommandIn:
        if (self.argv is None) == (self.shell is None):
            raise invalid("argv", "Give exactly one of 'argv' (a list of strings) or 'shell'.")
        return self


class ChunkOut(Schema):
    id: int
    data_b64: str
    text: str


class CommandOutput(Schema):
    chunks: list[ChunkOut]
    next_after: int = Field(description="Pass back as `after` to read on")
    fell_behind: bool = Field(description="Chunks after `after` were dropped from the buffer")
    finished: bool = Field(description="The command ended and this page holds its last chunk")
    status: str
    exit_code: int | None


class CommandInput(BaseModel):
    data_b64: str | None = None
    eof: bool | None = None

    @field_validator("data_b64")
    @classmethod
    def _data(cls, value: str | None) -> str | None:
        return b64_checked("data_b64", value)


class StdinResult(Schema):
    written: int
    eof: bool


def existing_command(space: Space, key: str, command_id: Any) -> BackgroundCommand:
    session = existing_session(space, key)
    command = BackgroundCommand.objects.select_related("session__space").filter(pk=command_id, session=session).first()
    if command is None:
        raise ApiError(404, "not_found", "No such command in this session.")
    return command


COMMANDS = SESSION + "/commands"
COMMAND = COMMANDS + "/{uuid:command_id}"


@router.get(
    COMMANDS,
    url_name="commands",
    summary="The session's background commands (newest first, a page at a time)",
    **documented({200: CommandList}),
)
def commands(
    request: HttpRequest,
    space_id: SpaceId,
    key: Key,
    limit: Annotated[IntText, Query(None, description=PAGE.format(50, "commands"))] = None,
    cursor: Annotated[str | None, Query(None, description=CURSOR)] = None,
) -> dict[str, Any]:
    session = existing_session(caller(request).space, key)
    recent, next_cursor = page_of(request, session.commands.all(), time_field="started", default_limit=50)
    return {"commands": [CommandOut.of(c) for c in recent], "next_cursor": next_cursor}


@router.post(
    COMMANDS,
    summary="Start a background command; read its output incrementally",
    **documented({201: CommandOut}, errors=JSON_BODY, body=body_doc(CommandIn)),
)
def command_start(request: HttpRequest, space_id: SpaceId, key: Key) -> Any:
    who = caller(request)
    session = existing_session(who.space, key)
    wanted = read_body(request, CommandIn)
    command = start_command(Runtime(), session, shell=wanted.shell, argv=wanted.argv, actor=who.actor)
    return Status(201, CommandOut.of(command))


@router.get(
    COMMAND + "/output",
    url_name="command_output",
    summary="Output after a chunk id (a ring buffer: a reader that fell behind is told so)",
    **documented({200: CommandOutput}),
)
def command_output(
    request: HttpRequest,
    space_id: SpaceId,
    key: Key,
    command_id: UUID,
    after: Annotated[IntText, Query(None, description="The last chunk id read (omit: from the start)")] = None,
    max_bytes: Annotated[IntText, Query(None, description="At most this many bytes in the page")] = None,
) -> dict[str, Any]:
    command = existing_command(caller(request).space, key, command_id)
    first, cap = as_int("after", after), as_int("max_bytes", max_bytes)
    page = read_output(command, first, cap if cap is not None else 256 * 1024)
    return {
        "chunks": [
            {"id": chunk_id, "data_b64": base64.b64encode(data).decode(), "text": data.decode(errors="replace")}
            for chunk_id, data in page.chunks
        ],
        "next_after": page.next_after,
        "fell_behind": page.fell_behind,
        "finished": page.finished,
        "status": page.status,
        "exit_code": page.exit_code,
    }


@router.post(
    COMMAND + "/stdin",
    url_name="command_stdin",
    summary="Send bytes (and optionally end-of-file) to the command's stdin",
    **documented({200: StdinResult}, errors=JSON_BODY, body=body_doc(CommandInput)),
)
def command_stdin(request: HttpRequest, space_id: SpaceId, key: Key, command_id: UUID) -> dict[str, Any]:
    who = caller(request)
    command = existing_command(who.space, key, command_id)
    wanted = read_body(request, CommandInput)
    eof = wanted.eof or False
    written = send_input(command, b64_bytes(wanted.data_b64) or b"", actor=who.actor, eof=eof)
    return {"written": written, "eof": eof}


@router.post(
    COMMAND + "/kill",
    url_name="command_kill",
    summary="Kill the command's process group in the sandbox",
    **documented({200: CommandOut}),
)
def command_kill(request: HttpRequest, space_id: SpaceId, key: Key, command_id: UUID) -> dict[str, Any]:
    who = caller(request)
    return CommandOut.of(kill_command(existing_command(who.space, key, command_id), actor=who.actor))
