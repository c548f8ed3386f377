"""Pages of a config's template catalog: templates and snapshots, builds and deletes."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_safe

from console.access import has_role, is_platform_admin
from console.jobs import start_job
from console.models import Role
from console.services import ServiceError, actor_from_request

from ..backends.base import RemoteError
from ..models import SandboxConfig
from .forms import TemplateBuildForm
from .lookups import failure_message, get_config_for_user, remote_error_message, template_ids
from .templates import (
    Catalog,
    CatalogItemForbidden,
    CatalogItemNotFound,
    do_delete_snapshot,
    do_delete_template,
    load_catalog,
    snapshot_users,
)

# --- Templates and snapshots -------------------------------------------------------------


def _load_catalog(config: SandboxConfig) -> Catalog:
    try:
        catalog = load_catalog(config)
    except RemoteError as exc:
        return Catalog(error=remote_error_message(exc))
    catalog.users = {s.snapshot_id: snapshot_users(config, s.snapshot_id, s.labels) for s in catalog.snapshots}
    return catalog


@login_required
@require_safe
def template_list(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id)
    context = {
        "config": config,
        "space": config.space,
        "catalog": _load_catalog(config),
        "is_admin": has_role(request.user, config.space, Role.ADMIN),
        "is_platform_admin": is_platform_admin(request.user),
        "section": "sandboxes",
    }
    return render(request, "sandboxes/template_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def template_build(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    choices = template_ids(config)
    if choices is None:
        messages.error(request, "This backend's templates cannot be listed or built from the console right now.")
        return redirect("sandboxes:template_list", config_id=config.id)
    form = TemplateBuildForm(
        request.POST or None, template_choices=choices, offer_platform=is_platform_admin(request.user)
    )
    if request.method == "POST" and form.is_valid():
        job = start_job(
            "sandboxes.build_template",
            actor=actor_from_request(request),
            space=config.space,
            params={
                "config_id": str(config.id),
                "name": form.cleaned_data["name"],
                "description": form.cleaned_data["description"],
                "debian_packages": form.cleaned_data["debian_packages"],
                "base_template_id": form.cleaned_data["base_template_id"],
                "script": form.cleaned_data["script"],
                # Only a platform admin's form has the field: anyone else's build is the space's own.
                "platform_template": bool(form.cleaned_data.get("platform_template")),
            },
        )
        return redirect(job)
    return render(
        request,
        "sandboxes/template_form.html",
        {"form": form, "config": config, "space": config.space, "section": "sandboxes"},
        status=400 if form.errors else 200,
    )


def _catalog_delete(request: HttpRequest, config_id: str, what: str) -> HttpResponse:
    """Confirm and delete one of the space's own templates or snapshots. Another tenant's is
    a 404 whether linked or forged (checked in sandboxes.catalog); one in use says by what."""
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    item_id = (request.POST.get("id") or request.GET.get("id") or "").strip()
    back = reverse("sandboxes:template_list", kwargs={"config_id": config.id})
    if not item_id:
        messages.error(request, f"Which {what}? No id was given.")
        return redirect(back)
    actor = actor_from_request(request)
    force = request.POST.get("force") == "1"
    if request.method == "POST":
        try:
            if what == "template":
                do_delete_template(config, item_id, actor=actor)
            else:
                do_delete_snapshot(config, item_id, actor=actor, force=force)
        except CatalogItemNotFound as exc:
            raise Http404(exc.message) from None
        except CatalogItemForbidden as exc:
            raise PermissionDenied(exc.message) from None
        except (RemoteError, ServiceError) as exc:
            messages.error(request, failure_message(exc))
        else:
            messages.success(request, f"{what.capitalize()} {item_id} deleted.")
        return redirect(back)
    users: list[str] = []
    try:
        catalog = load_catalog(config)
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
        return redirect(back)
    if what == "template":
        if item_id not in {t.template_id for t in catalog.templates}:
            raise Http404(f"No template {item_id} in this space.")
        if item_id not in catalog.own_templates and not is_platform_admin(request.user):
            raise PermissionDenied(f"{item_id} is a platform template: only platform admins can delete it.")
        consequences = [
            "Refused while live sandboxes use it.",
            "Configs that name it as default template stop working.",
        ]
    else:
        snapshot = next((s for s in catalog.snapshots if s.snapshot_id == item_id), None)
        if snapshot is None:
            raise Http404(f"No snapshot {item_id} in this space.")
        users = snapshot_users(config, item_id, snapshot.labels)
        consequences = ["Sandboxes already created from it keep running."]
        if users:
            consequences.insert(0, "It is still used by " + "; ".join(users) + ": release it first.")
            if is_platform_admin(request.user):
                consequences.append(
                    "As a platform admin you can force it: skill images recorded on it fall back to their "
                    "config's default template."
                )
    hidden = {"id": item_id}
    if users and is_platform_admin(request.user):
        hidden["force"] = "1"
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"{what} {item_id}",
            "consequences": consequences,
            "hidden": hidden,
            "cancel_url": back,
            "blocked": bool(users) and not is_platform_admin(request.user),
            "section": "sandboxes",
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def template_delete(request: HttpRequest, config_id: str) -> HttpResponse:
    return _catalog_delete(request, config_id, "template")


@login_required
@require_http_methods(["GET", "POST"])
def snapshot_delete(request: HttpRequest, config_id: str) -> HttpResponse:
    return _catalog_delete(request, config_id, "snapshot")
