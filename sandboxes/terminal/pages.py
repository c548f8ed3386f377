"""The web terminal's pages: the terminal page and the ticket endpoint.

Viewer policy: a terminal is a shell, so it needs the member role. Viewers see the page with
a notice and no terminal; the ticket endpoint answers them 403. Outsiders get 404.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console.access import get_space_for_user, has_role
from console.models import Role
from console.security import csp_inline_styles

from ..backends.base import RemoteError
from ..catalog.bridge import get_backend
from ..models import Session, Terminal
from .tickets import TooManyShells, create_terminal, issue_ticket, reticket_room
from .tuning import TERMINAL


def _session_for(user: Any, session_id: Any, role: Role) -> Session:
    session = get_object_or_404(Session.objects.select_related("space", "config"), pk=session_id)
    get_space_for_user(user, session.space_id, role)
    return session


def _has_pty(session: Session) -> bool:
    try:
        return get_backend(session.config).pty() is not None
    except RemoteError:
        return False


@login_required
@require_GET
@csp_inline_styles  # xterm.js styles its cells with <style> elements and style attributes
def terminal_page(request: HttpRequest, session_id: Any) -> HttpResponse:
    session = _session_for(request.user, session_id, Role.VIEWER)
    can_open = has_role(request.user, session.space, Role.MEMBER)
    # Opening a terminal never rebuilds: on a stale session the page asks first.
    ask_stale = can_open and session.is_stale and request.GET.get("as_is") != "1"
    return render(
        request,
        "sandboxes/terminal.html",
        {
            "session": session,
            "space": session.space,
            "can_open": can_open,
            "pty_supported": _has_pty(session),
            "ask_stale": ask_stale,
            "rebuild_url": reverse("sandboxes:session_action", kwargs={"session_id": session.id, "action": "rebuild"}),
            "create_url": reverse("sandboxes:terminal_create", kwargs={"session_id": session.id}),
            "reattach_s": TERMINAL.reattach_s,
            "section": "sessions",
        },
    )


@require_POST
def terminal_create(request: HttpRequest, session_id: Any) -> JsonResponse:
    """Create a terminal (or re-ticket the caller's open one: `terminal_id`) and return a
    single-use websocket ticket. CSRF-protected (Django's middleware)."""
    if not request.user.is_authenticated:
        return JsonResponse({"error": "Log in first."}, status=401)
    try:
        session = _session_for(request.user, session_id, Role.MEMBER)
    except Http404:
        return JsonResponse({"error": "No such session."}, status=404)
    except PermissionDenied:
        return JsonResponse({"error": "Terminals need the member role in this space."}, status=403)
    if not _has_pty(session):
        return JsonResponse({"error": "This sandbox backend has no interactive terminals."}, status=409)
    existing_id = request.POST.get("terminal_id", "").strip()
    if existing_id:
        try:
            terminal_id = uuid.UUID(existing_id)
        except ValueError:
            return JsonResponse({"error": "No such terminal."}, status=404)
        terminal = Terminal.objects.filter(pk=terminal_id, session=session, user=request.user).first()
        if terminal is None:
            return JsonResponse({"error": "No such terminal."}, status=404)
        if terminal.closed is not None:
            return JsonResponse({"error": f"The terminal was closed: {terminal.close_reason}"}, status=410)
        try:
            reticket_room(terminal)
        except TooManyShells as exc:
            return JsonResponse({"error": str(exc)}, status=429)
        status = 200
    else:
        try:
            terminal = create_terminal(request.user, session)
        except IntegrityError:  # the session was deleted since it was read
            return JsonResponse({"error": "No such session."}, status=404)
        except TooManyShells as exc:
            return JsonResponse({"error": str(exc)}, status=429)
        status = 201
    ticket = issue_ticket(terminal)
    scheme = "wss" if request.is_secure() else "ws"
    path = f"/ws/terminals/{terminal.id}/"
    return JsonResponse(
        {"terminal_id": str(terminal.id), "ws_url": f"{scheme}://{request.get_host()}{path}", "ticket": ticket},
        status=status,
    )
