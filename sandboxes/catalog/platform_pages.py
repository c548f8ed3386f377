"""Pages of the platform's Backends section: list, register, edit and grant (platform admins).

Anyone else gets 404, so the section's existence is not revealed to space admins.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from console.access import require_platform_admin
from console.services import ServiceError, actor_from_request
from console.views import apply_form_errors, is_htmx, swaps

from ..backends import BACKEND_CLASSES, describe
from ..backends.base import Finding
from ..models import PlatformBackend
from .bridge import preflight
from .by_kind import kind_step
from .forms import BACKEND_SECRETS, PlatformBackendForm
from .platform import check_platform_backend, do_create_platform_backend, do_update_platform_backend


@login_required
def backend_list(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    backends = list(
        PlatformBackend.objects.annotate(config_count=Count("configs", distinct=True)).prefetch_related("spaces")
    )
    for backend in backends:  # which limits apply: the settings its kind declares
        backend.kind_settings = describe(backend.kind)  # type: ignore[attr-defined]
    return render(request, "sandboxes/backend_list.html", {"backends": backends, "section": "backends"})


def _backend_form(request: HttpRequest, backend: PlatformBackend | None) -> tuple[PlatformBackendForm, bool]:
    """The form for the kind the request names (or the backend's), and whether to save: the
    kind decides the fields, as for a config (`by_kind`)."""
    data = request.POST if request.method == "POST" else request.GET
    posted = str(data.get("kind") or "")
    kind = posted if posted in BACKEND_CLASSES else ""
    if not posted and backend is not None:
        kind = backend.kind
    step = kind_step(request, PlatformBackendForm, kind, secrets=BACKEND_SECRETS)
    if step.save:
        return PlatformBackendForm(request.POST, kind=kind, instance=backend), True
    if request.method == "POST" and posted and not kind:
        form = PlatformBackendForm(request.POST, instance=backend)
        form.is_valid()  # a kind that does not exist becomes the field's error
        return form, False
    return PlatformBackendForm(initial=step.initial, kind=kind or None, instance=backend), False


def _render_backend_form(request: HttpRequest, context: dict[str, Any], form: PlatformBackendForm) -> HttpResponse:
    context = {**context, "form": form, "section": "backends"}
    status = 400 if form.errors else 200
    if swaps(request, "backend-form"):
        return render(request, "sandboxes/partials/backend_form.html", context, status=status)
    return render(request, "sandboxes/backend_form.html", context, status=status)


def _saved(request: HttpRequest) -> HttpResponse:
    url = reverse("sandboxes:backend_list")
    return HttpResponseClientRedirect(url) if is_htmx(request) else redirect(url)


@login_required
@require_http_methods(["GET", "POST"])
def backend_create(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    return _backend_page(request, None)


@login_required
@require_http_methods(["GET", "POST"])
def backend_edit(request: HttpRequest, backend_id: str) -> HttpResponse:
    require_platform_admin(request.user)
    return _backend_page(request, get_object_or_404(PlatformBackend, pk=backend_id))


@login_required
@require_POST
def backend_test(request: HttpRequest, backend_id: str) -> HttpResponse:
    """Test connection of a platform backend on its own account: what its adapter finds beyond
    health (`Backend.preflight`: a cluster's parts and permissions), said on its page."""
    require_platform_admin(request.user)
    backend = get_object_or_404(PlatformBackend, pk=backend_id)
    findings = preflight(backend)
    if findings:
        report_findings(request, backend.name, findings)
    else:
        messages.info(request, f"{backend.name}: its kind checks nothing beyond health; test a config on it.")
    url = reverse("sandboxes:backend_edit", args=[backend.pk])
    return HttpResponseClientRedirect(url) if is_htmx(request) else redirect(url)


def _backend_page(request: HttpRequest, backend: PlatformBackend | None) -> HttpResponse:
    """The register (no `backend`) and edit page: the form, and on a valid POST the write."""
    form, save = _backend_form(request, backend)
    if save and form.is_valid():
        fields: dict[str, Any] = {
            "data": form.backend_data(),
            "secrets": form.secret_values(),
            "spaces": list(form.cleaned_data["spaces"]),
            "actor": actor_from_request(request),
        }
        # What the adapter finds of the account with these settings (a cluster's parts and
        # permissions): one it cannot reach is not saved; what else it lacks is said after saving.
        findings = check_platform_backend(backend, data=fields["data"], secrets=fields["secrets"])
        if findings and not findings[0].ok:
            form.add_error(None, f"Not saved: {findings[0].detail}")
            return _render_backend_form(request, _backend_context(backend), form)
        try:
            if backend is None:
                saved = do_create_platform_backend(**fields)
            else:  # the form changed `backend` as it validated: the service gets the stored row
                saved = do_update_platform_backend(PlatformBackend.objects.get(pk=backend.pk), **fields)
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, f"Backend {saved.name} {'registered' if backend is None else 'saved'}.")
            report_findings(request, saved.name, findings)
            return _saved(request)
    return _render_backend_form(request, _backend_context(backend), form)


def _backend_context(backend: PlatformBackend | None) -> dict[str, Any]:
    if backend is None:
        return {}
    return {"backend": backend, "configs": backend.configs.select_related("space")}


def report_findings(request: HttpRequest, name: str, findings: list[Finding]) -> None:
    """Each failed finding as a warning (an error when sessions cannot run without it), and how
    many passed."""
    if not findings:
        return
    failed = [f for f in findings if not f.ok]
    for finding in failed:
        level = messages.ERROR if finding.blocking else messages.WARNING
        messages.add_message(request, level, f"{name}: {finding.name}: {finding.detail}")
    passed = len(findings) - len(failed)
    summary = f"{name}: {passed} of {len(findings)} checks passed"
    details = "; ".join(f"{f.name}: {f.detail}" for f in findings if f.ok)
    messages.info(request, f"{summary} ({details})." if details else f"{summary}.")
