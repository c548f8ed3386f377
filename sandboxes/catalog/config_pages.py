"""Pages of sandbox configs: list, create, detail, edit, delete, the connection test and the
verification job, and the capability matrix.

Backend failures never become a 500: a `RemoteError` is shown as a message with its kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseClientRedirect

from console.access import get_space_for_user, has_role, is_platform_admin, spaces_for_user
from console.jobs import start_job
from console.models import Role, Space
from console.panels import SpacePanel
from console.services import ServiceError, actor_from_request
from console.views import apply_form_errors, is_htmx, swaps

from ..backends import describe
from ..backends.base import DiskCapabilities, NetworkCapabilities, RemoteError
from ..backends.settings import Scope
from ..models import PlatformBackend, SandboxConfig
from .bridge import get_backend
from .by_kind import kind_step, secret_names
from .forms import SandboxConfigForm, chosen_backend
from .lookups import get_config_for_user, remote_error_message, template_ids
from .network import space_policy, unsupported_policy_switches
from .platform import granted_backends
from .services import do_create_config, do_update_config

# --- Configs -----------------------------------------------------------------------------


@login_required
@require_safe
def config_list(request: HttpRequest) -> HttpResponse:
    spaces = spaces_for_user(request.user).order_by("name")
    configs = (
        SandboxConfig.objects.filter(space__in=spaces)
        .select_related("space", "backend")
        .order_by("space__name", "name")
    )
    admin_space_ids = set(spaces_for_user(request.user, Role.ADMIN).values_list("id", flat=True))
    context = {
        "configs": configs,
        "spaces": spaces,
        "admin_space_ids": admin_space_ids,
        "is_platform_admin": is_platform_admin(request.user),
        "section": "sandboxes",
    }
    return render(request, "sandboxes/config_list.html", context)


BASE_TEMPLATE = "sandbox-console/base:latest"


def _template_choices(space: Space, backend: PlatformBackend, config: SandboxConfig | None) -> list[str] | None:
    """The picker's templates on `backend` (an unsaved config on it when creating)."""
    if config is not None and config.backend_id == backend.pk:
        return template_ids(config)
    return template_ids(SandboxConfig(space=space, backend=backend, name="", default_template=""))


def _config_form(request: HttpRequest, space: Space, config: SandboxConfig | None) -> tuple[SandboxConfigForm, bool]:
    """The form for the backend the request names (or the config's), and whether to save.

    The backend's kind decides the fields (`by_kind`): changing it re-renders the form with
    that kind's fields before anything is saved."""
    data = request.POST if request.method == "POST" else request.GET
    backends = granted_backends(space)
    backend = chosen_backend(space, data.get("backend"))
    if backend is None and config is not None and not data.get("backend"):
        backend = config.backend
    if backend is None and not data.get("backend") and backends.count() == 1:
        backend = backends.first()  # one choice: no first step
    initial: dict[str, Any] = {} if config is not None else {"default_template": BASE_TEMPLATE}
    options: dict[str, Any] = {"space": space, "backend": backend, "instance": config}
    if backend is not None:
        options["template_choices"] = _template_choices(space, backend, config)
    step = kind_step(request, SandboxConfigForm, str(backend.pk) if backend else "", secrets=secret_names(Scope.CONFIG))
    if step.save:
        return SandboxConfigForm(request.POST, **options), True
    if request.method == "POST" and data.get("backend") and backend is None:
        form = SandboxConfigForm(request.POST, **options)
        form.is_valid()  # the forged or withdrawn backend becomes the field's error
        return form, False
    return SandboxConfigForm(initial={**initial, **step.initial}, **options), False


def _render_config_form(
    request: HttpRequest, space: Space, config: SandboxConfig | None, form: SandboxConfigForm
) -> HttpResponse:
    context = {"form": form, "space": space, "config": config, "section": "sandboxes"}
    status = 400 if form.errors else 200
    if swaps(request, "config-form"):
        return render(request, "sandboxes/partials/config_form.html", context, status=status)
    return render(request, "sandboxes/config_form.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def config_create(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    form, save = _config_form(request, space, None)
    if not granted_backends(space).exists():
        messages.warning(request, "No backend is granted to this space yet: ask a platform admin for one.")
    if save and form.is_valid():
        try:
            config = do_create_config(
                space, data=form.config_data(), api_key=form.api_key_value() or "", actor=actor_from_request(request)
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, f"Config {config.name} created. Test its connection next.")
            return HttpResponseClientRedirect(config.get_absolute_url()) if is_htmx(request) else redirect(config)
    return _render_config_form(request, space, None, form)


@login_required
@require_safe
def config_detail(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id)
    policy = space_policy(config.space)
    capabilities = capability_row(config)
    context = {
        "config": config,
        "space": config.space,
        "is_admin": has_role(request.user, config.space, Role.ADMIN),
        "is_platform_admin": is_platform_admin(request.user),
        "capabilities": capabilities,
        "backend_kind": describe(config.kind),  # which settings rows apply, from the adapter
        "unsupported": (
            unsupported_policy_switches(policy, capabilities.network) if capabilities.network is not None else []
        ),
        "recent_tests": config.space.jobs.filter(
            kind__in=["sandboxes.test_connection", "sandboxes.verify_backend"], params__config_id=str(config.id)
        ).order_by("-created")[:8],
        "section": "sandboxes",
    }
    return render(request, "sandboxes/config_detail.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def config_edit(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    form, save = _config_form(request, config.space, config)
    if save and form.is_valid():
        try:
            do_update_config(
                SandboxConfig.objects.get(pk=config.pk),
                data=form.config_data(),
                api_key=form.api_key_value(),
                actor=actor_from_request(request),
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        except RemoteError as exc:
            form.add_error(None, remote_error_message(exc))
        else:
            messages.success(request, "Config saved.")
            return HttpResponseClientRedirect(config.get_absolute_url()) if is_htmx(request) else redirect(config)
    return _render_config_form(request, config.space, config, form)


def _start_config_job(request: HttpRequest, config_id: str, kind: str, announce: str) -> HttpResponse:
    """Start a job on one config (space admins only) and follow it on its page."""
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    job = start_job(kind, actor=actor_from_request(request), space=config.space, params={"config_id": str(config.id)})
    messages.info(request, announce.format(name=config.name))
    return redirect(job)


@login_required
@require_POST
def config_test(request: HttpRequest, config_id: str) -> HttpResponse:
    return _start_config_job(
        request,
        config_id,
        "sandboxes.test_connection",
        "Testing {name}: health, then create, exec and delete a sandbox.",
    )


@login_required
@require_POST
def config_verify(request: HttpRequest, config_id: str) -> HttpResponse:
    return _start_config_job(
        request,
        config_id,
        "sandboxes.verify_backend",
        "Verifying {name}: snapshots, pause and resume, metadata, network, data plane.",
    )


# --- Capability matrix -------------------------------------------------------------------

CAPABILITY_ACCESSORS = ("files", "snapshots", "templates", "inbound", "pty", "volumes", "egress", "stats")
NETWORK_FLAGS = (
    ("outbound_toggle", "Outbound on/off"),
    ("allow_out_cidr", "Allow CIDRs"),
    ("allow_out_domain", "Allow domains"),
    ("deny_out_cidr", "Deny CIDRs"),
    ("deny_out_domain", "Deny domains"),
    ("l7_rules", "HTTP (L7) rules"),
    ("inbound_toggle", "Inbound on/off"),
    ("deny_wins", "Deny beats allow"),
    ("allow_private", "Private exceptions"),
    ("live_update", "Live policy changes"),
)
DISK_FLAGS = (
    ("workspace", "Disk: /workspace"),
    ("tmp", "Disk: /tmp"),
    ("writable_layer", "Disk: writable layer"),
)


@dataclass
class CapabilityRow:
    config: SandboxConfig
    label: str = ""
    accessors: dict[str, bool] = field(default_factory=dict)
    network: NetworkCapabilities | None = None
    network_flags: list[tuple[str, bool]] = field(default_factory=list)
    # Where the config's disk limit holds (DiskCapabilities.summary says it in words).
    disk: DiskCapabilities | None = None
    disk_flags: list[tuple[str, bool]] = field(default_factory=list)
    error: str = ""


def capability_row(config: SandboxConfig) -> CapabilityRow:
    """What the config's backend offers, read from its accessors (never from its kind)."""
    row = CapabilityRow(config=config)
    try:
        # Through the services' bridge, the one place that builds a backend from a row.
        backend = get_backend(config)
        row.label = backend.label
        row.accessors = {name: getattr(backend, name)() is not None for name in CAPABILITY_ACCESSORS}
        row.network = backend.network_capabilities()
        row.network_flags = [(label, getattr(row.network, attr)) for attr, label in NETWORK_FLAGS]
        row.disk = backend.disk_capabilities()
        row.disk_flags = [(label, getattr(row.disk, attr)) for attr, label in DISK_FLAGS]
    except RemoteError as exc:
        row.error = remote_error_message(exc)
    return row


@login_required
@require_safe
def capability_matrix(request: HttpRequest) -> HttpResponse:
    configs = SandboxConfig.objects.filter(space__in=spaces_for_user(request.user)).select_related("space", "backend")
    rows = [capability_row(config) for config in configs.order_by("space__name", "name")]
    context = {
        "rows": rows,
        "accessor_names": CAPABILITY_ACCESSORS,
        "network_labels": [label for _, label in NETWORK_FLAGS] + [label for _, label in DISK_FLAGS],
        "section": "sandboxes",
    }
    return render(request, "sandboxes/capability_matrix.html", context)


# The space page's Sandbox configs card (registered in SandboxesConfig.ready()).
SPACE_PANEL = SpacePanel(
    "sandboxes/partials/space_configs.html",
    lambda request, space, is_admin: {"sandbox_configs": space.sandbox_configs.all()},
    order=20,
)
