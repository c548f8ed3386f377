"""Middleware of the console."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.contrib.messages import get_messages
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string

from . import metrics
from .logs import REQUEST_ID_HEADER, request_id, sane_request_id

logger = logging.getLogger("console.requests")
# request.META's key for when the request reached the console (time.perf_counter()), for a
# view that reports what its caller waited (the Pools page's pooled resolve time).
REQUEST_STARTED = "console.request_started"


class RequestIdMiddleware:
    """Takes a sane incoming X-Request-ID (or makes one), keeps it for the request's log lines,
    jobs and backend calls (console/logs.py), and echoes it in the response."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with request_id(sane_request_id(request.headers.get(REQUEST_ID_HEADER))) as rid:
            request.request_id = rid  # type: ignore[attr-defined]
            response = self.get_response(request)
            response[REQUEST_ID_HEADER] = rid
            return response


class RequestMetricsMiddleware:
    """Counts every answer by area and status, and logs one line per request (the access log
    with request ids; run Daphne with `--verbosity 0` to drop its own plain-text one)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = request.META[REQUEST_STARTED] = time.perf_counter()
        area = "api" if request.path_info.startswith("/api/") else "pages"
        response = self.get_response(request)
        elapsed = time.perf_counter() - started
        metrics.HTTP_REQUESTS.labels(area=area, method=request.method or "", status=str(response.status_code)).inc()
        metrics.HTTP_SECONDS.labels(area=area).observe(elapsed)
        match = request.resolver_match
        logger.info(
            "%s %s -> %s",
            request.method,
            request.path_info,
            response.status_code,
            extra={
                "area": area,
                "route": match.view_name if match else "",
                "status": response.status_code,
                "duration_ms": round(elapsed * 1000, 1),
            },
        )
        return response


class HtmxMessagesMiddleware:
    """Append pending messages to HTMX responses as an out-of-band swap.

    Full-page responses render messages in the layout; partial responses would otherwise
    leave them queued until the next full page.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if not getattr(request, "htmx", False):
            return response
        if response.streaming or response.status_code in (204, 301, 302, 303, 304):
            return response
        if "HX-Redirect" in response or "HX-Location" in response:
            return response
        if not response.get("Content-Type", "").startswith("text/html"):
            return response
        messages = list(get_messages(request))
        if not messages:
            return response
        fragment = render_to_string("inc/messages.html", {"messages": messages, "oob": True}, request)
        response.content = response.content + fragment.encode()
        return response
