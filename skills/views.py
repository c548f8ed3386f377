"""Pages of the skills app: the catalog list, skill and version pages, files, import, delete.

Any signed-in user browses the catalog (skills are platform-wide); importing and deleting
are for platform admins. Bad uploads come back as messages on the form, never as a 500.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.datastructures import MultiValueDict
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods

from console.access import get_space_for_user, has_role, is_platform_admin, spaces_for_user
from console.models import Role, Space
from console.panels import SpaceAction
from console.services import ServiceError, actor_from_request
from console.views import paginate, query_without_page, swaps
from sandboxes.backends.base import RemoteError
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import SandboxConfig

from . import images
from .archives import Limits, human_size
from .forms import SkillImportForm, SkillInstallForm
from .install import start
from .models import Skill, SkillFile, SkillImage, SkillVersion
from .rendering import render_markdown
from .services import do_delete_skill_version, do_import_examples, import_archive, spaces_with_skill

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
        "spaces": spaces_with_skill([skill.id], user=request.user).get(skill.id, []),
        "can_manage": is_platform_admin(request.user),
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
    filename = skill_file.path.rsplit("/", 1)[-1].replace('"', "")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response


# --- Import ------------------------------------------------------------------------------


class ArchiveSizeLimitHandler(FileUploadHandler):
    """Stops reading an upload past SKILL_ARCHIVE_MAX_BYTES, so it is never stored in full."""

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
                f"The archive is over the limit of {human_size(limit_handler.limit)} (SKILL_ARCHIVE_MAX_BYTES).",
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


# --- Skill images --------------------------------------------------------------------------


def _configs(space: Space) -> list[SandboxConfig]:
    return list(SandboxConfig.objects.filter(space=space).order_by("-is_default", "created"))


def _selected_config(request: HttpRequest, space: Space, configs: list[SandboxConfig]) -> SandboxConfig | None:
    wanted = request.GET.get("config") or request.POST.get("config") or ""
    for config in configs:
        if str(config.id) == wanted:
            return config
    if wanted:
        raise Http404("No such config in this space")
    return configs[0] if configs else None


def _version_choices(preselected: SkillVersion | None) -> list[tuple[str, str]]:
    """The latest version of every skill, plus a preselected older one."""
    skills = Skill.objects.select_related("latest_version").filter(latest_version__isnull=False).order_by("name")
    choices = [
        (str(s.latest_version_id), f"{s.name} @ {s.latest_version.short_hash}") for s in skills if s.latest_version
    ]
    if preselected is not None and str(preselected.id) not in {value for value, _ in choices}:
        choices.insert(0, (str(preselected.id), f"{preselected.skill.name} @ {preselected.short_hash} (older version)"))
    return choices


def _image_url(space: Space, config: SandboxConfig | None) -> str:
    url = reverse("skills:image_detail", kwargs={"space_id": space.id})
    return f"{url}?config={config.id}" if config is not None else url


def build_refusals(job_ids: list[Any]) -> list[tuple[Any, list[str], list[Any]]]:
    """(job id, proposed allow entries, refused rows) of the builds that had refusals."""
    from sandboxes.models import EgressEvent
    from sandboxes.network.approvals import build_proposals

    rows = list(EgressEvent.objects.filter(job_id__in=job_ids).order_by("-time")[:200])
    found = []
    for job_id in dict.fromkeys(row.job_id for row in rows):
        mine = [row for row in rows if row.job_id == job_id]
        found.append((job_id, build_proposals(mine), mine[:20]))
    return found


@login_required
@require_GET
def image_detail(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id)
    configs = _configs(space)
    config = _selected_config(request, space, configs)
    can_manage = has_role(request.user, space, Role.ADMIN)
    context: dict[str, Any] = {"space": space, "configs": configs, "config": config, "can_manage": can_manage}
    if config is not None:
        state = images.image_state(space, config)
        fingerprint = config_fingerprint(config)
        generations = list(images.history(space, config))
        preselected = None
        if version_id := _uuid_or_none(request.GET.get("version")):  # a malformed id preselects nothing
            preselected = SkillVersion.objects.select_related("skill").filter(pk=version_id).first()
        form = SkillInstallForm(
            initial={"config": str(config.id), "version": str(preselected.id) if preselected else None},
            configs=[(str(c.id), c.name) for c in configs],
            versions=_version_choices(preselected),
        )
        context.update(
            {
                "state": state,
                "generations": [
                    (image, can_manage and images.is_rollback_target(image, state.current, fingerprint))
                    for image in generations
                ],
                "form": form,
                "preselected": preselected,
                "build_refusals": build_refusals([image.job_id for image in generations if image.job_id]),
                "has_old_snapshots": any(
                    image.status == "ready" and (state.current is None or image.pk != state.current.pk)
                    for image in generations
                ),
            }
        )
    context["section"] = "spaces"
    return render(request, "skills/image_detail.html", context)


@login_required
@require_http_methods(["POST"])
def image_install(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    configs = _configs(space)
    version_id = _uuid_or_none(request.POST.get("version"))
    version = SkillVersion.objects.select_related("skill").filter(pk=version_id).first() if version_id else None
    form = SkillInstallForm(
        request.POST,
        configs=[(str(c.id), c.name) for c in configs],
        versions=_version_choices(version),
    )
    config = _selected_config(request, space, configs)
    if not form.is_valid() or version is None or config is None:
        messages.error(request, "Choose a skill version and a sandbox config of this space.")
        return redirect(_image_url(space, config))
    try:
        job = start.do_start_install(space, config, version, actor=actor_from_request(request))
    except ServiceError as exc:
        messages.error(request, exc.message)
        return redirect(_image_url(space, config))
    messages.info(request, f"Installing {version} into {space.name} on {config.name}.")
    return redirect(job)


def _uuid_or_none(value: str | None) -> str | None:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return None


@login_required
@require_http_methods(["GET", "POST"])
def image_uninstall(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    config = _selected_config(request, space, _configs(space))
    name = (request.POST.get("skill") or request.GET.get("skill") or "").strip()
    current = images.current_image(space, config) if config is not None else None
    if config is None or current is None or name not in current.skill_names:
        raise Http404("That skill is not in the current skill image")
    if request.method == "POST":
        try:
            job = start.do_start_uninstall(space, config, name, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
            return redirect(_image_url(space, config))
        messages.info(request, f"Uninstalling {name}: a new generation is built without it.")
        return redirect(job)
    others = [n for n in current.skill_names if n != name]
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "action_label": "Uninstall",
            "object_label": f"skill {name} from {space.name} on {config.name}",
            "consequences": [
                "A new generation is built from the config's default template"
                + (f" with {', '.join(others)}" if others else " with no skills")
                + "; generation "
                + str(current.generation)
                + " stays available for rollback.",
                "Every session of the space is marked stale and rebuilds on its next turn.",
            ],
            "hidden": {"config": str(config.id), "skill": name},
            "cancel_url": _image_url(space, config),
            "section": "spaces",
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def image_rollback(request: HttpRequest, space_id: str, image_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    image = get_object_or_404(SkillImage.objects.select_related("config", "space"), pk=image_id, space=space)
    url = _image_url(space, image.config)
    if request.method == "POST":
        try:
            images.do_rollback_image(image, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
        except RemoteError as exc:  # the snapshot is checked on the backend first
            messages.error(
                request, f"The backend could not be asked whether the snapshot is still there: {exc.message}"
            )
        else:
            messages.success(request, f"Generation {image.generation} is current again; sessions are marked stale.")
        return redirect(url)
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "action_label": "Roll back to",
            "object_label": f"generation {image.generation} ({', '.join(image.skill_names) or 'no skills'})",
            "consequences": [
                f"New sessions on {image.config.name} start from snapshot {image.snapshot_id}.",
                "Every session of the space is marked stale and rebuilds on its next turn.",
            ],
            "cancel_url": url,
            "section": "spaces",
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def image_cleanup(request: HttpRequest, space_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    config = _selected_config(request, space, _configs(space))
    if config is None:
        raise Http404("This space has no sandbox config")
    url = _image_url(space, config)
    if request.method == "POST":
        try:
            retired, kept = images.do_delete_old_snapshots(space, config, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
            return redirect(url)
        if retired:
            messages.success(request, "Deleted the snapshots of generation(s) " + ", ".join(map(str, retired)) + ".")
        for line in kept:
            messages.info(request, f"Kept {line}.")
        if not retired and not kept:
            messages.info(request, "There are no old snapshots to delete.")
        return redirect(url)
    candidates = images.cleanup_candidates(space, config)
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "action_label": "Delete",
            "object_label": f"the snapshots of old generations on {config.name}",
            "consequences": [
                f"Generation {c.image.generation} ({c.image.snapshot_id}): "
                + ("deleted, it becomes retired" if c.deletable else f"kept, {c.reason}")
                for c in candidates
            ]
            or ["There are no old generations with a snapshot."],
            "hidden": {"config": str(config.id)},
            "cancel_url": url,
            "section": "spaces",
        },
    )


@login_required
@require_GET
def version_install(request: HttpRequest, version_id: str) -> HttpResponse:
    """ "Install into a space…": the spaces the user administers, each to its Skill image page."""
    version = get_object_or_404(SkillVersion.objects.select_related("skill"), pk=version_id)
    spaces = spaces_for_user(request.user, Role.ADMIN).order_by("name")
    return render(
        request,
        "skills/version_install.html",
        {"version": version, "skill": version.skill, "spaces": spaces, "section": "skills"},
    )


# The space page's Skill image button (registered in SkillsConfig.ready()).
SPACE_ACTION = SpaceAction("Skill image", lambda space: reverse("skills:image_detail", args=[space.id]), order=20)
