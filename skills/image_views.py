"""The Skill image pages of a space: its generations, install and uninstall (through
`skills.install.start`), rollback, snapshot clean-up, and the space page's Skill image button.
Space admins act; members read.

The one-step install: the skill's card, "Install into a space…" and the space page's Install a
skill panel post a version and a target (a space the user administers and one of its configs)
to `quick_install`, which starts the job and answers, to HTMX, the job's status polling inline.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console import jobs as job_runner
from console.access import get_space_for_user, has_role, spaces_for_user
from console.models import Role, Space
from console.panels import SpaceAction, SpacePanel
from console.services import ServiceError, actor_from_request
from console.views import is_htmx
from sandboxes.backends.base import RemoteError
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import SandboxConfig

from . import images
from .forms import SkillInstallForm
from .install import start
from .models import Skill, SkillImage, SkillVersion


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


def install_targets(user: Any, spaces: Any = None) -> list[tuple[Space, list[tuple[str, str]]]]:
    """The spaces `user` administers (of `spaces` when given), each with its configs as
    (target value "<space id>:<config id>", label), the default config first; spaces without a
    config are left out."""
    admin_spaces = spaces_for_user(user, Role.ADMIN).order_by("name")
    if spaces is not None:
        admin_spaces = admin_spaces.filter(pk__in=[space.pk for space in spaces])
    found = list(admin_spaces)
    configs: dict[Any, list[tuple[str, str]]] = {}
    rows = SandboxConfig.objects.filter(space__in=found).order_by("-is_default", "created")
    for config in rows.only("id", "space_id", "name", "is_default"):
        label = f"{config.name} (default)" if config.is_default else config.name
        configs.setdefault(config.space_id, []).append((f"{config.space_id}:{config.id}", label))
    return [(space, configs[space.pk]) for space in found if space.pk in configs]


@login_required
@require_GET
def version_install(request: HttpRequest, version_id: str) -> HttpResponse:
    """ "Install into a space…": the one-step form on a page of its own (as the card has it)."""
    version = get_object_or_404(SkillVersion.objects.select_related("skill"), pk=version_id)
    return render(
        request,
        "skills/version_install.html",
        {
            "version": version,
            "skill": version.skill,
            "install_targets": install_targets(request.user),
            "section": "skills",
        },
    )


@login_required
@require_POST
def quick_install(request: HttpRequest) -> HttpResponse:
    """Install a version into a space's config in one step: the target names a space the user
    administers (another is 404, a space they only belong to 403, as every space page) and one
    of its configs. HTMX gets the job's status, polling, in place; a plain post goes to the
    job's page."""
    version_id = _uuid_or_none(request.POST.get("version"))
    version = SkillVersion.objects.select_related("skill").filter(pk=version_id).first() if version_id else None
    space_part, _, config_part = (request.POST.get("target") or "").partition(":")
    space = get_space_for_user(request.user, space_part, Role.ADMIN)
    config_id = _uuid_or_none(config_part)
    config = SandboxConfig.objects.filter(pk=config_id, space=space).first() if config_id else None
    try:
        if version is None:
            raise ServiceError("Choose a skill to install.")
        if config is None:
            raise ServiceError(f"Choose a sandbox config of {space.name}.")
        job = start.do_start_install(space, config, version, actor=actor_from_request(request))
    except ServiceError as exc:
        if is_htmx(request):
            return render(request, "skills/partials/quick_install_result.html", {"error": exc.message})
        messages.error(request, exc.message)
        back = reverse("skills:version_install", args=[version.id]) if version else _image_url(space, config)
        return redirect(back)
    said = f"Installing {version.skill.name} into {space.name} on {config.name}."
    if not is_htmx(request):
        messages.info(request, said)
        return redirect(job)
    context = {"job": job, "label": job_runner.job_label(job.kind), "can_cancel": True, "said": said}
    return render(request, "skills/partials/quick_install_result.html", context)


def _space_install_panel(request: HttpRequest, space: Space, is_admin: bool) -> dict[str, Any]:
    """The space page's Install a skill panel: for its admins, when it has a config."""
    if not is_admin:
        return {"skill_install_targets": []}
    return {
        "skill_install_targets": install_targets(request.user, [space]),
        "skill_install_versions": _version_choices(None),
    }


# The space page's Skill image button and Install a skill panel (registered in SkillsConfig.ready()).
SPACE_ACTION = SpaceAction("Skill image", lambda space: reverse("skills:image_detail", args=[space.id]), order=20)
SPACE_PANEL = SpacePanel("skills/partials/space_install_panel.html", _space_install_panel, order=40)
