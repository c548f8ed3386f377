"""The sessions list's actions and live figures: the confirmation page of an action on ticked
sessions (or one row's), the job that runs it (its progress inline with HTMX, else its job
page), and the CPU and memory cells of the running rows."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from console.jobs import job_label
from console.services import ServiceError, actor_from_request
from console.views import is_htmx

from ..models import Session
from .bulk import MAX_SESSIONS, UNCONFIRMED, action_label, plan_actions, run_step, start_actions
from .listing import visible_spaces
from .stats import read_usage


def _back(request: HttpRequest) -> str:
    """Where the list was (its filters and page), else the list."""
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return reverse("sandboxes:session_list")


@login_required
@require_POST
def session_bulk(request: HttpRequest) -> HttpResponse:
    """POST from the list: a row's button (`row` = "action:id") or the ticked sessions
    (`session`) with `action`. Without `confirm` it shows what will happen, changing nothing
    (a row's pause or resume runs at once, one engine call); with it, it starts the job that
    does it: HTMX gets the job's progress and outcomes in place of the confirmation, a plain
    post goes to the job's page."""
    row = request.POST.get("row", "")
    if row:
        action, _, session_id = row.partition(":")
        ids = [session_id]
    else:
        action, ids = request.POST.get("action", ""), request.POST.getlist("session")
    back = _back(request)
    try:
        steps = plan_actions(request.user, action, ids)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect(back)
    actor = actor_from_request(request)
    if row and action in UNCONFIRMED:
        (step,) = steps
        if step.skip:
            messages.info(request, f"{step.session.key}: nothing to do, {step.skip}.")
        else:
            outcome = run_step(action, step.session, actor=actor)
            (messages.success if outcome.ok else messages.error)(request, outcome.message)
        return redirect(back)
    context: dict[str, Any] = {
        "action": action,
        "action_label": action_label(action),
        "doing": [step for step in steps if not step.skip],
        "skipped": [step for step in steps if step.skip],
        "back": back,
        "section": "sessions",
    }
    if request.POST.get("confirm") != "1":
        return render(request, "sandboxes/session_actions_confirm.html", context)
    if not context["doing"]:
        messages.info(request, "Nothing to do: no ticked session fits this action.")
        return redirect(back)
    job = start_actions(action, steps, actor=actor)
    said = f"{action_label(action)}: {len(context['doing'])} session{'s' if len(context['doing']) != 1 else ''}."
    if not is_htmx(request):
        messages.info(request, f"{said} Each session's outcome is listed below as the job goes.")
        return redirect(job)
    context |= {"job": job, "label": job_label(job.kind), "can_cancel": False, "said": said}
    return render(request, "sandboxes/partials/session_actions_job.html", context)


@login_required
@require_safe
def session_usage(request: HttpRequest) -> HttpResponse:
    """CPU and memory of the list's running rows (`?id=`…, at most a page or two), as cells
    swapped in by id. Sessions of other tenants are left out like unknown ids."""
    ids = request.GET.getlist("id")[:MAX_SESSIONS]
    spaces = [visible.space.id for visible in visible_spaces(request.user)]
    sessions = list(Session.objects.select_related("config__backend").filter(pk__in=_valid(ids), space__in=spaces))
    figures = read_usage(sessions)
    rows = [(session, figures.get(str(session.id))) for session in sessions]
    return render(request, "sandboxes/partials/session_usage.html", {"rows": rows})


def _valid(ids: list[str]) -> list[str]:
    valid = []
    for value in ids:
        try:
            valid.append(str(uuid.UUID(value)))
        except ValueError:
            continue
    return valid
