"""The agent API: JSON over HTTP under /api/v1/, authenticated by per-space tokens.

Every route names its space; a token of another space gets 404, exactly like an unknown
space. Bad input is a 400 naming the field; an unknown session is a 404; backend failures
map from `RemoteError` kinds to 409/429/502/503/504 with `retryable`. The routes and their
shapes are described in `sandboxes/api/openapi.py` and served at /api/v1/openapi.json.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db import IntegrityError, InterfaceError, OperationalError
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from console.models import Space
from console.services import Actor, ServiceError

from ..backends.base import ExecRequest, RemoteError
from ..models import ApiToken, Artifact, BackgroundCommand, Session
from ..sessions.commands import kill_command, read_output, send_input, start_command
from ..sessions.limits import LimitExceeded, check_api_rate
from ..sessions.lookup import BeingDeleted, call_session, get_or_create_session
from ..sessions.runtime import Resolved, Runtime, SessionDeleted
from ..sessions.store import lifecycle_lock, lock_key
from ..sessions.store_select import get_store
from ..sessions.teardown import delete_session
from ..sessions.workspace import (
    FileMissing,
    SandboxNotRunning,
    collect_artifacts,
    list_files,
    read_file,
    stage_input,
    write_file,
)
from .tokens import TOKEN_PREFIX, hash_token
from .wire import (
    ApiError,
    decode_b64,
    field_of,
    int_param,
    json_body,
    limit_response,
    not_running,
    page_of,
    remote_error,
    upload_body,
)

logger = logging.getLogger(__name__)
LAST_USED_WRITE_INTERVAL = timedelta(minutes=1)


# --- Authentication ----------------------------------------------------------------------


def authenticate(request: HttpRequest, space_id: Any) -> tuple[Space, ApiToken]:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.startswith(TOKEN_PREFIX):
        raise ApiError(401, "unauthorized", "Send 'Authorization: Bearer sck_…' with a space API token.")
    token = ApiToken.objects.select_related("space").filter(token_hash=hash_token(value.strip())).first()
    if token is None or token.revoked is not None:
        raise ApiError(401, "unauthorized", "Unknown or revoked API token.")
    if str(token.space_id) != str(space_id):
        raise ApiError(404, "not_found", "No such space.")  # never reveal another space
    now = timezone.now()
    if token.last_used is None or now - token.last_used > LAST_USED_WRITE_INTERVAL:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token.space, token


# --- Plumbing ----------------------------------------------------------------------------


Handler = Callable[..., HttpResponse | FileResponse]


def api_view(*methods: str) -> Callable[[Handler], Handler]:
    """Token auth, space scoping, method check and error mapping for one API route."""

    def decorate(func: Handler) -> Handler:
        @csrf_exempt
        @functools.wraps(func)
        def view(request: HttpRequest, space_id: Any, **kwargs: Any) -> HttpResponse | FileResponse:
            call = call_session.set(None)
            try:
                return answer(request, space_id, kwargs)
            finally:
                call_session.reset(call)

        def answer(request: HttpRequest, space_id: Any, kwargs: dict[str, Any]) -> HttpResponse | FileResponse:
            try:
                return handle(request, space_id, kwargs)
            except (OperationalError, InterfaceError):
                # The console's database does not answer (restarting, unreachable, locked): a
                # store down, like the session store's 503, and the call is safe to retry. Its
                # address stays in the log, not in the answer.
                logger.warning("API call failed: the database does not answer", exc_info=True)
                return ApiError(503, "unavailable", "database unavailable; retry", retryable=True).response()

        def handle(request: HttpRequest, space_id: Any, kwargs: dict[str, Any]) -> HttpResponse | FileResponse:
            try:
                if request.method not in methods:
                    raise ApiError(405, "method_not_allowed", f"Use {', '.join(methods)}.")
                space, token = authenticate(request, space_id)
                check_api_rate(space)
                request.api_actor = Actor(user=None, source_ip=request.META.get("REMOTE_ADDR"))  # type: ignore[attr-defined]
                request.api_token = token  # type: ignore[attr-defined]
                return func(request, space, **kwargs)
            except ApiError as exc:
                return exc.response()
            except LimitExceeded as exc:
                return limit_response(exc)
            except SandboxNotRunning:  # a GET read a session it may not wake (a ServiceError)
                if was_deleted(space_id, kwargs.get("key")):  # not paused: a DELETE won the race
                    return session_deleted(kwargs["key"]).response()
                return not_running(space_id, kwargs.get("key", "")).response()
            except FileMissing as exc:  # a path that names nothing: the caller's 404, not a backend's 502
                return ApiError(404, "not_found", exc.message, field="path").response()
            except BeingDeleted as exc:
                return ApiError(409, "being_deleted", exc.message).response()
            except ServiceError as exc:
                first_field = next(iter(exc.field_errors), None)
                return ApiError(400, "invalid", exc.message, field=first_field).response()
            except SessionDeleted:
                return session_deleted(kwargs.get("key", "")).response()
            except RemoteError as exc:
                # A sandbox deleted under the call fails in many ways (not found, "removal in
                # progress", a cut stream, a killed process): if a DELETE did it, say so.
                if was_deleted(space_id, kwargs.get("key")):
                    return session_deleted(kwargs["key"]).response()
                return remote_error(exc).response()
            except (ObjectDoesNotExist, IntegrityError):
                # A row of the session (or the session) vanished under the call: a delete won.
                if was_deleted(space_id, kwargs.get("key")):
                    return session_deleted(kwargs["key"]).response()
                raise

        view.api_methods = methods  # type: ignore[attr-defined]  # read by the OpenAPI test
        return view

    return decorate


def was_deleted(space_id: Any, key: str | None) -> bool:
    """Whether the session the call worked on is gone now (a DELETE raced the call).

    Asked by id when the call got that far (`call_session`): a session with the same key made
    since by a racing resolve is another one. A DELETE deletes the sandbox first and the row
    last, under the session's lifecycle lock: while the row is still there, wait behind that
    lock's holder, then look.
    """
    if not key:
        return False
    session_id = call_session.get()

    def gone() -> bool:
        if session_id is not None:
            return not Session.objects.filter(pk=session_id).exists()
        return not Session.objects.filter(space_id=space_id, key=key).exists()

    if gone():
        return True
    with contextlib.suppress(RemoteError), lifecycle_lock(get_store(), lock_key(space_id, key), wait_s=15):
        pass
    return gone()


def session_deleted(key: str) -> ApiError:
    return ApiError(404, "not_found", f"No session {key!r} in this space (it was deleted).")


def actor(request: HttpRequest) -> Actor:
    token: ApiToken = request.api_token  # type: ignore[attr-defined]
    base: Actor = request.api_actor  # type: ignore[attr-defined]
    return Actor(user=token.created_by, source_ip=base.source_ip, token_name=token.name)


def existing_session(space: Space, key: str) -> Session:
    session = Session.objects.select_related("config", "space").filter(space=space, key=key).first()
    if session is None:
        raise ApiError(404, "not_found", f"No session {key!r} in this space.")
    call_session.set(session.pk)
    return session


def session_json(session: Session, resolved: Resolved | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "key": session.key,
        "id": str(session.id),
        "config": session.config.name,
        "state": session.state,
        "sandbox_id": session.sandbox_id or None,
        "binding_version": session.binding_version,
        "template_id": session.template_id or None,
        "stale_at": session.stale_at.isoformat() if session.stale_at else None,
        "last_activity": session.last_activity.isoformat() if session.last_activity else None,
    }
    if resolved is not None:
        body["action"] = resolved.action
        body["state"] = str(resolved.sandbox.state)
        body["sandbox_id"] = resolved.sandbox.sandbox_id
    return body


# --- Routes ------------------------------------------------------------------------------


@api_view("GET", "DELETE")
def session_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    if request.method == "DELETE":
        delete_session(session, actor=actor(request))  # its unused old skill image too
        return HttpResponse(status=204)
    return JsonResponse(session_json(session))


@api_view("POST")
def resolve_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    json_body(request)
    resolved = Runtime().resolve(space, key, actor=actor(request))
    return JsonResponse(session_json(resolved.session, resolved))


@api_view("POST")
def pause_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    """Pause the session's sandbox through the one guarded pause: 409 session_busy (in words)
    while an exec, a file call, a background command or a terminal is in flight."""
    json_body(request)
    session = existing_session(space, key)
    Runtime().pause(session, actor=actor(request))
    return JsonResponse(session_json(session))


@api_view("POST")
def turn_begin_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    json_body(request)
    session = get_or_create_session(space, key, actor=actor(request))
    Runtime().begin_turn(session)
    return JsonResponse({"key": key, "turn": "begun"})


@api_view("POST")
def turn_end_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    Runtime().end_turn(session)
    return JsonResponse({"key": key, "turn": "ended"})


def exec_request(data: dict[str, Any]) -> ExecRequest:
    argv = field_of(data, "argv", list)
    shell = field_of(data, "shell", str)
    if (argv is None) == (shell is None):
        raise ApiError(400, "invalid", "Give exactly one of 'argv' (a list of strings) or 'shell'.", field="argv")
    if argv is not None and (not argv or not all(isinstance(a, str) for a in argv)):
        raise ApiError(400, "invalid", "'argv' must be a non-empty list of strings.", field="argv")
    env = field_of(data, "env", dict) or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ApiError(400, "invalid", "'env' maps strings to strings.", field="env")
    timeout = field_of(data, "timeout_s", (int, float))
    if timeout is not None and not 0 < timeout <= 3600:
        raise ApiError(400, "invalid", "'timeout_s' is between 0 and 3600.", field="timeout_s")
    cap = field_of(data, "max_output_bytes", int)
    if cap is not None and not 0 < cap <= 16 * 1024 * 1024:
        raise ApiError(400, "invalid", "'max_output_bytes' is between 1 and 16 MiB.", field="max_output_bytes")
    cwd = field_of(data, "cwd", str)
    if cwd is not None and not cwd.startswith("/"):
        raise ApiError(400, "invalid", "'cwd' is an absolute path.", field="cwd")
    return ExecRequest(
        argv=tuple(argv) if argv is not None else None,
        shell=shell,
        cwd=cwd or "/workspace",
        env=env,
        stdin=decode_b64(data, "stdin_b64"),
        timeout_s=float(timeout or 60),
        max_output_bytes=cap or 1024 * 1024,
    )


@api_view("POST")
def exec_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    exec_req = exec_request(json_body(request))
    result = Runtime().exec(session, exec_req)
    return JsonResponse(
        {
            "exit_code": result.exit_code,
            "stdout": result.stdout.decode(errors="replace"),
            "stderr": result.stderr.decode(errors="replace"),
            "stdout_b64": base64.b64encode(result.stdout).decode(),
            "stderr_b64": base64.b64encode(result.stderr).decode(),
            "duration_s": round(result.duration_s, 4),
            "truncated": result.truncated,
            "timed_out": result.timed_out,
        }
    )


@api_view("PUT")
def input_upload_view(request: HttpRequest, space: Space, key: str, path: str) -> HttpResponse:
    session = existing_session(space, key)
    info = stage_input(Runtime(), session, path, upload_body(request), actor=actor(request))
    return JsonResponse({"path": info.path, "size": info.size, "mode": oct(info.mode)}, status=201)


@api_view("GET")
def files_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    entries = list_files(Runtime(), session, request.GET.get("path", ""), wake=False)  # a GET never wakes
    return JsonResponse(
        {
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
    )


@api_view("GET", "PUT")
def file_content_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    path = request.GET.get("path", "")
    if not path:
        raise ApiError(400, "invalid", "'path' is required.", field="path")
    if request.method == "PUT":
        info = write_file(Runtime(), session, path, upload_body(request), actor=actor(request))
        return JsonResponse({"path": info.path, "size": info.size}, status=201)
    data = read_file(Runtime(), session, path, wake=False)  # a GET never wakes
    return HttpResponse(data, content_type="application/octet-stream")


@api_view("POST")
def collect_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    result = collect_artifacts(Runtime(), session, actor=actor(request))
    return JsonResponse(
        {
            "collection": str(result.collection),
            "artifacts": [artifact_json(request, space, key, a) for a in result.artifacts],
            "refused": result.refused,
        }
    )


def artifact_json(request: HttpRequest, space: Space, key: str, artifact: Artifact) -> dict[str, Any]:
    from django.urls import reverse

    url = reverse("api:artifact_download", kwargs={"space_id": space.id, "key": key, "artifact_id": artifact.id})
    return {
        "id": str(artifact.id),
        "path": artifact.path,
        "size": artifact.size,
        "sha256": artifact.sha256,
        "download_url": request.build_absolute_uri(url),
    }


@api_view("GET")
def artifact_list_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    artifacts, next_cursor = page_of(request, session.artifacts.all(), time_field="created", default_limit=500)
    return JsonResponse(
        {"artifacts": [artifact_json(request, space, key, a) for a in artifacts], "next_cursor": next_cursor}
    )


@api_view("GET")
def artifact_download_view(
    request: HttpRequest, space: Space, key: str, artifact_id: Any
) -> HttpResponse | FileResponse:
    session = existing_session(space, key)
    artifact = session.artifacts.filter(pk=artifact_id).first()
    if artifact is None:
        raise ApiError(404, "not_found", "No such artifact in this session.")
    return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=artifact.path.rsplit("/", 1)[-1])


# --- Background commands ---------------------------------------------------------------


def command_json(command: BackgroundCommand) -> dict[str, Any]:
    return {
        "id": str(command.id),
        "command": command.display_command,
        "status": command.status,
        "exit_code": command.exit_code,
        "started": command.started.isoformat(),
        "finished": command.finished.isoformat() if command.finished else None,
    }


def existing_command(space: Space, key: str, command_id: Any) -> BackgroundCommand:
    session = existing_session(space, key)
    command = BackgroundCommand.objects.select_related("session__space").filter(pk=command_id, session=session).first()
    if command is None:
        raise ApiError(404, "not_found", "No such command in this session.")
    return command


@api_view("GET", "POST")
def commands_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    if request.method == "GET":
        recent, next_cursor = page_of(request, session.commands.all(), time_field="started", default_limit=50)
        return JsonResponse({"commands": [command_json(c) for c in recent], "next_cursor": next_cursor})
    data = json_body(request)
    argv = field_of(data, "argv", list)
    shell = field_of(data, "shell", str)
    if (argv is None) == (shell is None):
        raise ApiError(400, "invalid", "Give exactly one of 'argv' (a list of strings) or 'shell'.", field="argv")
    command = start_command(Runtime(), session, shell=shell, argv=argv, actor=actor(request))
    return JsonResponse(command_json(command), status=201)


@api_view("GET")
def command_output_view(request: HttpRequest, space: Space, key: str, command_id: Any) -> HttpResponse:
    command = existing_command(space, key, command_id)
    after = int_param(request, "after")
    max_bytes = int_param(request, "max_bytes")
    page = read_output(command, after, max_bytes if max_bytes is not None else 256 * 1024)
    return JsonResponse(
        {
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
    )


@api_view("POST")
def command_stdin_view(request: HttpRequest, space: Space, key: str, command_id: Any) -> HttpResponse:
    command = existing_command(space, key, command_id)
    data = json_body(request)
    payload = decode_b64(data, "data_b64") or b""
    eof = field_of(data, "eof", bool) or False
    written = send_input(command, payload, actor=actor(request), eof=eof)
    return JsonResponse({"written": written, "eof": eof})


@api_view("POST")
def command_kill_view(request: HttpRequest, space: Space, key: str, command_id: Any) -> HttpResponse:
    command = kill_command(existing_command(space, key, command_id), actor=actor(request))
    return JsonResponse(command_json(command))


def openapi_view(request: HttpRequest) -> HttpResponse:
    from .openapi import openapi_document

    return JsonResponse(openapi_document(request.build_absolute_uri("/api/v1")))
