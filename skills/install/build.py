"""Building a skill image generation from its plan (`install.plan`): the build sandbox and
its network (`install.network`), the install steps (`install.steps`, `install.packages`,
`install.npm`), the snapshot, and recording the generation (or its failure).

Run by the job handlers of `install.jobs`; started through `install.start`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from console.jobs import JobCancelled
from console.models import AdminJob, AuditAction, Space
from console.services import Actor, ServiceError, record_audit
from sandboxes.backends.base import (
    META_JOB,
    META_PURPOSE,
    Backend,
    NetworkSpec,
    RemoteError,
    SandboxSpec,
)
from sandboxes.catalog.bridge import config_fingerprint, console_metadata, get_backend, sandbox_resources
from sandboxes.catalog.services import do_set_session_image
from sandboxes.models import SandboxConfig, SessionImage
from sandboxes.network.log import watch_build_sandbox

from ..models import SkillImage, SkillImageAction, SkillImageItem, SkillImageStatus, SkillVersion
from ..snapshot_refs import SKILL_IMAGE_LABEL
from . import lock as install_lock
from . import packages as install_packages
from . import steps as install
from .network import BuildNetwork, build_network, sources_to_reach
from .npm import install_npm, node_debian_packages
from .packages import PackageSources
from .plan import BuildPlan, Reporter, package_sources
from .sources_check import check_sources
from .steps import SkillPayload, StepFailed

# --- Building a generation ---------------------------------------------------------------

STEPS = ("create", "check", "copy", "dependencies", "verify", "clean", "ledger", "snapshot", "record")
BUILD_PURPOSE = "skill-build"
META_SKILL_IMAGE = "console-skill-image"
BUILD_TIMEOUT_S = 1800

# The audit action each kind of image build records.
IMAGE_AUDIT_ACTIONS: dict[SkillImageAction, AuditAction] = {
    SkillImageAction.INSTALL: AuditAction.SKILL_IMAGE_INSTALL,
    SkillImageAction.UNINSTALL: AuditAction.SKILL_IMAGE_UNINSTALL,
}


def next_generation(space: Space, config: SandboxConfig) -> int:
    top = SkillImage.objects.filter(space=space, config=config).aggregate(top=Max("generation"))["top"]
    return int(top or 0) + 1


def create_generation_row(
    space: Space, config: SandboxConfig, plan: BuildPlan, *, actor: Actor, job: AdminJob | None
) -> SkillImage:
    for _ in range(5):
        try:
            with transaction.atomic():
                return SkillImage.objects.create(
                    space=space,
                    config=config,
                    generation=next_generation(space, config),
                    parent=plan.parent,
                    action=plan.action,
                    subject=plan.subject[:300],
                    base_template=plan.base_template,
                    created_by=actor.user,
                    created_by_name=actor.name,
                    job=job,
                )
        except IntegrityError:
            continue  # another build took the number at the same moment
    raise ServiceError("Could not allocate a generation number; try again.")


class _Build:
    """One build's state: the row, timings and log, and the sandbox to delete afterwards."""

    def __init__(self, image: SkillImage, reporter: Reporter) -> None:
        self.image = image
        self.reporter = reporter
        self.timings: dict[str, float] = {}
        self.lines: list[str] = []
        self.current = STEPS[0]

    def log(self, message: str) -> None:
        self.lines.append(message)
        self.reporter.log(message)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        percent = int(100 * STEPS.index(name) / len(STEPS))
        self.current = name
        self.reporter.progress(percent, f"step {name}")
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - started, 3)


def build_generation(
    space: Space,
    config: SandboxConfig,
    plan: BuildPlan,
    *,
    actor: Actor,
    reporter: Reporter,
    job: AdminJob | None = None,
) -> SkillImage:
    """Build, snapshot and record one generation; the pointer moves only on success.

    Raises StepFailed (the generation is marked failed, the previous one stays in force).
    """
    image = create_generation_row(space, config, plan, actor=actor, job=job)
    build = _Build(image, reporter)
    fingerprint = config_fingerprint(config)
    backend = get_backend(config)
    sandbox_id: str | None = None
    snapshot_id: str | None = None
    try:
        build.log(f"generation {image.generation}: {plan.action} {plan.subject}, starting from {plan.base_template}")
        with build.step("create"):
            sources = package_sources(config)
            network = network_for_build(backend, sources, plan.add)
            build.log(network.description)
            sandbox_id = create_build_sandbox(backend, space, config, plan.base_template, image, network.spec, job)
            watch_build_sandbox(sandbox_id, space=space, job=job)  # its refusals go to this job
            build.log(f"build sandbox {sandbox_id[:12]} created")
        with build.step("check"):
            # Every package of every kind against its source, before anything installs.
            check_sources(backend, sandbox_id, plan.add, sources, build.log)
        with build.step("copy"):
            for name in plan.removed:
                install.remove_skill(backend, sandbox_id, name)
            for payload in plan.add:
                install.copy_skill(backend, sandbox_id, payload, build.log)
        with build.step("dependencies"):
            before = install_lock.distributions(backend, sandbox_id)
            sources = with_parent_lock(backend, sandbox_id, plan, sources, build.log)
            # Node.js and npm from Debian when the template lacks npm, then Debian, pip and npm.
            node, _ = node_debian_packages(backend, sandbox_id, plan.add, "dependencies")
            try:
                installed = install_packages.install_dependencies(
                    backend, sandbox_id, plan.add, sources, build.log, also_debian=node
                )
            except StepFailed as exc:
                raise install_lock.explain_failure(exc, plan.parent, sources.pip_constraints) from exc
            after = install_lock.distributions(backend, sandbox_id)
            image.lock = {"pip": install_lock.lock_after_build(parent_lock(plan), before, after)}
            build.log("pip lock: " + (install_lock.constraints_text(image.lock["pip"]).replace("\n", " ") or "empty"))
            for name, packages in install_npm(backend, sandbox_id, plan.add, sources, build.log).items():
                installed[name] += packages
        with build.step("verify"):
            install.save_session_state(backend, sandbox_id)
            checks: dict[str, str] = {}
            for payload in plan.add:
                checks[payload.name] = install.verify_skill(backend, sandbox_id, payload, build.log)
                # Each skill's checks start from the template's home, not the last check script's.
                install.restore_session_state(backend, sandbox_id, build.log)
        with build.step("clean"):
            install.clean_scratch(backend, sandbox_id, build.log)
        manifest = [*plan.keep, *(manifest_entry(p, installed[p.name], checks[p.name]) for p in plan.add)]
        manifest.sort(key=lambda entry: str(entry["name"]))
        with build.step("ledger"):
            install.write_ledger(backend, sandbox_id, ledger_for(image, manifest), build.log)
        with build.step("snapshot"):
            snapshot_id = take_snapshot(backend, sandbox_id, config, image)
            build.log(f"snapshot {snapshot_id} created")
        with build.step("record"):
            record_generation(space, config, image, plan, manifest, snapshot_id, fingerprint, build, actor=actor)
            build.log(f"generation {image.generation} is current; the config's sessions are marked stale")
        image.timings = dict(build.timings)
        SkillImage.objects.filter(pk=image.pk).update(timings=image.timings, log="\n".join(build.lines))
    except (StepFailed, JobCancelled) as exc:
        step = exc.step if isinstance(exc, StepFailed) else build.current
        fail_generation(image, build, step, exc.message if isinstance(exc, StepFailed) else "cancelled by an admin")
        if snapshot_id is not None:
            delete_quietly(lambda: _delete_snapshot(backend, snapshot_id))
        raise
    except Exception as exc:
        step = build.current
        fail_generation(image, build, step, f"{exc.__class__.__name__}: {exc}")
        if snapshot_id is not None:
            delete_quietly(lambda: _delete_snapshot(backend, snapshot_id))
        raise StepFailed(step, f"{exc.__class__.__name__}: {exc}") from exc
    finally:
        if sandbox_id is not None:
            build_id = sandbox_id
            delete_quietly(lambda: backend.delete(build_id))
            build.reporter.log(f"build sandbox {build_id[:12]} deleted")
    return image


def parent_lock(plan: BuildPlan) -> dict[str, str]:
    """The parent generation's pip lock; entries that are not name -> version (a row edited by
    hand) are left out rather than failing every later rebuild."""
    stored = plan.parent.lock if plan.parent is not None else None
    pip = stored.get("pip") if isinstance(stored, dict) else None
    if not isinstance(pip, dict):
        return {}
    return {name: version for name, version in pip.items() if isinstance(name, str) and isinstance(version, str)}


def with_parent_lock(
    backend: Backend, sandbox_id: str, plan: BuildPlan, sources: PackageSources, log: Callable[[str], None]
) -> PackageSources:
    """A rebuild from the base template (an uninstall) installs with the parent's lock as pip
    constraints, so its skills get the versions they had; a build on the parent's snapshot
    already has them installed."""
    if plan.parent is None or plan.base_template == plan.parent.snapshot_id:
        return sources
    if not any(payload.pip_requirements for payload in plan.add):
        return sources
    path = install_lock.write_constraints(backend, sandbox_id, parent_lock(plan), plan.parent.generation, log)
    return dataclasses.replace(sources, pip_constraints=path) if path else sources


def network_for_build(backend: Backend, sources: PackageSources, skills: Sequence[SkillPayload]) -> BuildNetwork:
    """Offline unless these skills need the config's pip index or npm registry (build_network).

    Not the space's network policy: that governs the space's sessions, and a build sandbox
    runs only the console's install steps.
    """
    return build_network(backend.network_capabilities(), backend.label, sources_to_reach(sources, skills))


def create_build_sandbox(
    backend: Backend,
    space: Space,
    config: SandboxConfig,
    template: str,
    image: SkillImage,
    network: NetworkSpec,
    job: AdminJob | None = None,
) -> str:
    labels = {META_PURPOSE: BUILD_PURPOSE, META_SKILL_IMAGE: str(image.pk)}
    if job is not None:
        labels[META_JOB] = str(job.pk)  # once the job ended, the reaper gives it no job grace
    spec = SandboxSpec(
        template_id=template,
        network=network,
        metadata=console_metadata(config, **labels),
        resources=sandbox_resources(config),
        timeout_s=BUILD_TIMEOUT_S,
        auto_pause=False,
        auto_resume=False,
    )
    try:
        return backend.create(spec).sandbox_id
    except RemoteError as exc:
        raise StepFailed("create", f"{exc.kind}: {exc.message}") from exc


def take_snapshot(backend: Backend, sandbox_id: str, config: SandboxConfig, image: SkillImage) -> str:
    snapshots = backend.snapshots()
    if snapshots is None:
        raise StepFailed("snapshot", f"{backend.label} cannot take snapshots; skill images need them")
    try:
        info = snapshots.create(
            sandbox_id,
            name=f"skills-{config.space.slug}-g{image.generation}",
            # Installation + space: only this space sees it in the catalog (sandboxes.catalog).
            labels={
                **console_metadata(config),
                SKILL_IMAGE_LABEL: str(image.pk),
                "console.skill-image.generation": str(image.generation),
            },
        )
    except RemoteError as exc:
        raise StepFailed("snapshot", f"{exc.kind}: {exc.message}") from exc
    return info.snapshot_id


def manifest_entry(payload: SkillPayload, installed: list[str], check: str) -> dict[str, Any]:
    return {
        "name": payload.name,
        "version_id": payload.version_id,
        "content_hash": payload.content_hash,
        "size": payload.size,
        "file_count": len(payload.files),
        "dependencies": {
            "pip": payload.pip_requirements,
            "npm": [f"{dep['name']}@{dep['version']}" for dep in payload.npm_packages],
            "debian": payload.debian_packages,
        },
        "installed": installed,
        "verified_by": check,
    }


def ledger_for(image: SkillImage, manifest: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "generation": image.generation,
        "space": str(image.space_id),
        "config": str(image.config_id),
        "built": timezone.now().isoformat(timespec="seconds"),
        "skills": [
            {key: entry[key] for key in ("name", "content_hash", "size", "dependencies", "installed")}
            for entry in manifest
        ],
    }


def record_generation(
    space: Space,
    config: SandboxConfig,
    image: SkillImage,
    plan: BuildPlan,
    manifest: list[dict[str, Any]],
    snapshot_id: str,
    fingerprint: str,
    build: _Build,
    *,
    actor: Actor,
) -> None:
    """Mark the generation ready and move the pointer, unless the world changed meanwhile."""
    fresh = SandboxConfig.objects.get(pk=config.pk)
    if config_fingerprint(fresh) != fingerprint:
        raise StepFailed("record", "the config's backend account changed during the build; run it again")
    with transaction.atomic():
        pointer = SessionImage.objects.select_for_update().filter(space=space, config=config).first()
        if (pointer.snapshot_id if pointer is not None else None) != plan.pointer_at_start:
            raise StepFailed("record", "another change to this skill image finished during the build; run it again")
        image.snapshot_id = snapshot_id
        image.fingerprint = fingerprint
        image.manifest = manifest
        image.status = SkillImageStatus.READY
        image.timings = {**build.timings, "record": 0.0}
        image.log = "\n".join(build.lines)
        image.finished = timezone.now()
        image.save(
            update_fields=["snapshot_id", "fingerprint", "manifest", "lock", "status", "timings", "log", "finished"]
        )
        versions = {str(v.pk): v for v in SkillVersion.objects.filter(pk__in=[e["version_id"] for e in manifest])}
        SkillImageItem.objects.bulk_create(
            [
                SkillImageItem(
                    image=image,
                    skill_id=versions[e["version_id"]].skill_id if e["version_id"] in versions else None,
                    version=versions.get(e["version_id"]),
                    name=e["name"],
                    content_hash=e["content_hash"],
                )
                for e in manifest
            ]
        )
        names = ", ".join(entry["name"] for entry in manifest) or "no skills"
        do_set_session_image(
            space,
            config,
            snapshot_id=snapshot_id,
            fingerprint=fingerprint,
            label=f"skills generation {image.generation}: {names}",
            actor=actor,
        )
        record_audit(
            actor,
            IMAGE_AUDIT_ACTIONS[plan.action],
            space=space,
            target_type="skill_image",
            target_id=image.pk,
            target_name=f"generation {image.generation}",
            details={
                "config": str(config.pk),
                "generation": image.generation,
                "subject": plan.subject,
                "snapshot_id": snapshot_id,
                "skills": [entry["name"] for entry in manifest],
            },
        )


def fail_generation(image: SkillImage, build: _Build, step: str, message: str) -> None:
    build.lines.append(f"FAILED at step {step}: {message}")
    SkillImage.objects.filter(pk=image.pk).update(
        status=SkillImageStatus.FAILED,
        failed_step=step,
        error=message[:4000],
        timings=build.timings,
        log="\n".join(build.lines),
        finished=timezone.now(),
    )


def delete_quietly(action: Callable[[], None]) -> None:
    with contextlib.suppress(RemoteError):  # the reaper removes what is left
        action()


def _delete_snapshot(backend: Backend, snapshot_id: str) -> None:
    snapshots = backend.snapshots()
    if snapshots is not None:
        snapshots.delete(snapshot_id)
