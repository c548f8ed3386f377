"""The session page's file manager: preview (text escaped, images of a few raster types),
upload into any writable folder, make a folder, rename and delete (with a confirmation).

Every path goes through `workspace` (the text check, then the helper that walks from
/workspace without following links, as the session user). A preview reads only and never
wakes a sandbox; a write resumes it as the agent API's writes do. Members act; viewers do not.
"""

from __future__ import annotations

import posixpath

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST, require_safe

from console.models import Role
from console.services import ServiceError, actor_from_request

from ..backends.base import RemoteError
from ..catalog.lookups import failure_message
from ..models import Session
from .access import get_session_for_user
from .pages import _browse_url
from .runtime import Runtime
from .tuning import SESSIONS
from .workspace import (
    SandboxNotRunning,
    delete_path,
    download_disposition,
    make_folder,
    read_file,
    rename_path,
    write_file,
)

PREVIEW_MAX_BYTES = 256 * 1024
# Served inline as images, by extension; anything else (SVG included: it may hold scripts)
# is previewed as text or downloaded, never rendered.
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


def _image_type(path: str) -> str | None:
    return IMAGE_TYPES.get(path.rpartition(".")[2].lower()) if "." in path else None


def _given(request: HttpRequest, name: str) -> str:
    """A path the form sent, relative to /workspace: an absolute one is refused here (the
    workspace's checks refuse `..` and links)."""
    value = (request.POST.get(name) or request.GET.get(name) or "").rstrip("/")
    if value.startswith("/"):
        raise ServiceError(f"{value!r}: paths are relative to /workspace.", field_errors={name: ["relative path"]})
    return value


def _folder_of(path: str) -> str:
    return posixpath.dirname(path)


def _join(folder: str, name: str) -> str:
    """`name` in `folder`: one plain name, never a path of its own."""
    name = name.strip()
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise ServiceError("Give a plain name: no '/', and not '.' or '..'.", field_errors={"name": ["a plain name"]})
    return f"{folder.strip('/')}/{name}" if folder.strip("/") else name


def _read(request: HttpRequest, session: Session) -> tuple[str, bytes | None, str]:
    """(path, the bytes, "") or (path, None, why not) for a preview: reads only, never wakes."""
    path = (request.GET.get("path") or "").rstrip("/")
    try:
        path = _given(request, "path")
        return path, read_file(Runtime(), session, path, max_bytes=PREVIEW_MAX_BYTES, wake=False), ""
    except (RemoteError, ServiceError) as exc:
        return path, None, failure_message(exc)


@login_required
@require_safe
def file_preview(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    path, data, error = _read(request, session)
    text = None
    if data is not None and _image_type(path) is None:
        try:
            text = data.decode("utf-8") if b"\x00" not in data else None
        except UnicodeDecodeError:
            text = None
    context = {
        "session": session,
        "space": session.space,
        "path": path,
        "folder": _folder_of(path),
        "error": error,
        "image": data is not None and _image_type(path) is not None,
        "text": text,
        "binary": data is not None and text is None and _image_type(path) is None,
        "preview_max": PREVIEW_MAX_BYTES,
        "section": "sessions",
    }
    return render(request, "sandboxes/file_preview.html", context)


@login_required
@require_safe
def file_raw(request: HttpRequest, session_id: str) -> HttpResponse:
    """An image of the allowed types, inline; anything else as a download. nosniff, and a
    sandboxing CSP in case a browser opens it as a page."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    if not request.GET.get("path"):  # a request that names no file is the caller's mistake
        return HttpResponse("name a file: ?path=…", status=400, content_type="text/plain; charset=utf-8")
    path, data, error = _read(request, session)
    if data is None:
        return HttpResponse(error, status=404, content_type="text/plain; charset=utf-8")
    kind = _image_type(path)
    response = HttpResponse(data, content_type=kind or "application/octet-stream")
    response["Content-Disposition"] = download_disposition(path, inline=bool(kind))
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


def _done(request: HttpRequest, session: Session, folder: str, action: str, exc: Exception | None) -> HttpResponse:
    if exc is not None:
        messages.error(request, failure_message(exc) if isinstance(exc, RemoteError | ServiceError) else str(exc))
    else:
        messages.success(request, action)
    return redirect(_browse_url(session, folder))


@login_required
@require_POST
def file_upload(request: HttpRequest, session_id: str) -> HttpResponse:
    """Upload into the folder being browsed (any writable one)."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    folder = ""
    upload = request.FILES.get("file")
    try:
        folder = _given(request, "folder")
        if upload is None:
            raise ServiceError("Choose a file to upload.")
        if upload.size is not None and upload.size > SESSIONS.workspace_upload_max_bytes:
            raise ServiceError(f"The file is larger than {SESSIONS.workspace_upload_max_bytes} bytes.")
        info = write_file(
            Runtime(), session, _join(folder, upload.name or "upload"), upload.read(), actor=actor_from_request(request)
        )
    except (RemoteError, ServiceError) as exc:
        return _done(request, session, folder, "", exc)
    return _done(request, session, folder, f"Uploaded {info.path}.", None)


@login_required
@require_POST
def file_mkdir(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    folder = ""
    try:
        folder = _given(request, "folder")
        info = make_folder(
            Runtime(), session, _join(folder, request.POST.get("name", "")), actor=actor_from_request(request)
        )
    except (RemoteError, ServiceError) as exc:
        return _done(request, session, folder, "", exc)
    return _done(request, session, folder, f"Made {info.path}/.", None)


@login_required
@require_POST
def file_rename(request: HttpRequest, session_id: str) -> HttpResponse:
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    path = folder = ""
    try:
        path = _given(request, "path")
        folder = _folder_of(path)
        target = _join(folder, request.POST.get("name", ""))
        info = rename_path(Runtime(), session, path, target, actor=actor_from_request(request))
    except (RemoteError, ServiceError) as exc:
        return _done(request, session, folder, "", exc)
    return _done(request, session, folder, f"Renamed /workspace/{path} to {info.path}.", None)


@login_required
@require_http_methods(["GET", "POST"])
def file_delete(request: HttpRequest, session_id: str) -> HttpResponse:
    """A confirmation (GET), then the delete (POST)."""
    session = get_session_for_user(request.user, session_id, Role.MEMBER)
    try:
        path = _given(request, "path")
    except ServiceError as exc:
        return _done(request, session, "", "", exc)
    folder = _folder_of(path)
    if request.method == "POST":
        try:
            deleted = delete_path(Runtime(), session, path, actor=actor_from_request(request))
        except (RemoteError, ServiceError, SandboxNotRunning) as exc:
            return _done(request, session, folder, "", exc)
        return _done(request, session, folder, f"Deleted {deleted}.", None)
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"/workspace/{path}",
            "action_label": "Delete",
            "consequences": [
                "A folder is deleted with everything in it; a link is removed, not what it points to.",
                "This cannot be undone.",
            ],
            "hidden": {"path": path},
            "cancel_url": _browse_url(session, folder),
            "section": "sessions",
        },
    )
