"""Pages for skills from git: import from a repository, the allowed hosts, and on a skill's
page checking for and importing a newer commit. Platform admins only (others 403); a skill
id that does not exist, or has no git source, is 404. Bad input is a form error, never a 500.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from console.services import ServiceError, actor_from_request

from ..forms import GitHostsForm, GitImportForm
from ..models import GitHostPolicy, GitSource
from ..views import require_platform_admin
from .services import check_git_source, do_set_git_hosts, git_policy, import_from_git, update_from_git


@login_required
@require_http_methods(["GET", "POST"])
def git_import(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request, "import skills")
    form = GitImportForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                result = import_from_git(data["url"], data["ref"], data["path"], actor=actor_from_request(request))
            except ServiceError as exc:
                form.add_error(None, exc.message)
            else:
                (messages.success if result.created else messages.info)(request, result.message)
                return redirect(result.version)
        status = 400
    policy = git_policy()
    context = {"form": form, "policy": policy, "hosts": sorted(policy.allowed_hosts), "section": "skills"}
    return render(request, "skills/git_import.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def git_hosts(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request, "set the allowed git hosts")
    row = GitHostPolicy.objects.filter(pk=1).first()
    initial = {
        "allowed_hosts": row.allowed_hosts if row else "",
        "allow_local_paths": bool(row and row.allow_local_paths),
    }
    form = GitHostsForm(request.POST or None, initial=initial)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            hosts = form.cleaned_data["allowed_hosts"].splitlines()
            try:
                do_set_git_hosts(
                    hosts, allow_local_paths=form.cleaned_data["allow_local_paths"], actor=actor_from_request(request)
                )
            except ServiceError as exc:
                form.add_error("allowed_hosts", exc.message)
            else:
                messages.success(request, "Allowed git hosts saved.")
                return redirect("skills:git_hosts")
        status = 400
    return render(request, "skills/git_hosts.html", {"form": form, "section": "skills"}, status=status)


def _source(request: HttpRequest, skill_id: str, what: str) -> GitSource:
    require_platform_admin(request, what)
    return get_object_or_404(GitSource.objects.select_related("skill"), skill_id=skill_id)


@login_required
@require_http_methods(["POST"])
def source_check(request: HttpRequest, skill_id: str) -> HttpResponse:
    """Ask the repository for the ref's newest commit now (bounded by skills.git_check_timeout_s)."""
    source = check_git_source(_source(request, skill_id, "check skill sources"))
    if source.check_error:
        messages.error(request, f"Checking {source.url} failed: {source.check_error}")
    elif source.has_newer_commit:
        messages.info(request, f"A newer commit {source.remote_commit[:12]} is on {source.url}.")
    else:
        messages.success(request, f"Up to date with {source.url} (commit {source.commit[:12]}).")
    return redirect(source)


@login_required
@require_http_methods(["POST"])
def source_update(request: HttpRequest, skill_id: str) -> HttpResponse:
    """Import the ref's newest commit as a new version."""
    source = _source(request, skill_id, "update skills")
    try:
        result = update_from_git(source, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect(source)
    (messages.success if result.created else messages.info)(request, result.message)
    return redirect(result.version.skill)
