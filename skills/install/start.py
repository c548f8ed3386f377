"""Installing a skill starts here: `do_start_install` (and `do_start_uninstall`) checks the
space's config can take a build now and queues the admin job (`install.jobs`), which plans
the generation (`install.plan`) and builds it (`install.build`: the build sandbox, its network,
the steps and the snapshot). `fail_interrupted_builds` fails a generation whose job died.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.utils import timezone

from console.jobs import start_job
from console.models import AdminJob, Space
from console.services import Actor, ServiceError
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import SandboxConfig

from ..images import current_image
from ..models import SkillImage, SkillImageStatus, SkillVersion

# A "building" row older than this no longer blocks builds (a last resort: a build whose
# process died fails as soon as that is known, `fail_interrupted_builds`).
BUILD_STALE_AFTER = timedelta(hours=2)


def _check_config(space: Space, config: SandboxConfig) -> None:
    if config.space_id != space.pk:
        raise ServiceError("This config belongs to another space.")


def _check_not_building(space: Space, config: SandboxConfig) -> None:
    busy = SkillImage.objects.filter(
        space=space,
        config=config,
        status=SkillImageStatus.BUILDING,
        created__gte=timezone.now() - BUILD_STALE_AFTER,
    ).first()
    if busy is not None:
        raise ServiceError(f"Generation {busy.generation} is still building on {config.name}; wait for it to finish.")


def do_start_install(space: Space, config: SandboxConfig, version: SkillVersion, *, actor: Actor) -> AdminJob:
    """Queue the `skills.install` job (audited as job.start) after checking it can run."""
    _check_config(space, config)
    _check_not_building(space, config)
    current = current_image(space, config)
    if (
        current is not None
        and current.fingerprint == config_fingerprint(config)
        and current.items.filter(version_id=version.pk).exists()
    ):
        raise ServiceError(f"{version} is already installed in the current skill image on {config.name}.")
    return start_job(
        "skills.install",
        actor=actor,
        space=space,
        params={"space_id": str(space.pk), "config_id": str(config.pk), "skill_version_id": str(version.pk)},
    )


def do_start_uninstall(space: Space, config: SandboxConfig, skill_name: str, *, actor: Actor) -> AdminJob:
    """Queue the `skills.uninstall` job: a new generation from the base without the skill."""
    _check_config(space, config)
    _check_not_building(space, config)
    current = current_image(space, config)
    if current is None or skill_name not in current.skill_names:
        raise ServiceError(f"{skill_name} is not in the current skill image on {config.name}.")
    return start_job(
        "skills.uninstall",
        actor=actor,
        space=space,
        params={"space_id": str(space.pk), "config_id": str(config.pk), "skill_name": skill_name},
    )


def fail_interrupted_builds(job_ids: Sequence[Any] = (), **_: Any) -> str:
    """A generation whose job was interrupted (its console process died or shut down) is
    failed, so the previous generation stays in force and the next install or uninstall
    starts at once. The pointer only ever moves in the build's last step, with the
    generation ready: a building one never had it. Inside the transaction of
    `console.processes.release_process`; its build sandbox is left to the reaper."""
    if not job_ids:
        return ""
    interrupted = SkillImage.objects.filter(job_id__in=list(job_ids), status=SkillImageStatus.BUILDING)
    generations = list(interrupted.values_list("generation", flat=True))
    interrupted.update(
        status=SkillImageStatus.FAILED,
        error="Interrupted by a restart: the console process building it stopped; the previous generation "
        "stays in force. Run the install or uninstall again.",
        finished=timezone.now(),
    )
    if not generations:
        return ""
    return "skill image generation(s) " + ", ".join(str(g) for g in sorted(generations)) + " failed"
