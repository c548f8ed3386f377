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
from console.models import AdminJob, Role
from console.services import ServiceError, actor_from_request

from ..catalog.lookups import get_config_for_user
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


def _confirm(
    request: HttpRequest,
    *,
    kind: str,
    target_id: str,
    label: str,
    consequences: list[str],
    cancel_url: str,
    section: str,
    confirm_field: dict[str, str] | None = None,
) -> HttpResponse:
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
            "cancel_url": cancel_url,
            "section": section,
        },
    )


def _started(request: HttpRequest, job: AdminJob, what: str) -> HttpResponse:
    messages.success(request, f"Deleting {what}: follow it here; the rows go once its backends hold nothing of it.")
    return redirect(job)


@login_required
@require_http_methods(["GET", "POST"])
def space_delete(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    if request.method == "POST":
        if request.POST.get("confirm_slug", "").strip() != space.slug:
            messages.error(request, f"Type the space's slug ({space.slug}) to confirm.")
        else:
            try:
                job = start_teardown(KIND_SPACE, space, str(space.pk), actor=actor_from_request(request))
            except ServiceError as exc:
                messages.error(request, exc.message)
                return redirect(space)
            return _started(request, job, f"space {space.name}")
    return _confirm(
        request,
        kind=KIND_SPACE,
        target_id=str(space.pk),
        label=f"space {space.name}",
        consequences=["Its members lose access.", *inventory(space).lines("space")],
        confirm_field={"name": "confirm_slug", "expected": space.slug},
        cancel_url=space.get_absolute_url(),
        section="spaces",
    )


@login_required
@require_http_methods(["GET", "POST"])
def config_delete(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    if request.method == "POST":
        try:
            job = start_teardown(KIND_CONFIG, config.space, str(config.pk), actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
            return redirect(config)
        return _started(request, job, f"config {config.name}")
    return _confirm(
        request,
        kind=KIND_CONFIG,
        target_id=str(config.pk),
        label=f"sandbox config {config.name}",
        consequences=inventory(config.space, config).lines("config"),
        cancel_url=config.get_absolute_url(),
        section="sandboxes",
    )


@login_required
@require_http_methods(["GET", "POST"])
def session_delete(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.ADMIN)
    if request.method == "POST":
        try:
            job = start_teardown(KIND_SESSION, session.space, str(session.pk), actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
            return redirect(session)
        return _started(request, job, f"session {session.key}")
    return _confirm(
        request,
        kind=KIND_SESSION,
        target_id=str(session.pk),
        label=f"session {session.key}",
        consequences=[
            f"Its sandbox ({session.sandbox_id[:12] or 'none bound now'}), any leftover sandbox of it, its binding, "
            + ("its persistent /workspace volume, " if session.has_persistent_workspace else "")
            + "its artifacts and its row.",
            "The skill-image snapshot it ran from, when that is an old generation nothing else uses.",
            "This runs as a job; anything that cannot be deleted is named in its log and the session stays.",
        ],
        cancel_url=session.get_absolute_url(),
        section="sessions",
    )
