"""The delete pages of a space, a config and a session: a confirm page that says exactly what
goes (`sessions.teardown.inventory`), then the teardown job, followed on its page. A teardown
that failed leaves the object and says what stayed; the same page tries again.

The space's delete page is routed as `console:space_delete` (console/urls.py names it: the
console app cannot import sandboxes).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from console.access import get_space_for_user
from console.models import Role, Space
from console.services import ServiceError, actor_from_request

from ..catalog.lookups import get_config_for_user
from ..models import SandboxConfig, Session
from .access import get_session_for_user
from .teardown import (
    KIND_CONFIG,
    KIND_SESSION,
    KIND_SPACE,
    inventory,
    last_failed_teardown,
    running_teardown,
    start_teardown,
)


def _delete_page(
    request: HttpRequest,
    target: Space | SandboxConfig | Session,
    *,
    kind: str,
    space: Space,
    label: str,
    consequences: list[str],
    section: str,
    confirm_field: dict[str, str] | None = None,
) -> HttpResponse:
    """GET: the confirm page (or the running teardown's job); POST: start the teardown."""
    target_id = str(target.pk)
    if request.method == "POST":
        if (
            confirm_field is not None
            and request.POST.get(confirm_field["name"], "").strip() != confirm_field["expected"]
        ):
            messages.error(request, f"Type {confirm_field['expected']} to confirm.")
        else:
            try:
                job = start_teardown(kind, space, target_id, actor=actor_from_request(request))
            except ServiceError as exc:
                messages.error(request, exc.message)
                return redirect(target)
            messages.success(
                request, f"Deleting {label}: follow it here; the rows go once its backends hold nothing of it."
            )
            return redirect(job)
    running = running_teardown(kind, target_id)
    if running is not None:
        return redirect(running)
    failed = last_failed_teardown(kind, target_id)
    lines = list(consequences)
    if failed is not None:
        lines.insert(0, f"The last attempt stopped: {failed.error} Deleting again tries what is left.")
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": label,
            "action_label": "Delete again" if failed is not None else "Delete",
            "consequences": lines,
            "confirm_field": confirm_field,
            "cancel_url": target.get_absolute_url(),
            "section": section,
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def space_delete(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    return _delete_page(
        request,
        space,
        kind=KIND_SPACE,
        space=space,
        label=f"space {space.name}",
        consequences=["Its members lose access.", *inventory(space).lines("space")],
        confirm_field={"name": "confirm_slug", "expected": space.slug},
        section="spaces",
    )


@login_required
@require_http_methods(["GET", "POST"])
def config_delete(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    return _delete_page(
        request,
        config,
        kind=KIND_CONFIG,
        space=config.space,
        label=f"sandbox config {config.name}",
        consequences=inventory(config.space, config).lines("config"),
        section="sandboxes",
    )


@login_required
@require_http_methods(["GET", "POST"])
def session_delete(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.ADMIN)
    return _delete_page(
        request,
        session,
        kind=KIND_SESSION,
        space=session.space,
        label=f"session {session.key}",
        consequences=[
            f"Its sandbox ({session.sandbox_id[:12] or 'none bound now'}), any leftover sandbox of it, its binding, "
            + ("its persistent /workspace volume, " if session.has_persistent_workspace else "")
            + "its artifacts and its row.",
            "The skill-image snapshot it ran from, when that is an old generation nothing else uses.",
            "This runs as a job; anything that cannot be deleted is named in its log and the session stays.",
        ],
        section="sessions",
    )
