"""Middleware of the console."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib.messages import get_messages
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string


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
