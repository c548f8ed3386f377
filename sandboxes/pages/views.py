"""Pages of the sandboxes app: configs, connection tests, the template catalog, capabilities.

Backend failures never become a 500: a `RemoteError` is shown as a message with its kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import F, Q
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseStopPolling

from console.access import get_space_for_user, has_role, is_platform_admin, spaces_for_user
from console.jobs import start_job
from console.models import NetworkPolicy, Role
from console.services import ServiceError, actor_from_request
from console.views import apply_form_errors, is_htmx, paginate, query_without_page

from ..api.views import do_create_api_token, do_revoke_api_token
from ..backends import build_backend
from ..backends.base import NetworkCapabilities, RemoteError
from ..catalog.services import (
    CONFIG_FIELDS,
    backend_config_for,
    do_create_config,
    do_delete_config,
    do_update_config,
    unsupported_policy_switches,
)
from ..catalog.templates import (
    Catalog,
    CatalogItemForbidden,
    CatalogItemNotFound,
    do_delete_snapshot,
    do_delete_template,
    load_catalog,
    snapshot_users,
    visible_template_ids,
)
from ..models import ApiToken, Artifact, BackgroundCommand, SandboxConfig, Session
from ..sessions.commands import kill_command, read_output, start_command
from ..sessions.runtime import Runtime, effective_template
from ..sessions.workspace import collect_artifacts, list_files, read_file, stage_input
from .forms import SandboxConfigForm, TemplateBuildForm


def get_config_for_user(user: Any, config_id: Any, role: Role = Role.VIEWER) -> SandboxConfig:
    """A config of a space the user holds `role` in (404 for outsiders, 403 for low roles)."""
    config = get_object_or_404(SandboxConfig.objects.select_related("space", "backend"), pk=config_id)
    get_space_for_user(user, config.space_id, role)
    return config


def remote_error_message(exc: RemoteError) -> str:
    hint = " (retry later)" if exc.retryable else ""
    return f"The backend said {exc.kind}: {exc.message}{hint}"


def template_ids(config: SandboxConfig) -> list[str] | None:
    """Template ids the space may pick (the platform's and its own), or None when unlistable."""
    return visible_template_ids(config)


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


@login_required
@require_http_methods(["GET", "POST"])
def config_create(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    form = SandboxConfigForm(
        request.POST or None, space=space, initial={"default_template": "sandbox-console/base:latest"}
    )
    if not form.fields["backend"].queryset.exists():  # type: ignore[attr-defined]
        messages.warning(request, "No backend is granted to this space yet: ask a platform admin for one.")
    if request.method == "POST" and form.is_valid():
        try:
            config = do_create_config(
                space,
                data={k: form.cleaned_data[k] for k in CONFIG_FIELDS},
                api_key=form.cleaned_data["api_key"],
                actor=actor_from_request(request),
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        else:
            messages.success(request, f"Config {config.name} created. Test its connection next.")
            return redirect(config)
    status = 400 if form.errors else 200
    return render(
        request, "sandboxes/config_form.html", {"form": form, "space": space, "section": "sandboxes"}, status=status
    )


@login_required
@require_safe
def config_detail(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id)
    policy = NetworkPolicy.objects.get_or_create(space=config.space)[0]
    capabilities = capability_row(config)
    context = {
        "config": config,
        "space": config.space,
        "is_admin": has_role(request.user, config.space, Role.ADMIN),
        "is_platform_admin": is_platform_admin(request.user),
        "capabilities": capabilities,
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
    form = SandboxConfigForm(
        request.POST or None, instance=config, space=config.space, template_choices=template_ids(config)
    )
    if request.method == "POST" and form.is_valid():
        try:
            do_update_config(
                SandboxConfig.objects.get(pk=config.pk),
                data={k: form.cleaned_data[k] for k in CONFIG_FIELDS},
                api_key=form.cleaned_data["api_key"],
                actor=actor_from_request(request),
            )
        except ServiceError as exc:
            apply_form_errors(form, exc)
        except RemoteError as exc:
            form.add_error(None, remote_error_message(exc))
        else:
            messages.success(request, "Config saved.")
            return redirect(config)
    status = 400 if form.errors else 200
    return render(
        request,
        "sandboxes/config_form.html",
        {"form": form, "space": config.space, "config": config, "section": "sandboxes"},
        status=status,
    )


@login_required
@require_http_methods(["GET", "POST"])
def config_delete(request: HttpRequest, config_id: str) -> HttpResponse:
    config = get_config_for_user(request.user, config_id, Role.ADMIN)
    if request.method == "POST":
        try:
            do_delete_config(config, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
            return redirect(config)
        messages.success(request, f"Config {config.name} deleted.")
        return redirect("sandboxes:config_list")
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"sandbox config {config.name}",
            "consequences": [
                "Refused while live sandboxes use it.",
                "Its templates and snapshots stay on the backend.",
            ],
            "cancel_url": config.get_absolute_url(),
            "section": "sandboxes",
        },
    )


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


# --- Templates and snapshots -------------------------------------------------------------


def _load_catalog(config: SandboxConfig) -> Catalog:
    try:
        catalog = load_catalog(config)
    except RemoteError as exc:
        return Catalog(error=remote_error_message(exc))
    catalog.users = {s.snapshot_id: snapshot_users(config, s.snapshot_id) for s in catalog.snapshots}
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
        except ServiceError as exc:
            messages.error(request, exc.message)
        except RemoteError as exc:
            messages.error(request, remote_error_message(exc))
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
        if item_id not in {s.snapshot_id for s in catalog.snapshots}:
            raise Http404(f"No snapshot {item_id} in this space.")
        users = snapshot_users(config, item_id)
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


# --- Capability matrix -------------------------------------------------------------------

CAPABILITY_ACCESSORS = ("files", "snapshots", "templates", "inbound", "pty", "volumes")
NETWORK_FLAGS = (
    ("outbound_toggle", "Outbound on/off"),
    ("allow_out_cidr", "Allow CIDRs"),
    ("allow_out_domain", "Allow domains"),
    ("deny_out_cidr", "Deny CIDRs"),
    ("deny_out_domain", "Deny domains"),
    ("l7_rules", "HTTP (L7) rules"),
    ("inbound_toggle", "Inbound on/off"),
)


@dataclass
class CapabilityRow:
    config: SandboxConfig
    label: str = ""
    accessors: dict[str, bool] = field(default_factory=dict)
    network: NetworkCapabilities | None = None
    network_flags: list[tuple[str, bool]] = field(default_factory=list)
    error: str = ""


def capability_row(config: SandboxConfig) -> CapabilityRow:
    """What the config's backend offers, read from its accessors (never from its kind)."""
    row = CapabilityRow(config=config)
    try:
        backend = build_backend(backend_config_for(config))
    except RemoteError as exc:
        row.error = remote_error_message(exc)
        return row
    try:
        row.label = backend.label
        row.accessors = {name: getattr(backend, name)() is not None for name in CAPABILITY_ACCESSORS}
        row.network = backend.network_capabilities()
        row.network_flags = [(label, getattr(row.network, attr)) for attr, label in NETWORK_FLAGS]
    except RemoteError as exc:
        row.error = remote_error_message(exc)
    finally:
        backend.close()
    return row


@login_required
@require_safe
def capability_matrix(request: HttpRequest) -> HttpResponse:
    configs = SandboxConfig.objects.filter(space__in=spaces_for_user(request.user)).select_related("space", "backend")
    rows = [capability_row(config) for config in configs.order_by("space__name", "name")]
    context = {
        "rows": rows,
        "accessor_names": CAPABILITY_ACCESSORS,
        "network_labels": [label for _, label in NETWORK_FLAGS],
        "section": "sandboxes",
    }
    return render(request, "sandboxes/capability_matrix.html", context)


# --- API tokens --------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest, space_id: str) -> HttpResponse:
    """A space's agent API tokens. A new token's secret is shown on this response only."""
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    created_secret = ""
    if request.method == "POST":
        try:
            _, created_secret = do_create_api_token(
                space, name=request.POST.get("name", ""), actor=actor_from_request(request)
            )
        except ServiceError as exc:
            messages.error(request, exc.message)
    context = {
        "space": space,
        "tokens": ApiToken.objects.filter(space=space).select_related("created_by").order_by("-created"),
        "created_secret": created_secret,
        "section": "spaces",
    }
    response = render(request, "sandboxes/token_list.html", context)
    if created_secret:
        response["Cache-Control"] = "no-store"
    return response


@login_required
@require_http_methods(["GET", "POST"])
def token_revoke(request: HttpRequest, space_id: str, token_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    token = get_object_or_404(ApiToken, pk=token_id, space=space)
    back = reverse("sandboxes:token_list", kwargs={"space_id": space.id})
    if request.method == "POST":
        try:
            do_revoke_api_token(token, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Token {token.name} revoked; agents using it get 401 from now on.")
        return redirect(back)
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"API token {token.name} ({token.prefix}…)",
            "action_label": "Revoke",
            "consequences": ["Agents using it are refused at once. This cannot be undone."],
            "cancel_url": back,
            "section": "spaces",
        },
    )


# --- Sessions ----------------------------------------------------------------------------


def get_session_for_user(user: Any, session_id: Any, role: Role = Role.VIEWER) -> Session:
    session = get_object_or_404(Session.objects.select_related("space", "config__backend"), pk=session_id)
    get_space_for_user(user, session.space_id, role)
    return session


SESSION_STATE_FILTERS = [("running", "Running"), ("paused", "Paused"), ("stopped", "Stopped"), ("stale", "Stale")]


@login_required
@require_safe
def session_list(request: HttpRequest) -> HttpResponse:
    spaces = spaces_for_user(request.user)
    sessions = Session.objects.filter(space__in=spaces).select_related("space", "config__backend")
    space_filter = request.GET.get("space", "")
    if space_filter:
        space = get_space_for_user(request.user, space_filter)
        sessions = sessions.filter(space=space)
    state = request.GET.get("state", "")
    if state == "stale":
        sessions = sessions.filter(stale_at__isnull=False).filter(
            Q(bound_at__isnull=True) | Q(bound_at__lt=F("stale_at"))
        )
    elif state in {"running", "paused", "stopped"}:
        sessions = sessions.filter(state=state)
    query = request.GET.get("q", "").strip()
    if query:
        sessions = sessions.filter(key__icontains=query)
    page = paginate(request, sessions.order_by(F("last_activity").desc(nulls_last=True), "-created"))
    context = {
        "page": page,
        "spaces": spaces.order_by("name"),
        "space_filter": space_filter,
        "state": state,
        "states": SESSION_STATE_FILTERS,
        "query": query,
        "querystring": query_without_page(request),
        "now": timezone.now(),
        "section": "sessions",
    }
    if is_htmx(request) and request.headers.get("HX-Target") == "session-results":
        return render(request, "sandboxes/partials/session_results.html", context)
    return render(request, "sandboxes/session_list.html", context)


@login_required
@require_safe
def session_detail(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id)
    runtime = Runtime()
    can_use = has_role(request.user, session.space, Role.MEMBER)
    path = request.GET.get("path", "")
    listing: list[Any] = []
    listing_error = ""
    if request.GET.get("browse") == "1" and can_use:
        try:
            listing = list_files(runtime, session, path)
        except (RemoteError, ServiceError) as exc:
            listing_error = remote_error_message(exc) if isinstance(exc, RemoteError) else exc.message
    context = {
        "session": session,
        "space": session.space,
        "inspect": runtime.inspect(session),
        "template": effective_template(session.space, session.config),
        "can_use": can_use,
        "is_admin": has_role(request.user, session.space, Role.ADMIN),
        "path": path,
        "listing": listing,
        "listing_error": listing_error,
        "browsed": request.GET.get("browse") == "1",
        "artifacts": session.artifacts.all()[:50],
        "commands": session.commands.all()[:20],
        "section": "sessions",
    }
    return render(request, "sandboxes/session_detail.html", context)


SESSION_ACTIONS = {"pause", "resume", "rebuild", "delete"}


@login_required
@require_http_methods(["GET", "POST"])
def session_action(request: HttpRequest, session_id: str, action: str) -> HttpResponse:
    """Pause, resume, rebuild (members) or delete (admins) a session; destructive ones confirm."""
    if action not in SESSION_ACTIONS:
        raise Http404("No such action")
    role = Role.ADMIN if action == "delete" else Role.MEMBER
    session = get_session_for_user(request.user, session_id, role)
    if request.method == "GET":
        if action not in {"rebuild", "delete"}:
            return redirect(session)
        consequences = (
            [
                "Its sandbox is deleted and a new one created from the current template.",
                "Files in a persistent /workspace are kept; running processes are lost.",
            ]
            if action == "rebuild"
            else ["Its sandbox, binding, persistent /workspace and artifacts are deleted."]
        )
        return render(
            request,
            "inc/confirm_delete.html",
            {
                "object_label": f"session {session.key}",
                "action_label": action.capitalize(),
                "consequences": consequences,
                "cancel_url": session.get_absolute_url(),
                "section": "sessions",
            },
        )
    runtime = Runtime()
    actor = actor_from_request(request)
    try:
        if action == "pause":
            info = runtime.pause(session, actor=actor)
            messages.success(request, f"Session {session.key} is {info.state}.")
        elif action == "resume":
            resolved = runtime.resume(session, actor=actor)
            messages.success(request, f"Session {session.key} is running ({resolved.action}).")
        elif action == "rebuild":
            runtime.rebuild(session, actor=actor)
            messages.success(request, f"Session {session.key} was rebuilt.")
        else:
            runtime.delete(session, actor=actor)
            messages.success(request, f"Session {session.key} deleted.")
            return redirect(reverse("sandboxes:session_list") + f"?space={session.space_id}")
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
    except ServiceError as exc:
        messages.error(request, exc.message)
    return redirect(session)


@login_required
@require_POST
def session_upload(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    upload = request.FILES.get("file")
    if upload is None:
        messages.error(request, "Choose a file to upload.")
    elif upload.size is not None and upload.size > settings.WORKSPACE_UPLOAD_MAX_BYTES:
        messages.error(request, f"The file is larger than {settings.WORKSPACE_UPLOAD_MAX_BYTES} bytes.")
    else:
        try:
            info = stage_input(
                Runtime(), session, upload.name or "upload", upload.read(), actor=actor_from_request(request)
            )
        except RemoteError as exc:
            messages.error(request, remote_error_message(exc))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Uploaded {info.path} (read-only to the session).")
    return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "?browse=1&path=input")


@login_required
@require_safe
def session_download(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    path = request.GET.get("path", "")
    try:
        data = read_file(Runtime(), session, path)
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
        return redirect(session)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect(session)
    response = HttpResponse(data, content_type="application/octet-stream")
    response["Content-Disposition"] = f'attachment; filename="{path.rsplit("/", 1)[-1] or "file"}"'
    return response


@login_required
@require_safe
def artifact_download(request: HttpRequest, session_id: str, artifact_id: str) -> HttpResponse | FileResponse:
    session = get_session_for_user(request.user, session_id)
    artifact = get_object_or_404(Artifact, pk=artifact_id, session=session)
    return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=artifact.path.rsplit("/", 1)[-1])


@login_required
@require_POST
def session_collect(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    try:
        result = collect_artifacts(Runtime(), session, actor=actor_from_request(request))
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Collected {len(result.artifacts)} file(s) from /workspace/output.")
        for refusal in result.refused[:10]:
            messages.warning(request, refusal)
    return redirect(session)


# --- Background commands on the session page ----------------------------------------------


@login_required
@require_POST
def command_start(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    shell = request.POST.get("shell", "").strip()
    if not shell:
        messages.error(request, "Type a command to run.")
        return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "#commands")
    try:
        command = start_command(Runtime(), session, shell=shell, actor=actor_from_request(request))
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        return redirect("sandboxes:command_detail", session_id=session.id, command_id=command.id)
    return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "#commands")


OUTPUT_PAGE_BYTES = 512 * 1024


@login_required
@require_safe
def command_detail(request: HttpRequest, session_id: str, command_id: str) -> HttpResponse:
    """A command's output; with HTMX the output partial polls until the command ends."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    command = get_object_or_404(BackgroundCommand, pk=command_id, session=session)
    output = read_output(command, None, OUTPUT_PAGE_BYTES)
    context = {
        "session": session,
        "space": session.space,
        "command": command,
        "output": output,
        "text": output.data.decode(errors="replace"),
        "section": "sessions",
    }
    if is_htmx(request) and request.headers.get("HX-Target") == "command-output":
        response = render(request, "sandboxes/partials/command_output.html", context)
        if output.finished or command.is_finished:
            return HttpResponseStopPolling(response.content)
        return response
    return render(request, "sandboxes/command_detail.html", context)


@login_required
@require_POST
def command_kill(request: HttpRequest, session_id: str, command_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    command = get_object_or_404(BackgroundCommand, pk=command_id, session=session)
    try:
        kill_command(command, actor=actor_from_request(request))
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
    else:
        messages.success(request, "Command killed.")
    return redirect("sandboxes:command_detail", session_id=session.id, command_id=command.id)
