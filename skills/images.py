"""Skill images: generations, the install/uninstall build, rollback and snapshot clean-up.

Writes go through the `do_*` functions here (each audited); the long ones run as admin jobs
(`skills.jobs`). The generation new sessions start from is the sandboxes-side `SessionImage`
pointer, written only through `sandboxes.catalog.services.do_set_session_image` (which also marks
the sessions on that config stale); `current_image` derives "current" from it, so there is one
source of truth.

A build (`build_generation`):
  create   a build sandbox from the current generation's snapshot (or the config's default
           template), inbound off, outbound off unless a pip index or npm registry must be
           reached (then to that host only where the backend can; `build_network`), console
           metadata with purpose skill-build
  copy     the skill's files to /opt/skills/<name> (root-owned, modes kept minus g/o write)
  dependencies  declared pip (offline wheel folder or index), npm, Debian (see install_packages.py)
  verify   the entry checks on every entry script, then the skill's check script, as uid 1000
  clean    scratch removed
  ledger   /opt/skills/.ledger.json
  snapshot backend.snapshots().create
  record   the generation becomes ready (snapshot id + fingerprint), then the pointer moves
and, whatever happened, the build sandbox is deleted. A failure leaves the previous
generation in force and says which step failed and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from console.models import AuditAction, Space
from console.services import Actor, ServiceError, record_audit
from sandboxes.backends.base import (
    RemoteError,
)
from sandboxes.catalog.bridge import config_fingerprint, get_backend
from sandboxes.catalog.services import do_set_session_image, sessions_using_snapshot
from sandboxes.models import SandboxConfig, SessionImage
from sandboxes.sessions.provisioning import effective_template

from .models import SkillImage, SkillImageStatus

# --- Reads -------------------------------------------------------------------------------


def _pointer_matches() -> Exists:
    """The generation is what its (space, config)'s SessionImage points at."""
    return Exists(
        SessionImage.objects.filter(
            space=OuterRef("space"),
            config=OuterRef("config"),
            snapshot_id=OuterRef("snapshot_id"),
            fingerprint=OuterRef("fingerprint"),
        )
    )


def current_image(space: Space, config: SandboxConfig) -> SkillImage | None:
    """The ready generation the config's pointer names (whatever its fingerprint says)."""
    pointer = SessionImage.objects.filter(space=space, config=config).first()
    if pointer is None:
        return None
    return (
        SkillImage.objects.filter(
            space=space,
            config=config,
            status=SkillImageStatus.READY,
            snapshot_id=pointer.snapshot_id,
            fingerprint=pointer.fingerprint,
        )
        .order_by("-generation")
        .first()
    )


def history(space: Space, config: SandboxConfig) -> QuerySet[SkillImage]:
    return (
        SkillImage.objects.filter(space=space, config=config)
        .annotate(pointed=_pointer_matches())
        .select_related("parent")
        .order_by("-generation")
    )


@dataclass(frozen=True)
class ImageState:
    """What the Skill image page shows for one (space, config)."""

    config: SandboxConfig
    current: SkillImage | None
    fingerprint_ok: bool
    effective_source: str
    effective_template: str
    note: str
    building: SkillImage | None


def image_state(space: Space, config: SandboxConfig) -> ImageState:
    effective = effective_template(space, config)
    current = current_image(space, config)
    fingerprint_ok = current is None or current.fingerprint == config_fingerprint(config)
    building = (
        SkillImage.objects.filter(space=space, config=config, status=SkillImageStatus.BUILDING)
        .order_by("-generation")
        .first()
    )
    return ImageState(
        config=config,
        current=current,
        fingerprint_ok=fingerprint_ok,
        effective_source=effective.source,
        effective_template=effective.template_id,
        note=effective.note,
        building=building,
    )


def is_rollback_target(image: SkillImage, current: SkillImage | None, fingerprint: str) -> bool:
    return (
        image.status == SkillImageStatus.READY
        and (current is None or image.pk != current.pk)
        and image.fingerprint == fingerprint
    )


# --- Rollback and clean-up ---------------------------------------------------------------


def do_rollback_image(image: SkillImage, *, actor: Actor) -> None:
    """Point the config's new sessions back at an earlier ready generation (sessions stale)."""
    config = image.config
    current = current_image(image.space, config)
    if image.status != SkillImageStatus.READY:
        raise ServiceError(f"Generation {image.generation} is {image.get_status_display().lower()}; it cannot be used.")
    if current is not None and current.pk == image.pk:
        raise ServiceError(f"Generation {image.generation} is already current.")
    if image.fingerprint != config_fingerprint(config):
        raise ServiceError(
            f"Generation {image.generation} belongs to another backend account than the config's; it cannot be used."
        )
    snapshots = get_backend(config).snapshots()
    if snapshots is not None and image.snapshot_id not in {s.snapshot_id for s in snapshots.list()}:
        raise ServiceError(f"The snapshot of generation {image.generation} is gone from the backend.")
    with transaction.atomic():
        do_set_session_image(
            image.space,
            config,
            snapshot_id=image.snapshot_id,
            fingerprint=image.fingerprint,
            label=f"skills generation {image.generation}: {', '.join(image.skill_names) or 'no skills'}",
            actor=actor,
        )
        record_audit(
            actor,
            AuditAction.SKILL_IMAGE_ROLLBACK,
            space=image.space,
            target_type="skill_image",
            target_id=image.pk,
            target_name=f"generation {image.generation}",
            details={
                "config": str(config.pk),
                "generation": image.generation,
                "from_generation": current.generation if current else None,
                "snapshot_id": image.snapshot_id,
            },
        )


@dataclass(frozen=True)
class CleanupCandidate:
    image: SkillImage
    deletable: bool
    reason: str


def cleanup_candidates(space: Space, config: SandboxConfig) -> list[CleanupCandidate]:
    """Ready generations other than the current one, and whether their snapshot may go."""
    current = current_image(space, config)
    fingerprint = config_fingerprint(config)
    found = []
    for image in SkillImage.objects.filter(space=space, config=config, status=SkillImageStatus.READY).order_by(
        "-generation"
    ):
        if current is not None and image.pk == current.pk:
            continue
        if image.fingerprint != fingerprint:
            found.append(CleanupCandidate(image, False, "held by another backend account"))
            continue
        users = sessions_using_snapshot(image.snapshot_id)
        if users:
            found.append(CleanupCandidate(image, False, f"{users} session(s) still run from it"))
            continue
        found.append(CleanupCandidate(image, True, "no session uses it"))
    return found


def do_delete_old_snapshots(space: Space, config: SandboxConfig, *, actor: Actor) -> tuple[list[int], list[str]]:
    """Delete the snapshots of old generations no session uses; they become retired.

    Newest first, so a backend whose snapshots stack on each other (Docker images) can drop
    a child before its parent. Returns (retired generations, reasons others were kept).
    """
    backend = get_backend(config)
    snapshots = backend.snapshots()
    if snapshots is None:
        raise ServiceError(f"{backend.label} has no snapshots to delete.")
    retired: list[int] = []
    kept: list[str] = []
    for candidate in cleanup_candidates(space, config):
        image = candidate.image
        if not candidate.deletable:
            kept.append(f"generation {image.generation}: {candidate.reason}")
            continue
        try:
            snapshots.delete(image.snapshot_id)
        except RemoteError as exc:
            kept.append(f"generation {image.generation}: the backend refused ({exc.kind}: {exc.message})")
            continue
        SkillImage.objects.filter(pk=image.pk).update(status=SkillImageStatus.RETIRED)
        retired.append(image.generation)
    if retired:
        record_audit(
            actor,
            AuditAction.SKILL_IMAGE_DELETE_SNAPSHOTS,
            space=space,
            target_type="sandbox_config",
            target_id=config.pk,
            target_name=config.name,
            details={"retired_generations": retired, "kept": kept},
        )
    return retired, kept


def skills_sorted(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(entries, key=lambda entry: str(entry.get("name", "")))
