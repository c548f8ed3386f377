"""The session page's inbound part: the URL of a sandbox port (with a copy button), the
traffic token for members, and signed links for browsers (a POST: a link is a credential,
issued and audited by `do_issue_inbound_link`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from console.crypto import decrypt
from console.models import Role
from console.services import ServiceError, actor_from_request

from ..backends.base import RemoteError
from ..catalog.lookups import remote_error_message
from ..models import Session
from ..sessions.access import get_session_for_user
from ..sessions.panels import FILES, SessionPanel
from ..sessions.tuning import SESSIONS
from .links import do_issue_inbound_link, inbound_on, inbound_url

DEFAULT_PORT = 8000


def port_of(value: str | None, default: int = DEFAULT_PORT) -> tuple[int, str]:
    """A port from a form field, and the error in words ("" when fine)."""
    if value in (None, ""):
        return default, ""
    try:
        port = int(value)
    except ValueError:
        return default, "A port is a whole number from 1 to 65535."
    if not 1 <= port <= 65535:
        return default, "A port is a whole number from 1 to 65535."
    return port, ""


def inbound_context(request: HttpRequest, session: Session, *, can_use: bool) -> dict[str, Any]:
    """What the page's Inbound card shows (no backend call: URLs are composed, not asked)."""
    port, error = port_of(request.GET.get("port"))
    context: dict[str, Any] = {
        "port": port,
        "error": error,
        "on": inbound_on(session.space_id),
        "url": None,
        "problem": "",
        "ttl_minutes": SESSIONS.inbound_link_default_ttl_s // 60,
        "max_ttl_minutes": SESSIONS.inbound_link_max_ttl_s // 60,
    }
    try:
        url = inbound_url(session, port)
    except ServiceError as exc:
        context["problem"] = exc.message
        return context
    except RemoteError as exc:
        context["problem"] = remote_error_message(exc)
        return context
    context["url"] = url
    context["absolute_url"] = request.build_absolute_uri(url.url)
    if can_use:
        context["token"] = decrypt(session.traffic_token_encrypted)
    return context


# The session page's Inbound card, after its Files (registered in SandboxesConfig.ready()).
SESSION_PANEL = SessionPanel(
    "inbound",
    "sandboxes/partials/session_inbound.html",
    lambda request, session, can_use: {"inbound": inbound_context(request, session, can_use=can_use)},
    after=FILES,
)


@login_required
@require_POST
def session_inbound_link(request: HttpRequest, session_id: str) -> HttpResponse:
    """Issue a signed link to a port of the session's sandbox (members and up)."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    port, error = port_of(request.POST.get("port"))
    minutes, minutes_error = port_of(request.POST.get("minutes"), SESSIONS.inbound_link_default_ttl_s // 60)
    context: dict[str, Any] = {"session": session, "space": session.space, "port": port, "section": "sessions"}
    status = 200
    if error or minutes_error:
        context["error"] = error or "Give the link's lifetime in whole minutes."
        status = 400
    else:
        try:
            link, expires_at = do_issue_inbound_link(session, port, minutes * 60, actor=actor_from_request(request))
            context.update(
                link=request.build_absolute_uri(link),
                expires_at=expires_at,
                expires_at_text=datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            )
        except ServiceError as exc:
            context["error"], status = exc.message, 400
        except RemoteError as exc:
            context["error"], status = remote_error_message(exc), 502
    template = (
        "sandboxes/partials/inbound_link.html"
        if request.headers.get("HX-Request")
        else "sandboxes/session_inbound_link.html"
    )
    return render(request, template, context, status=status)
