"""Pages of the platform's Users section (platform admins; anyone else gets 404) and the
public page of an invitation link (choose a password)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import SetPasswordForm
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from .access import require_platform_admin
from .forms import UserCreateForm, UserFilterForm
from .models import Invitation
from .services import ServiceError, actor_from_request
from .users import (
    IssuedInvite,
    credentials_held_by,
    do_accept_invite,
    do_create_user,
    do_deactivate_user,
    do_reactivate_user,
    do_reissue_invite,
    filter_by_status,
    usable_invitation,
    user_status,
)
from .views import apply_form_errors, paginate, query_without_page, swaps


def _user(user_id: int) -> Any:
    return get_object_or_404(get_user_model(), pk=user_id)


def _base_url(request: HttpRequest) -> str:
    return f"{request.scheme}://{request.get_host()}"


@login_required
@require_safe
def user_list(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    form = UserFilterForm(request.GET or None)
    users = get_user_model().objects.all()
    query = status = ""
    if form.is_valid():
        query = form.cleaned_data["q"].strip()
        status = form.cleaned_data["status"]
        if query:
            users = users.filter(
                Q(username__icontains=query)
                | Q(email__icontains=query)
                | Q(first_name__icontains=query)
                | Q(last_name__icontains=query)
            )
        users = filter_by_status(users, status)
    page = paginate(request, users.order_by("username"))
    for user in page.object_list:
        user.status = user_status(user)
    context = {
        "page": page,
        "form": form,
        "query": query,
        "status": status,
        "filtered": bool(query or status),
        "querystring": query_without_page(request),
        "section": "users",
    }
    if swaps(request, "user-results"):
        return render(request, "console/partials/user_results.html", context)
    return render(request, "console/user_list.html", context)


def _show_invite(request: HttpRequest, user: Any, issued: IssuedInvite, *, created: bool) -> HttpResponse:
    context = {
        "subject": user,
        "link": request.build_absolute_uri(issued.path()),
        "invitation": issued.invitation,
        "emailed": issued.emailed,
        "created": created,
        "section": "users",
    }
    return render(request, "console/user_invite_link.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def user_create(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    form = UserCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            issued = do_create_user(**form.cleaned_data, actor=actor_from_request(request), base_url=_base_url(request))
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            return _show_invite(request, issued.invitation.user, issued, created=True)
    return render(
        request, "console/user_form.html", {"form": form, "section": "users"}, status=400 if form.errors else 200
    )


@login_required
@require_safe
def user_detail(request: HttpRequest, user_id: int) -> HttpResponse:
    require_platform_admin(request.user)
    subject = _user(user_id)
    context = {
        "subject": subject,
        "status": user_status(subject),
        "memberships": subject.memberships.select_related("space"),
        "invitations": Invitation.objects.filter(user=subject)[:10],
        "is_self": subject.pk == request.user.pk,
        "now": timezone.now(),
        "section": "users",
    }
    return render(request, "console/user_detail.html", context)


@login_required
@require_POST
def user_invite(request: HttpRequest, user_id: int) -> HttpResponse:
    require_platform_admin(request.user)
    subject = _user(user_id)
    try:
        issued = do_reissue_invite(subject, actor=actor_from_request(request), base_url=_base_url(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect("console:user_detail", user_id=subject.pk)
    return _show_invite(request, subject, issued, created=False)


@login_required
@require_http_methods(["GET", "POST"])
def user_deactivate(request: HttpRequest, user_id: int) -> HttpResponse:
    """The confirm page lists the credentials in force the user made (API tokens): they are
    revoked with the user unless the platform admin ticks "keep them"."""
    require_platform_admin(request.user)
    subject = _user(user_id)
    if request.method == "POST":
        keep = request.POST.get("keep_credentials") == "on"
        try:
            done = do_deactivate_user(subject, actor=actor_from_request(request), keep_credentials=keep)
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            said = f"{subject.get_username()} deactivated; {done.sessions_ended} login session(s) ended"
            if done.credentials_revoked:
                said += f"; {done.credentials_revoked} API token(s) revoked"
            if done.credentials_kept:
                said += f"; {done.credentials_kept} API token(s) kept working"
            messages.success(request, said + ".")
        return redirect("console:user_detail", user_id=subject.pk)
    context = {
        "subject": subject,
        "credentials": credentials_held_by(subject),
        "is_self": subject.pk == request.user.pk,
        "section": "users",
    }
    return render(request, "console/user_deactivate.html", context)


@login_required
@require_POST
def user_reactivate(request: HttpRequest, user_id: int) -> HttpResponse:
    require_platform_admin(request.user)
    subject = _user(user_id)
    try:
        do_reactivate_user(subject, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{subject.get_username()} reactivated.")
    return redirect("console:user_detail", user_id=subject.pk)


@require_http_methods(["GET", "POST"])
def invite_accept(request: HttpRequest, token: str) -> HttpResponse:
    """The invitation link: choose a password (Django's validators), then logged in."""
    invitation = usable_invitation(token)
    if invitation is None:
        return render(request, "registration/invite_invalid.html", status=404)
    form = SetPasswordForm(invitation.user, request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = do_accept_invite(
                token, password=form.cleaned_data["new_password1"], source_ip=request.META.get("REMOTE_ADDR")
            )
        except ServiceError:
            return render(request, "registration/invite_invalid.html", status=404)
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.get_username()}: your password is set.")
        return redirect("console:dashboard")
    context = {"form": form, "invited": invitation.user, "expires": invitation.expires}
    return render(request, "registration/invite_accept.html", context, status=400 if form.errors else 200)
