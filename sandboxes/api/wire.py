"""The agent API's wire format: JSON bodies, fields and query parameters read with a 400
naming the field, raw upload bodies, cursor pages, and the error answers (`ApiError`, a
`RemoteError` mapped to its status, a limit's 429 with Retry-After)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, TypeVar

from django.db.models import Model, QuerySet
from django.http import HttpRequest, JsonResponse
from django.urls import reverse

from ..backends.base import ErrorKind, RemoteError
from ..catalog.network import PolicyConflict
from ..sessions.limits import LimitExceeded
from ..sessions.runtime import SessionConflict
from ..sessions.tuning import SESSIONS
from .pagination import InvalidPage, cursor_page

MAX_JSON_BODY = 2 * 1024 * 1024
M = TypeVar("M", bound=Model)

KIND_STATUS = {
    ErrorKind.CONFLICT: 409,
    ErrorKind.QUOTA: 409,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TIMEOUT: 504,
}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.extra = status, code, message, field, extra

    def response(self) -> JsonResponse:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        body.update(self.extra)
        return JsonResponse({"error": body}, status=self.status)


def json_body(request: HttpRequest) -> dict[str, Any]:
    if not request.body:
        return {}
    if len(request.body) > MAX_JSON_BODY:
        raise ApiError(413, "too_large", f"JSON bodies are at most {MAX_JSON_BODY} bytes.")
    try:
        data = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid", f"The body is not JSON: {exc}", field="body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid", "The body must be a JSON object.", field="body")
    return data


def field_of(data: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
    if name not in data or data[name] is None:
        if required:
            raise ApiError(400, "invalid", f"'{name}' is required.", field=name)
        return None
    value = data[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ApiError(400, "invalid", f"'{name}' has the wrong type.", field=name)
    if not isinstance(value, kind):
        raise ApiError(400, "invalid", f"'{name}' has the wrong type.", field=name)
    return value


def decode_b64(data: dict[str, Any], name: str) -> bytes | None:
    text = field_of(data, name, str)
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "invalid", f"'{name}' is not valid base64.", field=name) from None


def remote_error(exc: RemoteError) -> ApiError:
    if isinstance(exc, PolicyConflict):  # the space's settings, not the backend: 409, never 502
        return ApiError(409, "policy_conflict", exc.message, retryable=False)
    if isinstance(exc, SessionConflict):  # the session's own state (busy, not running, replaced)
        return ApiError(409, exc.code, exc.message, retryable=exc.retryable)
    status = KIND_STATUS.get(exc.kind, 502)
    return ApiError(status, str(exc.kind), exc.message, retryable=exc.retryable, backend=True)


def not_running(space_id: Any, key: str) -> ApiError:
    """409 for a GET that found the session's sandbox paused, stopped or gone: a GET never
    wakes one, and the answer names the POST that does."""
    resolve = reverse("api:resolve", kwargs={"space_id": space_id, "key": key})
    return ApiError(
        409,
        "session_not_running",
        f"Session {key!r} has no running sandbox (paused, stopped or gone), and a GET never wakes one:"
        f" POST {resolve} resumes or rebuilds it (so does POST …/exec), then read again.",
        retryable=False,
    )


def limit_response(exc: LimitExceeded) -> JsonResponse:
    """429 naming the limit, with Retry-After (seconds)."""
    response = ApiError(
        429, "limit_exceeded", exc.message, limit=exc.limit, maximum=exc.maximum, retry_after_s=exc.retry_after_s
    ).response()
    response["Retry-After"] = str(exc.retry_after_s)
    return response


def upload_body(request: HttpRequest) -> bytes:
    """A PUT's raw body up to sessions.workspace_upload_max_bytes, read from the stream.

    `request.body` refuses anything past DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB, meant for
    form fields) with an HTML 400, which made the workspace's own cap unreachable.
    """
    cap = SESSIONS.workspace_upload_max_bytes
    data = request.read(cap + 1)
    if len(data) > cap:
        raise ApiError(400, "invalid", f"The file is larger than {cap} bytes.", field="body")
    return data


def page_of(
    request: HttpRequest, rows: QuerySet[M], *, time_field: str, default_limit: int
) -> tuple[list[M], str | None]:
    try:
        return cursor_page(request, rows, time_field=time_field, default_limit=default_limit)
    except InvalidPage as exc:
        raise ApiError(400, "invalid", exc.message, field=exc.field) from None


def int_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError(400, "invalid", f"'{name}' is an integer.", field=name) from None
