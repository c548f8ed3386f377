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
from django.views.decorators.http import require_http_methods

from console.access import require_platform_admin
from console.services import ServiceError, actor_from_request
from console.views import apply_form_errors

from ..catalog.platform import BACKEND_FIELDS, do_create_platform_backend, do_update_platform_backend
from ..models import PlatformBackend
from .forms import PlatformBackendForm


def _secrets(form: PlatformBackendForm) -> dict[str, Any]:
    return {name: form.cleaned_data.get(name) for name in ("api_key", "tls_ca", "tls_cert", "tls_key", "clear_tls")}


@login_required
def backend_list(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    backends = PlatformBackend.objects.annotate(config_count=Count("configs", distinct=True)).prefetch_related("spaces")
    return render(request, "sandboxes/backend_list.html", {"backends": backends, "section": "backends"})


@login_required
@require_http_methods(["GET", "POST"])
def backend_create(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request.user)
    return _backend_form(request, None)


@login_required
@require_http_methods(["GET", "POST"])
def backend_edit(request: HttpRequest, backend_id: str) -> HttpResponse:
    require_platform_admin(request.user)
    return _backend_form(request, get_object_or_404(PlatformBackend, pk=backend_id))


def _backend_form(request: HttpRequest, backend: PlatformBackend | None) -> HttpResponse:
    """The register (no `backend`) and edit page: the form, and on a valid POST the write."""
    form = PlatformBackendForm(request.POST or None, instance=backend)
    if request.method == "POST" and form.is_valid():
        fields: dict[str, Any] = {
            "data": {k: form.cleaned_data[k] for k in BACKEND_FIELDS},
            "secrets": _secrets(form),
            "spaces": list(form.cleaned_data["spaces"]),
            "actor": actor_from_request(request),
        }
        try:
            if backend is None:
                saved = do_create_platform_backend(**fields)
            else:  # the form changed `backend` as it validated: the service gets the stored row
                saved = do_update_platform_backend(PlatformBackend.objects.get(pk=backend.pk), **fields)
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, f"Backend {saved.name} {'registered' if backend is None else 'saved'}.")
            return redirect("sandboxes:backend_list")
    context: dict[str, Any] = {"form": form, "section": "backends"}
    if backend is not None:
        context |= {"backend": backend, "configs": backend.configs.select_related("space")}
    return render(request, "sandboxes/backend_form.html", context, status=400 if form.errors else 200)
