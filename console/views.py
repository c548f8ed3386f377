"""Pages of the console app: dashboard, spaces, members, network policy, audit, jobs.

Every page works without JavaScript (forms post and redirect); with HTMX, list pages swap
their results partial and forms swap themselves.
"""

from __future__ import annotations

import functools
from datetime import datetime, time, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.db.models import BigIntegerField, Count, DateTimeField, Q, QuerySet, UUIDField
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseStopPolling

from . import jobs as job_runner
from .access import get_space_for_user, has_role, is_platform_admin, spaces_for_user
from .forms import AuditFilterForm, MemberAddForm, MemberRoleForm, SpaceForm, SpaceLimitsForm
from .keyset import KeyPart, Keyset, keyset_page
from .models import AdminJob, AuditAction, AuditEvent, JobStatus, Membership, Role, Space, SpaceLimits
from .onboarding import onboarding_reads, onboarding_steps
from .panels import space_page_context
from .readings import RowCount, read_together
from .services import (
    ServiceError,
    actor_from_request,
    do_add_member,
    do_change_member_role,
    do_create_space,
    do_logout_everywhere,
    do_remove_member,
    do_update_space,
    do_update_space_limits,
)
from .tuning import LIMITS

PAGE_SIZE = 25
# The audit and jobs lists' keyset orders (console.keyset), held whole by the models' indexes.
AUDIT_ORDER = Keyset((KeyPart("time", DateTimeField()), KeyPart("id", BigIntegerField())))
JOB_ORDER = Keyset((KeyPart("created", DateTimeField()), KeyPart("id", UUIDField())))


def paginate(request: HttpRequest, queryset: QuerySet[Any], per_page: int = PAGE_SIZE) -> Page:
    return Paginator(queryset, per_page).get_page(request.GET.get("page"))


def query_without_page(request: HttpRequest) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


def is_htmx(request: HttpRequest) -> bool:
    return bool(getattr(request, "htmx", False))


def swaps(request: HttpRequest, target: str) -> bool:
    """Whether the request is HTMX's, swapping the element with this id (a list's results, a
    status card): the view answers with that part only."""
    return is_htmx(request) and request.headers.get("HX-Target") == target


def apply_form_errors(form: Any, error: ServiceError) -> None:
    for field_name, field_errors in error.field_errors.items():
        for message in field_errors:
            form.add_error(field_name if field_name in form.fields else None, message)
    if not error.field_errors:
        form.add_error(None, error.message)


# --- Dashboard ---------------------------------------------------------------------------


@login_required
@require_safe
def dashboard(request: HttpRequest) -> HttpResponse:
    """Counts, the getting-started path, the newest spaces and jobs: four queries after the
    login's own two (the counts and every step's checks are read together)."""
    spaces = spaces_for_user(request.user)
    since = timezone.now() - timedelta(hours=24)
    visible_jobs = jobs_for_user(request.user)
    recent_jobs = visible_jobs.select_related("space")
    show_system_jobs = request.GET.get("jobs") == "all"
    if not show_system_jobs:
        # Periodic passes would crowd out everything an admin started (one a minute each).
        recent_jobs = recent_jobs.exclude(kind__in=job_runner.housekeeping_kinds())
    admin_spaces = spaces_for_user(request.user, Role.ADMIN)
    values = read_together(
        request.user,
        {
            "space_count": RowCount(spaces),
            "member_count": RowCount(Membership.objects.filter(space__in=spaces).values("user").distinct()),
            "running_jobs": RowCount(visible_jobs.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING])),
            "failed_jobs": RowCount(visible_jobs.filter(status=JobStatus.FAILED, created__gte=since)),
            "audit_24h": RowCount(audit_for_user(request.user).filter(time__gte=since)),
            **onboarding_reads(request.user, admin_spaces),
        },
    )
    steps = onboarding_steps(request.user, values)
    context = {
        "space_count": values["space_count"],
        "member_count": values["member_count"],
        "running_jobs": values["running_jobs"],
        "failed_jobs": values["failed_jobs"],
        "audit_24h": values["audit_24h"],
        "recent_spaces": spaces.order_by("-created")[:5],
        "recent_jobs": recent_jobs[:5],
        "show_system_jobs": show_system_jobs,
        "steps": steps,
        "steps_done": sum(step.done for step in steps),
        "section": "dashboard",
    }
    return render(request, "console/dashboard.html", context)


# --- Spaces ------------------------------------------------------------------------------


@login_required
@require_safe
def space_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()
    spaces = spaces_for_user(request.user).annotate(member_count=Count("memberships", distinct=True))
    if query:
        spaces = spaces.filter(Q(name__icontains=query) | Q(slug__icontains=query) | Q(description__icontains=query))
    page = paginate(request, spaces.order_by("name"))
    context = {
        "page": page,
        "query": query,
        "querystring": query_without_page(request),
        "can_create": is_platform_admin(request.user),
        "section": "spaces",
    }
    if swaps(request, "space-results"):
        return render(request, "console/partials/space_results.html", context)
    return render(request, "console/space_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def space_create(request: HttpRequest) -> HttpResponse:
    if not is_platform_admin(request.user):
        raise PermissionDenied("Only platform admins create spaces.")
    form = SpaceForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            space = do_create_space(
                name=form.cleaned_data["name"],
                slug=form.cleaned_data["slug"],
                description=form.cleaned_data["description"],
                actor=actor_from_request(request),
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, f"Space {space.name} created. Its network policy starts closed.")
            return redirect(space)
    status = 400 if form.errors else 200
    return render(request, "console/space_form.html", {"form": form, "section": "spaces"}, status=status)


@login_required
@require_safe
def space_detail(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id)
    memberships = space.memberships.select_related("user").order_by("user__username")
    is_admin = has_role(request.user, space, Role.ADMIN)
    context = {
        "space": space,
        **space_page_context(request, space, is_admin=is_admin),  # what the other apps add
        "memberships": memberships,
        "is_admin": is_admin,
        "role": space.user_role,  # type: ignore[attr-defined]
        "add_form": MemberAddForm(),
        "role_choices": Role.choices,
        "recent_jobs": space.jobs.all()[:5],
        "section": "spaces",
    }
    return render(request, "console/space_detail.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def space_edit(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    form = SpaceForm(request.POST or None, instance=space)
    if request.method == "POST" and form.is_valid():
        try:
            do_update_space(
                Space.objects.get(pk=space.pk),
                name=form.cleaned_data["name"],
                slug=form.cleaned_data["slug"] or space.slug,
                description=form.cleaned_data["description"],
                actor=actor_from_request(request),
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, "Space saved.")
            return redirect("console:space_detail", space_id=space.id)
    status = 400 if form.errors else 200
    return render(
        request, "console/space_form.html", {"form": form, "space": space, "section": "spaces"}, status=status
    )


@login_required
@require_http_methods(["GET", "POST"])
def space_limits(request: HttpRequest, space_id: str) -> HttpResponse:
    """A space's quotas and rate limits: every member reads them, platform admins set them."""
    space = get_space_for_user(request.user, space_id)
    can_edit = is_platform_admin(request.user)
    if request.method == "POST" and not can_edit:
        raise PermissionDenied("Only platform admins set a space's limits.")
    limits = SpaceLimits.objects.filter(space=space).first() or SpaceLimits(space=space)
    initial = {name: getattr(limits, name) for name in SpaceLimits.LIMIT_FIELDS}
    form = SpaceLimitsForm(request.POST or None, initial=initial, defaults=LIMITS.space_defaults())
    if request.method == "POST" and form.is_valid():
        try:
            do_update_space_limits(
                space, actor=actor_from_request(request), **{n: form.cleaned_data[n] for n in SpaceLimits.LIMIT_FIELDS}
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, "Limits saved.")
            return redirect("console:space_limits", space_id=space.id)
    context = {
        "space": space,
        "form": form,
        "can_edit": can_edit,
        "effective": [
            (SpaceLimitsForm.LABELS[n], v, getattr(limits, n) is None) for n, v in limits.effective().items()
        ],
        "section": "spaces",
    }
    return render(request, "console/space_limits.html", context, status=400 if form.errors else 200)


# --- Members -----------------------------------------------------------------------------


@login_required
@require_POST
def member_add(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    form = MemberAddForm(request.POST)
    if form.is_valid():
        try:
            membership = do_add_member(
                space,
                user=form.cleaned_data["username"],
                role=Role(form.cleaned_data["role"]),
                actor=actor_from_request(request),
            )
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(
                request,
                f"{membership.user.get_username()} added as {membership.get_role_display()}.",
            )
    else:
        for errors in form.errors.values():
            for error in errors:
                messages.error(request, str(error))
    return redirect(reverse("console:space_detail", kwargs={"space_id": space.id}) + "#members")


def _membership(request: HttpRequest, space_id: str, membership_id: str) -> Membership:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    return get_object_or_404(Membership.objects.select_related("user", "space"), pk=membership_id, space=space)


@login_required
@require_POST
def member_role(request: HttpRequest, space_id: str, membership_id: str) -> HttpResponse:
    membership = _membership(request, space_id, membership_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a valid role.")
    else:
        try:
            do_change_member_role(membership, role=Role(form.cleaned_data["role"]), actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(
                request,
                f"{membership.user.get_username()} is now {Role(form.cleaned_data['role']).label}.",
            )
    return redirect(reverse("console:space_detail", kwargs={"space_id": membership.space_id}) + "#members")


@login_required
@require_http_methods(["GET", "POST"])
def member_remove(request: HttpRequest, space_id: str, membership_id: str) -> HttpResponse:
    membership = _membership(request, space_id, membership_id)
    back = reverse("console:space_detail", kwargs={"space_id": membership.space_id}) + "#members"
    if request.method == "POST":
        try:
            do_remove_member(membership, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"{membership.user.get_username()} removed from {membership.space.name}.")
        return redirect(back)
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"{membership.user.get_username()}'s membership of {membership.space.name}",
            "consequences": ["They lose access to this space at once, terminals included."],
            "action_label": "Remove",
            "cancel_url": back,
            "section": "spaces",
        },
    )


# --- Account -----------------------------------------------------------------------------


@login_required
@require_POST
def logout_everywhere(request: HttpRequest) -> HttpResponse:
    """End all of the user's login sessions (this one too) and close their terminals."""
    try:
        ended = do_logout_everywhere(request.user, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect("console:dashboard")
    logout(request)
    messages.success(request, f"Logged out everywhere: {ended} session(s) ended, terminals closed.")
    return redirect("login")


# --- Network policy ----------------------------------------------------------------------
# The policy page is sandboxes.network.pages.network_policy_edit (it shows what the space's
# configs can honour); console.urls routes it as console:network_policy_edit.


# --- Audit -------------------------------------------------------------------------------


def audit_for_user(user: Any) -> QuerySet[AuditEvent]:
    """Platform admins see every event; space admins see their spaces' events."""
    if is_platform_admin(user):
        return AuditEvent.objects.all()
    return AuditEvent.objects.filter(space__in=spaces_for_user(user, Role.ADMIN))


@login_required
@require_safe
def audit_list(request: HttpRequest) -> HttpResponse:
    events = audit_for_user(request.user)
    form = AuditFilterForm(request.GET or None, spaces=spaces_for_user(request.user, Role.ADMIN))
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        if data["space"]:
            events = events.filter(space=data["space"])
        if data["actor"]:
            events = events.filter(actor_name__icontains=data["actor"])
        if data["action"]:
            events = events.filter(action__startswith=data["action"])
        tz = timezone.get_current_timezone()
        if data["date_from"]:
            events = events.filter(time__gte=datetime.combine(data["date_from"], time.min, tz))
        if data["date_to"]:
            events = events.filter(time__lt=datetime.combine(data["date_to"] + timedelta(days=1), time.min, tz))
    elif form.is_bound:
        events = events.none()
    page = keyset_page(request, events, AUDIT_ORDER, per_page=50)
    context = {
        "page": page,
        "form": form,
        "actions": [
            (action, AuditAction(action).label if action in AuditAction.values else action)
            for action in audit_for_user(request.user)
            .order_by("action")
            .values_list("action", flat=True)
            .distinct()[:200]
        ],
        "section": "audit",
    }
    if swaps(request, "audit-results"):
        return render(request, "console/partials/audit_results.html", context)
    return render(request, "console/audit_list.html", context)


# --- Jobs --------------------------------------------------------------------------------


def jobs_for_user(user: Any) -> QuerySet[AdminJob]:
    """Platform admins see every job; others see the jobs of their spaces."""
    if is_platform_admin(user):
        return AdminJob.objects.all()
    return AdminJob.objects.filter(space__in=spaces_for_user(user))


@login_required
@require_safe
def job_list(request: HttpRequest) -> HttpResponse:
    jobs = jobs_for_user(request.user).select_related("space", "created_by")
    status = request.GET.get("status", "")
    if status in JobStatus.values:
        jobs = jobs.filter(status=status)
    kinds = job_runner.job_kinds()
    kind = request.GET.get("kind", "")
    if kind in dict(kinds):
        jobs = jobs.filter(kind=kind)
    else:
        kind = ""
    # Housekeeping passes (reaper, idle sweep) only when asked for: "all" or "only"; a
    # housekeeping kind chosen in the kind filter shows it too.
    housekeeping = request.GET.get("housekeeping", "")
    if kind in job_runner.housekeeping_kinds():
        housekeeping = housekeeping or "all"
    if housekeeping == "only":
        jobs = jobs.filter(kind__in=job_runner.housekeeping_kinds())
    elif housekeeping != "all":
        housekeeping = ""
        jobs = jobs.exclude(kind__in=job_runner.housekeeping_kinds())
    page = keyset_page(request, jobs, JOB_ORDER)
    context = {
        "page": page,
        "status": status,
        "housekeeping": housekeeping,
        "kind": kind,
        "kinds": kinds,
        "statuses": JobStatus.choices,
        "can_run_diagnostics": is_platform_admin(request.user),
        "section": "jobs",
    }
    if swaps(request, "job-results"):
        return render(request, "console/partials/job_results.html", context)
    return render(request, "console/job_list.html", context)


def get_job_for_user(user: Any, job_id: str, role: Role = Role.VIEWER) -> AdminJob:
    """A job of a space the user holds `role` in; platform jobs are for platform admins only."""
    job = get_object_or_404(AdminJob.objects.select_related("space", "created_by"), pk=job_id)
    if job.space is not None:
        get_space_for_user(user, job.space.id, role)
    elif not is_platform_admin(user) and not (job.created_by_id is not None and job.created_by_id == user.pk):
        # A platform job, or one that outlived its space (a space's deletion): its starter
        # still follows it.
        raise Http404("No such job")
    return job


@login_required
@require_safe
def job_detail(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_user(request.user, job_id)
    can_cancel = not job.is_finished and (
        is_platform_admin(request.user) or (job.space is not None and has_role(request.user, job.space, Role.ADMIN))
    )
    context = {
        "job": job,
        "label": job_runner.job_label(job.kind),
        "can_cancel": can_cancel,
        "section": "jobs",
    }
    if swaps(request, "job-status"):
        response = render(request, "console/partials/job_status.html", context)
        if job.is_finished:
            # 286 tells HTMX to stop polling; the final state is in this response.
            stop = HttpResponseStopPolling(response.content)
            return stop
        return response
    return render(request, "console/job_detail.html", context)


@login_required
@require_POST
def job_cancel(request: HttpRequest, job_id: str) -> HttpResponse:
    job = get_job_for_user(request.user, job_id, Role.ADMIN)
    try:
        job_runner.do_cancel_job(job, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, "Job cancelled.")
    return redirect(job)


@login_required
@require_POST
def diagnostics_start(request: HttpRequest) -> HttpResponse:
    if not is_platform_admin(request.user):
        raise PermissionDenied("Only platform admins run console diagnostics.")
    job = job_runner.start_job("console.diagnostics", actor=actor_from_request(request))
    messages.info(request, "Diagnostics started.")
    return redirect(job)


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico for clients that ask there (pages link static/favicon.svg): the same icon,
    cached for a day, with no login and no log line."""
    return HttpResponse(_favicon_bytes(), content_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


@functools.cache
def _favicon_bytes() -> bytes:
    from django.contrib.staticfiles import finders

    found = finders.find("favicon.svg")
    path = found[0] if isinstance(found, list) else found
    with open(str(path), "rb") as icon:
        return icon.read()
