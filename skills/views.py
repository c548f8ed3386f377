"""Pages of the skills app: the catalog list, skill and version pages, files, import, delete
(a space's Skill image pages are `image_views`).

Any signed-in user browses the catalog (skills are platform-wide); importing and deleting
are for platform admins. Bad uploads come back as messages on the form, never as a 500.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.datastructures import MultiValueDict
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods

from console.access import is_platform_admin
from console.services import ServiceError, actor_from_request
from console.views import paginate, query_without_page, swaps
from sandboxes.sessions.workspace import download_disposition

from .archives import Limits, human_size
from .forms import SkillImportForm
from .image_views import install_targets
from .models import GitSource, Skill, SkillFile, SkillVersion
from .rendering import render_markdown
from .services import (
    do_confirm_dependencies,
    do_delete_skill_version,
    do_import_examples,
    import_archive,
    spaces_with_skill,
)

LIST_FIELDS = (
    "id",
    "name",
    "latest_version__id",
    "latest_version__content_hash",
    "latest_version__description",
    "latest_version__size",
    "latest_version__file_count",
    "latest_version__warning_count",
)
SEARCH_MAX = 200
FILE_PREVIEW_MAX_BYTES = 512 * 1024


def require_platform_admin(request: HttpRequest, what: str) -> None:
    if not is_platform_admin(request.user):
        raise PermissionDenied(f"Only platform admins {what}.")


# --- Catalog -----------------------------------------------------------------------------


def catalog(query: str) -> QuerySet[Skill]:
    skills = (
        Skill.objects.select_related("latest_version")
        .only(*LIST_FIELDS)
        .annotate(version_count=Count("versions"))
        .order_by("name")
    )
    if query:
        skills = skills.filter(Q(name__icontains=query) | Q(latest_version__description__icontains=query))
    return skills


@login_required
@require_GET
def skill_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()[:SEARCH_MAX]
    page = paginate(request, catalog(query))
    spaces = spaces_with_skill([skill.id for skill in page.object_list], user=request.user)
    rows = [(skill, spaces.get(skill.id, [])) for skill in page.object_list]
    context = {
        "page": page,
        "rows": rows,
        "query": query,
        "querystring": query_without_page(request),
        "can_import": is_platform_admin(request.user),
        "section": "skills",
    }
    if swaps(request, "skill-results"):
        return render(request, "skills/partials/skill_results.html", context)
    return render(request, "skills/skill_list.html", context)


@login_required
@require_GET
def skill_detail(request: HttpRequest, skill_id: str) -> HttpResponse:
    skill = get_object_or_404(Skill.objects.select_related("latest_version"), pk=skill_id)
    if skill.latest_version is None:
        raise Http404("This skill has no version.")
    return render_version(request, skill.latest_version, skill)


@login_required
@require_GET
def version_detail(request: HttpRequest, version_id: str) -> HttpResponse:
    version = get_object_or_404(SkillVersion.objects.select_related("skill"), pk=version_id)
    return render_version(request, version, version.skill)


def render_version(request: HttpRequest, version: SkillVersion, skill: Skill) -> HttpResponse:
    dependencies: dict[str, Any] = version.dependencies or {}
    report: dict[str, Any] = version.dependency_report or {}
    confirmed = set((version.confirmed_dependencies or {}).get("keys") or [])
    context = {
        "skill": skill,
        "version": version,
        "is_latest": skill.latest_version_id == version.id,
        "body_html": render_markdown(version.body),
        "files": version.files.defer("content").order_by("path"),
        "versions": skill.versions.only("id", "content_hash", "created", "imported_by_name", "file_count", "size"),
        "pip": dependencies.get("pip", []),
        "npm": dependencies.get("npm", []),
        "debian": dependencies.get("debian", []),
        "report": report,
        "declared": report.get("declared", []),
        "inferred": [(need, need.get("key") in confirmed) for need in report.get("inferred", [])],
        "ignored": report.get("ignored", []),
        "confirmation": version.confirmed_dependencies or {},
        "git_source": GitSource.objects.filter(skill=skill).first(),
        "spaces": spaces_with_skill([skill.id], user=request.user).get(skill.id, []),
        "can_manage": is_platform_admin(request.user),
        "install_targets": install_targets(request.user),
        "section": "skills",
    }
    return render(request, "skills/skill_detail.html", context)


@login_required
@require_GET
def file_detail(request: HttpRequest, file_id: str) -> HttpResponse:
    skill_file = get_object_or_404(SkillFile.objects.select_related("version__skill"), pk=file_id)
    if request.GET.get("download"):
        return download(skill_file)
    text = None
    if skill_file.is_text:
        # Only the start of a large file is shown; the download has all of it.
        text = bytes(skill_file.content[:FILE_PREVIEW_MAX_BYTES]).decode("utf-8", "replace")
    context = {
        "file": skill_file,
        "version": skill_file.version,
        "text": text,
        "truncated": skill_file.size > FILE_PREVIEW_MAX_BYTES,
        "section": "skills",
    }
    return render(request, "skills/file_detail.html", context)


def download(skill_file: SkillFile) -> HttpResponse:
    # Untrusted bytes: never rendered by the browser, always saved.
    response = HttpResponse(bytes(skill_file.content), content_type="application/octet-stream")
    # A name stored before names were checked may hold a newline (a header cannot) or a bidi
    # override: escaped and quoted as every download's name is.
    response["Content-Disposition"] = download_disposition(skill_file.path)
    response["X-Content-Type-Options"] = "nosniff"
    return response


# --- Import ------------------------------------------------------------------------------


class ArchiveSizeLimitHandler(FileUploadHandler):
    """Stops reading an upload past skills.archive_max_bytes, so it is never stored in full."""

    def __init__(self, request: HttpRequest, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.exceeded = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        if start + len(raw_data) > self.limit:
            self.exceeded = True
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


@csrf_exempt  # the CSRF check runs in _skill_import, after the upload handler is installed
@login_required
@require_http_methods(["GET", "POST"])
def skill_import(request: HttpRequest) -> HttpResponse:
    require_platform_admin(request, "import skills")
    limit_handler = ArchiveSizeLimitHandler(request, Limits.from_settings().archive_bytes)
    if request.method == "POST":
        # Upload handlers can only change before the body is read (Django docs, "Modifying
        # upload handlers on the fly"), hence the csrf_exempt / csrf_protect pair.
        request.upload_handlers.insert(0, limit_handler)
    return _skill_import(request, limit_handler)


@csrf_protect
def _skill_import(request: HttpRequest, limit_handler: ArchiveSizeLimitHandler) -> HttpResponse:
    form = SkillImportForm(request.POST or None, request.FILES or None)
    status = 200
    if request.method == "POST":
        if limit_handler.exceeded:
            form = SkillImportForm(request.POST, MultiValueDict())
            form.is_valid()
            form.errors.pop("archive", None)  # "required": the real reason is the cut-off
            form.add_error(
                "archive",
                f"The archive is over the limit of {human_size(limit_handler.limit)} (skills.archive_max_bytes).",
            )
        elif form.is_valid():
            archive = form.cleaned_data["archive"]
            try:
                result = import_archive(archive, archive.name or "skill.zip", actor=actor_from_request(request))
            except ServiceError as exc:
                form.add_error("archive", exc.message)
            else:
                level = messages.success if result.created else messages.info
                level(request, result.message)
                return redirect(result.version)
        status = 400
    return render(request, "skills/skill_import.html", {"form": form, "section": "skills"}, status=status)


@login_required
@require_http_methods(["POST"])
def skill_import_examples(request: HttpRequest) -> HttpResponse:
    """Import the bundled example skills (the same as `manage.py import_skill --examples`)."""
    require_platform_admin(request, "import skills")
    outcome = do_import_examples(actor=actor_from_request(request))
    level = messages.warning if outcome.refused else messages.success
    level(request, outcome.summary)
    return redirect("skills:skill_list")


# --- Dependencies ------------------------------------------------------------------------


@login_required
@require_http_methods(["POST"])
def version_dependencies(request: HttpRequest, version_id: str) -> HttpResponse:
    """Confirm the checked inferred needs into the version's install plan (the rest unconfirmed)."""
    require_platform_admin(request, "confirm skill dependencies")
    version = get_object_or_404(SkillVersion.objects.select_related("skill"), pk=version_id)
    keys = [key[:300] for key in request.POST.getlist("need")][:1000]
    try:
        changed = do_confirm_dependencies(version, keys, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect(version.get_absolute_url() + "#dependencies")
    if changed:
        messages.success(
            request,
            f"Install plan of {version.skill.name} {version.short_hash}: {len(keys)} inferred need(s) confirmed. "
            "It applies to the next install.",
        )
    else:
        messages.info(request, "The install plan already had these needs; nothing changed.")
    return redirect(version.get_absolute_url() + "#dependencies")


# --- Delete ------------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def version_delete(request: HttpRequest, version_id: str) -> HttpResponse:
    require_platform_admin(request, "delete skill versions")
    version = get_object_or_404(SkillVersion.objects.select_related("skill"), pk=version_id)
    only_version = version.skill.versions.count() == 1
    if request.method == "POST":
        name = version.skill.name
        try:
            skill = do_delete_skill_version(version, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
            return redirect(version)
        if skill is None:
            messages.success(request, f"Skill {name} deleted with its last version {version.short_hash}.")
            return redirect("skills:skill_list")
        messages.success(request, f"Version {version.short_hash} of {name} deleted.")
        return redirect(skill)
    consequences = [f"Its {version.file_count} files are removed from the catalog."]
    if only_version:
        consequences.append(f"It is the only version: the skill {version.skill.name} leaves the catalog.")
    elif version.skill.latest_version_id == version.id:
        consequences.append("It is the latest version: the skill falls back to its newest remaining version.")
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"version {version.short_hash} of skill {version.skill.name}",
            "consequences": consequences,
            "cancel_url": version.get_absolute_url(),
            "section": "skills",
        },
    )
