"""Job handlers of the sandboxes app: connection tests and template builds."""

from __future__ import annotations

from typing import Any

from console.jobs import JobContext, JobFailed, job_handler

from ..backends.base import RemoteError, TemplateBuildSpec
from ..models import SandboxConfig
from .bridge import sandbox_resources
from .services import StepResult, build_template, run_connection_test


def _config(ctx: JobContext) -> SandboxConfig:
    try:
        return SandboxConfig.objects.select_related("space").get(pk=ctx.params["config_id"])
    except SandboxConfig.DoesNotExist:
        raise JobFailed("the sandbox config was deleted") from None


@job_handler("sandboxes.test_connection", label="Test connection")
def test_connection(ctx: JobContext) -> dict[str, Any]:
    config = _config(ctx)
    ctx.log(f"Testing {config.name} ({config.get_kind_display()}) with template {config.default_template}")
    done: list[StepResult] = []

    def report(step: StepResult) -> None:
        done.append(step)
        ctx.progress(25 * len(done), f"{step.name}: {'ok' if step.ok else 'FAILED'} in {step.ms:.0f} ms, {step.detail}")

    steps = run_connection_test(config, report)
    result = {"steps": [step.as_json() for step in steps]}
    failed = [step for step in steps if not step.ok]
    if failed:
        raise JobFailed(f"step {failed[0].name} failed: {failed[0].detail}")
    return result


@job_handler("sandboxes.build_template", label="Build template")
def build_template_job(ctx: JobContext) -> dict[str, Any]:
    config = _config(ctx)
    spec = TemplateBuildSpec(
        name=ctx.params["name"],
        base_template_id=ctx.params.get("base_template_id") or None,
        debian_packages=tuple(ctx.params.get("debian_packages") or ()),
        script=ctx.params.get("script", ""),
        labels={"console.template.description": ctx.params.get("description", "")},
        # Where a backend sets the disk per template (Cube): the config's limit.
        disk_mb=sandbox_resources(config).disk_mb,
    )
    what = "Debian packages " + ", ".join(spec.debian_packages) if spec.debian_packages else "a script"
    ctx.progress(5, f"Building template {spec.name} from {what}; this can take a few minutes.")
    try:
        template_id = build_template(config, spec, platform=bool(ctx.params.get("platform_template")))
    except RemoteError as exc:
        raise JobFailed(f"{exc.kind}: {exc.message}") from exc
    ctx.log(f"Template {template_id} is ready.")
    return {"template_id": template_id}
