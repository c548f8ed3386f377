"""Pages of sessions: list, detail, actions (pause, resume, rebuild, delete), files, artifacts
and background commands.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST, require_safe
from django_htmx.http import HttpResponseStopPolling

from console.access import get_space_for_user, has_role
from console.keyset import keyset_page
from console.models import ROLE_RANK, Role
from console.panels import SpaceAction
from console.services import ServiceError, actor_from_request
from console.views import is_htmx, swaps

from ..backends.base import RemoteError
from ..catalog.lookups import failure_message, remote_error_message
from ..models import Artifact, BackgroundCommand, Session, SessionState
from ..sessions.tuning import SESSIONS
from .access import get_session_for_user
from .commands import kill_command, read_output, start_command
from .listing import SESSION_ORDER, STATE_FILTERS, chosen_space, filtered_sessions, visible_spaces
from .logs import TAILS, read_session_logs, tail_of
from .panels import panels_context
from .provisioning import effective_template
from .runtime import Runtime
from .services import do_keep_session_awake, do_set_session_labels
from .stats import read_session_stats
from .teardown_pages import session_delete
from .workspace import (
    SandboxNotRunning,
    collect_artifacts,
    download_disposition,
    list_files,
    read_file,
    stage_input,
)

# --- Sessions ----------------------------------------------------------------------------


@login_required
@require_safe
def session_list(request: HttpRequest) -> HttpResponse:
    """Sessions of the user's spaces, newest activity first, in keyset pages (console.keyset):
    five queries whatever the filters and however deep the page."""
    spaces = visible_spaces(request.user)
    space_filter = request.GET.get("space", "")
    space = chosen_space(spaces, space_filter) if space_filter else None
    state = request.GET.get("state", "")
    # No key holds a NUL byte, and PostgreSQL cannot compare one: dropped, never a 500.
    query = request.GET.get("q", "").replace("\x00", "").strip()
    label = request.GET.get("label", "").strip()
    sessions = filtered_sessions(request.user, spaces, space=space, state=state, query=query, label=label)
    page = keyset_page(request, sessions, SESSION_ORDER)
    roles = {visible.space.id: visible.role for visible in spaces}
    for session in page.object_list:
        rank = ROLE_RANK[roles.get(session.space_id, Role.ADMIN)]  # platform admins see all spaces
        session.can_use = rank >= ROLE_RANK[Role.MEMBER]  # type: ignore[attr-defined]
        session.can_delete = rank >= ROLE_RANK[Role.ADMIN]  # type: ignore[attr-defined]
    context = {
        "page": page,
        "spaces": [visible.space for visible in spaces],
        "start_spaces": [visible.space for visible in spaces if visible.can_start],
        "space_filter": space_filter,
        "state": state,
        "states": STATE_FILTERS,
        "query": query,
        "label": label,
        "can_act": any(getattr(session, "can_use", False) for session in page.object_list),
        "running_ids": [session.id for session in page.object_list if session.state == SessionState.RUNNING],
        "now": timezone.now(),
        "section": "sessions",
    }
    if swaps(request, "session-results"):
        return render(request, "sandboxes/partials/session_results.html", context)
    return render(request, "sandboxes/session_list.html", context)


@login_required
@require_safe
def session_detail(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id)
    runtime = Runtime()
    can_use = has_role(request.user, session.space, Role.MEMBER)
    path = request.GET.get("path", "").strip("/")
    listing: list[Any] = []
    listing_error = ""
    not_running = False
    if request.GET.get("browse") == "1" and can_use:
        # A GET reads only: a paused or missing sandbox is offered a "Resume and browse" POST.
        try:
            listing = list_files(runtime, session, path, wake=False)
        except SandboxNotRunning:
            not_running = True
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
        "listing_rows": [(entry, f"{path}/{entry.name}" if path else entry.name) for entry in listing],
        "path_crumbs": _crumbs(path),
        "parent_path": path.rpartition("/")[0],
        "writable": path != "input" and not path.startswith("input/"),
        "listing_error": listing_error,
        "not_running": not_running,
        "browsed": request.GET.get("browse") == "1",
        "artifacts": session.artifacts.all()[:50],
        "commands": session.commands.all()[:20],
        "keep_awake_choices": KEEP_AWAKE_CHOICES,
        **panels_context(request, session, can_use=can_use),
        "section": "sessions",
        **stats_context(request, session),
    }
    return render(request, "sandboxes/session_detail.html", context)


@login_required
@require_POST
def session_start(request: HttpRequest, space_id: str) -> HttpResponse:
    """Start a session from the console (members): its sandbox on the space's default config.

    The agent API does the same on a turn; this lets a person try the space without a token.
    """
    space = get_space_for_user(request.user, space_id, Role.MEMBER)
    key = request.POST.get("key", "").strip() or f"console-{secrets.token_hex(4)}"
    try:
        resolved = Runtime().resolve(space, key, actor=actor_from_request(request))
    except (RemoteError, ServiceError) as exc:
        messages.error(request, failure_message(exc))
    else:
        messages.success(request, f"Session {key} is running ({resolved.action}). Open its terminal next.")
        return redirect(resolved.session)
    return redirect(reverse("sandboxes:session_list") + f"?space={space.id}#start-session")


SESSION_ACTIONS = {"pause", "resume", "rebuild", "delete"}


@login_required
@require_http_methods(["GET", "POST"])
def session_action(request: HttpRequest, session_id: str, action: str) -> HttpResponse:
    """Pause, resume, rebuild (members) or delete (admins) a session; destructive ones confirm."""
    if action not in SESSION_ACTIONS:
        raise Http404("No such action")
    if action == "delete":
        return session_delete(request, session_id)  # a teardown job (teardown_pages)
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    if request.method == "GET":
        if action != "rebuild":
            return redirect(session)
        consequences = [
            "Its sandbox is deleted and a new one created from the current template.",
            "Files in a persistent /workspace are kept; running processes are lost.",
        ]
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
        else:
            runtime.rebuild(session, actor=actor)
            messages.success(request, f"Session {session.key} was rebuilt.")
    except (RemoteError, ServiceError) as exc:
        messages.error(request, failure_message(exc))
    if action == "resume" and request.POST.get("browse") == "1":
        return redirect(_browse_url(session, request.POST.get("path", "")))
    if action == "rebuild" and request.POST.get("next") == "terminal":  # "Rebuild now" on the terminal page
        return redirect(reverse("sandboxes:terminal_page", kwargs={"session_id": session.id}))
    return redirect(session)


KEEP_AWAKE_CHOICES = [("1", "1 hour"), ("2", "2 hours"), ("4", "4 hours"), ("8", "8 hours"), ("24", "24 hours")]


@login_required
@require_POST
def session_labels(request: HttpRequest, session_id: str) -> HttpResponse:
    """Replace a session's labels (members); the list filters on them."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    try:
        labels = do_set_session_labels(session, request.POST.get("labels", ""), actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Labels of {session.key}: {' '.join(labels) or 'none'}.")
    return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "#labels")


@login_required
@require_POST
def session_keep_awake(request: HttpRequest, session_id: str) -> HttpResponse:
    """Keep a session running for some hours whatever its idle timeout (members), or stop."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    hours = request.POST.get("hours", "")
    if hours not in {value for value, _ in KEEP_AWAKE_CHOICES} and hours != "0":
        messages.error(request, "Choose how long to keep the session awake.")
        return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "#keep-awake")
    until = timezone.now() + timedelta(hours=int(hours)) if hours != "0" else None
    try:
        do_keep_session_awake(session, until, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request,
            f"{session.key} is kept awake for {hours} hour(s)."
            if until
            else f"{session.key} idles again after {session.config.idle_timeout_s} s without activity.",
        )
    return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "#keep-awake")


def _crumbs(path: str) -> list[tuple[str, str]]:
    """(name, path up to it) for each folder of `path`."""
    parts = [part for part in path.split("/") if part]
    return [(part, "/".join(parts[: index + 1])) for index, part in enumerate(parts)]


def _browse_url(session: Session, path: str) -> str:
    return f"{session.get_absolute_url()}?{urlencode({'browse': '1', 'path': path})}#files"


@login_required
@require_POST
def session_upload(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    upload = request.FILES.get("file")
    if upload is None:
        messages.error(request, "Choose a file to upload.")
    elif upload.size is not None and upload.size > SESSIONS.workspace_upload_max_bytes:
        messages.error(request, f"The file is larger than {SESSIONS.workspace_upload_max_bytes} bytes.")
    else:
        try:
            info = stage_input(
                Runtime(), session, upload.name or "upload", upload.read(), actor=actor_from_request(request)
            )
        except (RemoteError, ServiceError) as exc:
            messages.error(request, failure_message(exc))
        else:
            messages.success(request, f"Uploaded {info.path} (read-only to the session).")
    return redirect(reverse("sandboxes:session_detail", kwargs={"session_id": session.id}) + "?browse=1&path=input")


@login_required
@require_safe
def session_download(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    path = request.GET.get("path", "")
    try:
        data = read_file(Runtime(), session, path, wake=False)  # a GET: never wakes the sandbox
    except SandboxNotRunning as exc:
        messages.error(request, exc.message)
        return redirect(_browse_url(session, path.rpartition("/")[0]))
    except RemoteError as exc:
        messages.error(request, remote_error_message(exc))
        return redirect(session)
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect(session)
    response = HttpResponse(data, content_type="application/octet-stream")
    response["Content-Disposition"] = download_disposition(path)
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
    except (RemoteError, ServiceError) as exc:
        messages.error(request, failure_message(exc))
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
    except (RemoteError, ServiceError) as exc:
        messages.error(request, failure_message(exc))
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
    if swaps(request, "command-output"):
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


# --- Live resource use ---------------------------------------------------------------------


def _previous_reading(request: HttpRequest) -> dict[str, float]:
    """The reading the panel showed last (its poll URL carries it), for network rates."""
    previous: dict[str, float] = {}
    for name in ("rx", "tx", "at"):
        try:
            value = float(request.GET.get(name, ""))
        except ValueError:
            continue
        if value >= 0 and value == value and value != float("inf"):
            previous[name] = value
    return previous


def stats_context(request: HttpRequest, session: Session) -> dict[str, Any]:
    reading = read_session_stats(session)
    rates: dict[str, float] = {}
    previous = _previous_reading(request)
    stats = reading.stats
    if stats is not None and "at" in previous and stats.read_at > previous["at"]:
        elapsed = stats.read_at - previous["at"]
        for name, now in (("rx", stats.net_rx_bytes), ("tx", stats.net_tx_bytes)):
            if now is not None and name in previous and now >= previous[name]:
                rates[name] = (now - previous[name]) / elapsed
    return {"session": session, "reading": reading, "rates": rates}


@login_required
@require_safe
def session_stats(request: HttpRequest, session_id: str) -> HttpResponse:
    """The live resource panel (HTMX polls it); reads only, never wakes the sandbox."""
    session = get_session_for_user(request.user, session_id)
    context = stats_context(request, session)
    if is_htmx(request) and context["reading"].status == "unsupported":
        return HttpResponseStopPolling(render(request, "sandboxes/partials/session_stats.html", context).content)
    return render(request, "sandboxes/partials/session_stats.html", context)


@login_required
@require_safe
def session_logs(request: HttpRequest, session_id: str) -> HttpResponse:
    """The Logs card: the end of the sandbox's own output (`?tail=` lines), swapped in by HTMX
    or a page of its own without JavaScript. Members only, as the files; reads only, never
    waking the sandbox."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    context = {
        "session": session,
        "space": session.space,
        "logs": read_session_logs(session, tail_of(request.GET.get("tail"))),
        "tails": TAILS,
        "section": "sessions",
    }
    if is_htmx(request):
        return render(request, "sandboxes/partials/session_logs.html", context)
    return render(request, "sandboxes/session_logs.html", context)


# The space page's Sessions button (registered in SandboxesConfig.ready()).
SPACE_ACTION = SpaceAction("Sessions", lambda space: f"{reverse('sandboxes:session_list')}?space={space.id}", order=10)
