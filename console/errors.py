"""Error pages (400, 403, 404, 500) in the console's layout, and one log line per expected 403.

The reason is shown where it is safe: a 403's message names the role the page needs (the
user is a member, so nothing is revealed); a 404's own message ("No such space") is the same
for a space that does not exist and one the user is not a member of. The 500 page says
nothing of the error and renders without the database if it has to.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.template import loader
from django.urls import Resolver404

logger = logging.getLogger(__name__)


def _reason(exception: Exception | None) -> str:
    """The exception's own message when it is a plain sentence (never a resolver's pattern list)."""
    if exception is None or isinstance(exception, Resolver404) or not exception.args:
        return ""
    message = exception.args[0]
    return message if isinstance(message, str) else ""


def _render(request: HttpRequest, status: int, title: str, reason: str, **extra: Any) -> HttpResponse:
    context = {"status": status, "title": title, "reason": reason, **extra}
    body = loader.render_to_string("errors/error.html", context, request)
    return HttpResponse(body, status=status)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    # A SuspiciousOperation's message may quote the attacker's input: not shown.
    return _render(request, 400, "Bad request", "The request could not be understood.")


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    reason = _reason(exception) or "Your role does not allow this."
    return _render(request, 403, "Not allowed", reason)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    reason = _reason(exception)
    if reason.startswith("No ") and "matches the given query" in reason:
        reason = "There is nothing at this address, or it is not yours to see."
    return _render(request, 404, "Not found", reason or "There is nothing at this address, or it is not yours to see.")


def server_error(request: HttpRequest) -> HttpResponse:
    try:
        # Without the request's context: a broken database or session must not fail this too.
        body = loader.render_to_string(
            "errors/error.html",
            {"status": 500, "title": "Something went wrong", "reason": "", "server_error": True},
        )
    except Exception:  # the last resort: the layout itself failed
        logger.exception("the 500 page could not be rendered")
        return HttpResponseServerError("<h1>Server error (500)</h1>", content_type="text/html")
    return HttpResponseServerError(body)


class ExpectedForbiddenFilter(logging.Filter):
    """On `django.request`: an expected 403 (PermissionDenied) logs one line with its reason.

    Django logs "Forbidden (Permission denied): <path>" with the exception attached, so every
    refusal printed a full traceback; a refusal is not a bug, its reason is the useful part.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PermissionDenied):
            reason = _reason(exc)
            if reason and isinstance(record.msg, str):
                record.msg = f"{record.msg} ({reason.replace('%', '%%')})"
            record.exc_info = None
            record.exc_text = None
        return True


def install_log_filter() -> None:
    """Attach the filter in code, so it holds whatever LOGGING a deployment sets."""
    request_logger = logging.getLogger("django.request")
    if not any(isinstance(f, ExpectedForbiddenFilter) for f in request_logger.filters):
        request_logger.addFilter(ExpectedForbiddenFilter())
