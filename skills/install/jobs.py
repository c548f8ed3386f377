"""Job handlers of the skills app: install a skill into a space's image, and uninstall one.

Thin: they load the rows named in the params and call `skills.image_builds.build_generation`. A
failed step ends the job as failed with "step <name> failed: <why>"; the previous generation
stays in force (see skills/images.py).
"""

from __future__ import annotations

from typing import Any

from console.jobs import JobContext, JobFailed, job_handler
from console.models import Space
from console.services import Actor
from sandboxes.models import SandboxConfig

from ..models import SkillVersion
from .build import build_generation
from .plan import BuildPlan, plan_install, plan_uninstall
from .steps import StepFailed


class JobReporter:
    """A `Reporter` over the job's progress and live log."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def log(self, message: str) -> None:
        self.ctx.log(message)

    def progress(self, percent: int, message: str | None = None) -> None:
        self.ctx.progress(percent, message)


def _load(ctx: JobContext) -> tuple[Space, SandboxConfig]:
    try:
        config = SandboxConfig.objects.select_related("space").get(
            pk=ctx.params["config_id"], space_id=ctx.params["space_id"]
        )
    except SandboxConfig.DoesNotExist:
        raise JobFailed("the sandbox config was deleted") from None
    return config.space, config


def _run(ctx: JobContext, space: Space, config: SandboxConfig, plan: BuildPlan) -> dict[str, Any]:
    actor = Actor(user=ctx.job.created_by)
    try:
        image = build_generation(space, config, plan, actor=actor, reporter=JobReporter(ctx), job=ctx.job)
    except StepFailed as exc:
        raise JobFailed(f"step {exc.step} failed: {exc.message}") from exc
    return {
        "generation": image.generation,
        "snapshot_id": image.snapshot_id,
        "skills": image.skill_names,
        "timings": image.timings,
    }


@job_handler("skills.install", label="Install skill")
def install_skill(ctx: JobContext) -> dict[str, Any]:
    space, config = _load(ctx)
    version = SkillVersion.objects.select_related("skill").filter(pk=ctx.params["skill_version_id"]).first()
    if version is None:
        raise JobFailed("the skill version was deleted from the catalog")
    reporter = JobReporter(ctx)
    ctx.log(f"Installing {version} into {space.name} on {config.name}")
    return _run(ctx, space, config, plan_install(space, config, version, reporter))


@job_handler("skills.uninstall", label="Uninstall skill")
def uninstall_skill(ctx: JobContext) -> dict[str, Any]:
    space, config = _load(ctx)
    name = str(ctx.params["skill_name"])
    ctx.log(f"Uninstalling {name} from {space.name} on {config.name}: rebuilding from the default template")
    try:
        plan = plan_uninstall(space, config, name)
    except StepFailed as exc:
        raise JobFailed(f"step {exc.step} failed: {exc.message}") from exc
    return _run(ctx, space, config, plan)
