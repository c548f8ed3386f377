"""Error mapping of the agent API: one flat table from the exceptions the services raise to the
answer each gets (its status and error body), and the OpenAPI description of those answers.

A service says what went wrong in its own terms (a `ServiceError`, a `RemoteError` of some
kind, a `LimitExceeded`, ...); `ANSWERS` turns each into the API's words. The most specific
class wins (the exception's MRO is looked up, as Django Ninja does for its handlers). The
runtime and the workspace tell a session deleted under a call themselves (`SessionDeleted`):
no answer here re-examines a race.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from ninja import NinjaAPI, Schema
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError

from console.services import ServiceError

from ..backends.base import ErrorKind, RemoteError
from ..catalog.network import PolicyConflict
from ..sessions.limits import LimitExceeded
from ..sessions.lookup import BeingDeleted
from ..sessions.runtime import SessionConflict, SessionDeleted
from ..sessions.workspace import FileMissing, SandboxNotRunning
from .tokens import OutOfScope, TokenExpired
from .wire import ApiError

logger = logging.getLogger(__name__)

KIND_STATUS = {
    ErrorKind.CONFLICT: 409,
    ErrorKind.QUOTA: 409,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TIMEOUT: 504,
}


def _route(request: HttpRequest) -> dict[str, Any]:
    match = request.resolver_match
    return dict(match.kwargs) if match else {}


def not_running(request: HttpRequest, _exc: SandboxNotRunning) -> ApiError:
    """409 for a GET that found the session's sandbox paused, stopped or gone: a GET never
    wakes one, and the answer names the POST that does."""
    route = _route(request)
    key = route.get("key", "")
    resolve = reverse("api:resolve", kwargs={"space_id": route.get("space_id"), "key": key})
    return ApiError(
        409,
        "session_not_running",
        f"Session {key!r} has no running sandbox (paused, stopped or gone), and a GET never wakes one:"
        f" POST {resolve} resumes or rebuilds it (so does POST …/exec), then read again.",
        retryable=False,
    )


def limit_exceeded(_request: HttpRequest, exc: LimitExceeded) -> ApiError:
    """429 naming the limit, with Retry-After (seconds)."""
    return ApiError(
        429,
        "limit_exceeded",
        exc.message,
        limit=exc.limit,
        maximum=exc.maximum,
        retry_after_s=exc.retry_after_s,
        headers={"Retry-After": str(exc.retry_after_s)},
    )


def invalid_input(_request: HttpRequest, exc: ServiceError) -> ApiError:
    return ApiError(400, "invalid", exc.message, field=next(iter(exc.field_errors), None))


def backend_failure(_request: HttpRequest, exc: RemoteError) -> ApiError:
    return ApiError(KIND_STATUS.get(exc.kind, 502), str(exc.kind), exc.message, retryable=exc.retryable, backend=True)


def database_down(_request: HttpRequest, _exc: Exception) -> ApiError:
    # The console's database does not answer (restarting, unreachable, locked): a store down,
    # like the session store's 503, and the call is safe to retry. Its address stays in the
    # log, not in the answer.
    logger.warning("API call failed: the database does not answer", exc_info=True)
    return ApiError(503, "unavailable", "database unavailable; retry", retryable=True)


def unparsed(_request: HttpRequest, exc: NinjaValidationError) -> ApiError:
    """A parameter the router itself could not read (the views read theirs as text)."""
    first = exc.errors[0] if exc.errors else {}
    field = str(first.get("loc", ("", ""))[-1]) or None
    return ApiError(400, "invalid", f"'{field}' has the wrong type.", field=field)


Answer = Callable[[HttpRequest, Any], ApiError]

# Exception -> answer. One row per exception; a subclass's row wins over its base's.
ANSWERS: dict[type[Exception], Answer] = {
    ApiError: lambda _request, exc: exc,  # the views' own answers (auth, lookups, bad input)
    LimitExceeded: limit_exceeded,  # 429 limit_exceeded + Retry-After
    SandboxNotRunning: not_running,  # 409 session_not_running: a GET never wakes a sandbox
    FileMissing: lambda _request, exc: ApiError(404, "not_found", exc.message, field="path"),
    BeingDeleted: lambda _request, exc: ApiError(409, "being_deleted", exc.message),
    TokenExpired: lambda _request, exc: ApiError(
        401, "token_expired", str(exc), expires=exc.token.expires.isoformat() if exc.token.expires else None
    ),
    OutOfScope: lambda _request, exc: ApiError(403, "out_of_scope", str(exc), scope=exc.token.scope),
    ServiceError: invalid_input,  # 400 invalid, naming the first field in error
    SessionDeleted: lambda _request, exc: ApiError(
        404, "not_found", f"No session {exc.key!r} in this space (it was deleted)."
    ),
    # The space's settings, not the backend: 409, never 502.
    PolicyConflict: lambda _request, exc: ApiError(409, "policy_conflict", exc.message, retryable=False),
    # The session's own state (busy, not running, replaced): 409 with the conflict's code.
    SessionConflict: lambda _request, exc: ApiError(409, exc.code, exc.message, retryable=exc.retryable),
    RemoteError: backend_failure,  # 409/429/503/504 by kind, else 502; `backend: true`
    OperationalError: database_down,  # 503 unavailable, retryable
    InterfaceError: database_down,
    NinjaValidationError: unparsed,  # 400 invalid
    HttpError: lambda _request, exc: ApiError(exc.status_code, "invalid", exc.message),
}


def _reraise(_request: HttpRequest, exc: Any) -> HttpResponse:
    raise exc  # Django answers it (a 404 page, a 500 and its log), as for any other view


def _handler(answer: Answer) -> Callable[[HttpRequest, Any], HttpResponse]:
    return lambda request, exc: answer(request, exc).response()


def install(api: NinjaAPI) -> None:
    """Answer through `ANSWERS`; anything else is Django's to answer (Ninja's own defaults
    for 404 and 500 are replaced)."""
    for exc_class, answer in ANSWERS.items():
        api.add_exception_handler(exc_class, _handler(answer))
    api.add_exception_handler(Http404, _reraise)
    api.add_exception_handler(Exception, _reraise)


# --- The OpenAPI description of the answers -----------------------------------------------


class ErrorDetail(Schema):
    code: str
    message: str
    field: str | None = None
    retryable: bool | None = None
    backend: bool | None = None
    limit: str | None = None
    maximum: int | None = None
    retry_after_s: int | None = None
    scope: str | None = None
    expires: str | None = None


class Error(Schema):
    error: ErrorDetail


SAID: dict[int, str] = {
    400: "Bad input; `field` names the offending field",
    401: "Missing, unknown, revoked or expired token (code token_expired)",
    403: "A call the token's scope does not allow (code out_of_scope: read-only takes GET; run adds POST and"
    " PUT; full adds DELETE)",
    404: "Unknown space (or a token of another space) or session",
    409: "Backend conflict or quota, or the space's network policy cannot be enforced by the config's backend"
    " (the message names what); code session_not_running when the call raced a pause, code"
    " sandbox_replaced when the sandbox was rebuilt or removed under it (run it again); code"
    " being_deleted when the space or config is being deleted and no new session starts on it",
    413: "A JSON body larger than 2 MiB",
    429: "A space quota or rate limit (code limit_exceeded: `limit` names it, `maximum` its value, "
    "the Retry-After header and `retry_after_s` when to retry), or a backend rate limit (retryable)",
    502: "Backend failure",
    503: "Backend, session store or database unavailable (retryable)",
    504: "Backend timeout (retryable)",
}
# Every route authenticates (401, 403, 404), counts against the space's rate (429), reads the
# database (503) and, behind it, the session's backend (409, 502, 503, 504).
EVERY_ROUTE = (400, 401, 403, 404, 409, 429, 502, 503, 504)
JSON_BODY = (*EVERY_ROUTE, 413)
BYTES = "application/octet-stream"  # a success answer of raw bytes (a file, an artifact)


def documented(
    ok: dict[int, Any],
    *,
    errors: Iterable[int] = EVERY_ROUTE,
    say: dict[int, str] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` and `openapi_extra` of a route: its success answers, the errors it can
    answer, each described (`say` words a status for this route), and the body it reads
    (`wire.body_doc`)."""
    statuses = sorted(set(errors))
    words = {**SAID, **(say or {})}
    described: dict[int, Any] = {status: {"description": words[status]} for status in statuses}
    for status, schema in ok.items():
        if schema == BYTES:
            described[status] = {"description": "The bytes", "content": {BYTES: {"schema": {"type": "string"}}}}
    answers = {status: None if schema == BYTES else schema for status, schema in ok.items()}
    return {
        "response": {**answers, frozenset(statuses): Error},
        "openapi_extra": {"responses": described, **(body or {})},
    }
