"""The template and snapshot catalog as one space sees it, and the deletes it may do.

One backend account (a Docker engine, an E2B/Cube team) is shared by every space granted
it, and by other installations of the console. A space sees the platform's templates and
its own templates and snapshots, never another tenant's: ownership is read from the
labels the console puts on what it creates (installation + space) and, where a backend
keeps no labels (E2B, Cube), from the console's own records: of snapshots it took for the
space, and of templates it built for a space or for the platform (`TemplateRecord`).
Everything here is checked in the service layer, so a forged POST is refused exactly as
the missing link is.

Imports: the sandboxes app and console only. The skills app answers `snapshot_references`
(which generations use a snapshot) and `snapshot_force_deleted` (fall back) as receivers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import django.dispatch
from django.db import transaction

from console.access import is_platform_admin
from console.models import AuditAction
from console.services import Actor, ServiceError, record_audit

from ..backends.base import (
    ErrorKind,
    RemoteError,
    SnapshotInfo,
    TemplateInfo,
    is_snapshot_id,
)
from ..models import SandboxConfig, Session, SessionImage, TemplateRecord
from .bridge import (
    OWN,
    PLATFORM,
    config_fingerprint,
    console_metadata,
    get_backend,
    labelled_owner,
    recorded_template_owners,
    template_owner,
)
from .services import do_clear_session_image

# Receivers return a list of `SnapshotReference` for (snapshot_id, fingerprint).
snapshot_references = django.dispatch.Signal()
# Sent after a platform admin deleted a snapshot still referenced: receivers fall back.
snapshot_force_deleted = django.dispatch.Signal()
# Sent after a snapshot went with the last session that ran from it (no pointer on it):
# receivers retire the generations recorded on it.
snapshot_retired = django.dispatch.Signal()

NEVER = datetime.min.replace(tzinfo=UTC)


class CatalogItemNotFound(ServiceError):
    """Not in this space's catalog: missing, or another tenant's (the same answer, a 404)."""


class CatalogItemForbidden(ServiceError):
    """Visible to the space, but only platform admins may delete it (a 403)."""


class CatalogItemInUse(ServiceError):
    """Still used by a skill image or a live session; says by what."""

    def __init__(self, message: str, users: list[str]) -> None:
        super().__init__(message)
        self.users = users


@dataclass(frozen=True)
class SnapshotReference:
    """Something of the console that uses a snapshot, in words for the page."""

    description: str
    space_id: str


def owner_labels(config: SandboxConfig) -> dict[str, str]:
    """What the console puts on every template and snapshot it makes for a space."""
    return console_metadata(config)


def recorded_snapshot_ids(config: SandboxConfig) -> set[str]:
    """Snapshots the console's own records say it took for the config's space on this account."""
    fingerprint = config_fingerprint(config)
    ids = set(
        SessionImage.objects.filter(space_id=config.space_id, fingerprint=fingerprint).values_list(
            "snapshot_id", flat=True
        )
    )
    ids.update(ref_id for ref_id, ref in _references(None, fingerprint) if ref.space_id == str(config.space_id))
    return ids


def _references(
    snapshot_id: str | None, fingerprint: str, labels: Mapping[str, str] | None = None
) -> list[tuple[str, SnapshotReference]]:
    """(snapshot id, reference) from every receiver; all snapshots when `snapshot_id` is None.
    `labels` are the snapshot's own (a build names itself there before it records the id)."""
    found: list[tuple[str, SnapshotReference]] = []
    for _, refs in snapshot_references.send(
        sender=SandboxConfig, snapshot_id=snapshot_id, fingerprint=fingerprint, labels=labels or {}
    ):
        found.extend(refs or [])  # type: ignore[arg-type]  # receivers answer lists; send() is typed loosely
    return found


def snapshot_is_own(snapshot: SnapshotInfo, config: SandboxConfig, recorded: set[str]) -> bool:
    owner = labelled_owner(snapshot.labels, config.space)
    if owner is not None:
        return owner == OWN
    return snapshot.snapshot_id in recorded


@dataclass
class Catalog:
    templates: list[TemplateInfo] = field(default_factory=list)
    snapshots: list[SnapshotInfo] = field(default_factory=list)
    own_templates: set[str] = field(default_factory=set)
    users: dict[str, list[str]] = field(default_factory=dict)  # snapshot id -> what uses it
    templates_supported: bool = True
    snapshots_supported: bool = True
    error: str = ""


def load_catalog(config: SandboxConfig) -> Catalog:
    """The platform's templates and the space's own templates and snapshots. Raises RemoteError."""
    catalog = Catalog()
    backend = get_backend(config)
    templates, snapshots = backend.templates(), backend.snapshots()
    catalog.templates_supported = templates is not None
    catalog.snapshots_supported = snapshots is not None
    all_snapshot_ids: set[str] = set()
    if snapshots is not None:
        listed = snapshots.list()
        all_snapshot_ids = {s.snapshot_id for s in listed}
        recorded = recorded_snapshot_ids(config)
        catalog.snapshots = sorted(
            (s for s in listed if snapshot_is_own(s, config, recorded)),
            key=lambda s: s.created_at or NEVER,
            reverse=True,
        )
    if templates is not None:
        recorded_templates = recorded_template_owners(config)
        for template in templates.list():
            if is_snapshot_id(template.template_id) or template.template_id in all_snapshot_ids:
                continue
            owner = template_owner(template, config, recorded_templates)
            if owner is None:
                continue
            if owner == OWN:
                catalog.own_templates.add(template.template_id)
            catalog.templates.append(template)
    return catalog


def snapshot_users(config: SandboxConfig, snapshot_id: str, labels: Mapping[str, str] | None = None) -> list[str]:
    """What still uses the snapshot on this account: skill images (also one a build just took
    and has not recorded yet, known by `labels`) and live sessions, in words."""
    fingerprint = config_fingerprint(config)
    users = [
        f"the current skill image of config {image.config.name}"
        for image in SessionImage.objects.filter(snapshot_id=snapshot_id, fingerprint=fingerprint).select_related(
            "config"
        )
    ]
    users.extend(ref.description for _, ref in _references(snapshot_id, fingerprint, labels))
    sessions = Session.objects.filter(template_id=snapshot_id).exclude(sandbox_id="").select_related("config")
    users.extend(f"live session {s.key}" for s in sessions if config_fingerprint(s.config) == fingerprint)
    return list(dict.fromkeys(users))


def _find(items: list[Any], attr: str, item_id: str) -> Any:
    return next((item for item in items if getattr(item, attr) == item_id), None)


def do_delete_snapshot(config: SandboxConfig, snapshot_id: str, *, actor: Actor, force: bool = False) -> None:
    """Delete one of the space's own snapshots, refused while something uses it.

    A platform admin may force it: skill images recorded on it then fall back to the
    config's default template (and say so); live sandboxes keep the backend's own refusal.
    """
    if force and not is_platform_admin(actor.user):
        raise CatalogItemForbidden("Only platform admins can delete a snapshot that is still in use.")
    backend = get_backend(config)
    snapshots = backend.snapshots()
    if snapshots is None:
        raise RemoteError(ErrorKind.UNSUPPORTED, f"{backend.label} snapshots cannot be deleted from the console")
    snapshot = _find(snapshots.list(), "snapshot_id", snapshot_id)
    if snapshot is None or not snapshot_is_own(snapshot, config, recorded_snapshot_ids(config)):
        raise CatalogItemNotFound(f"No snapshot {snapshot_id} in this space.")
    users = snapshot_users(config, snapshot_id, snapshot.labels)
    if users and not force:
        raise CatalogItemInUse(
            f"Snapshot {snapshot_id} is still used by " + "; ".join(users) + ". Release it first.", users
        )
    snapshots.delete(snapshot_id)
    fallen_back = _fall_back_from(config, snapshot_id, actor=actor) if users else []
    record_audit(
        actor,
        AuditAction.SNAPSHOT_DELETE,
        space=config.space,
        target_type="snapshot",
        target_id=snapshot_id,
        target_name=snapshot_id,
        details={"config": str(config.id), "forced": bool(users), "was_used_by": users, "fell_back": fallen_back},
    )


def _fall_back_from(config: SandboxConfig, snapshot_id: str, *, actor: Actor) -> list[str]:
    """Skill images recorded on a deleted snapshot go back to their config's default template."""
    fingerprint = config_fingerprint(config)
    fell_back = []
    with transaction.atomic():
        for image in SessionImage.objects.filter(snapshot_id=snapshot_id, fingerprint=fingerprint).select_related(
            "space", "config"
        ):
            do_clear_session_image(image.space, image.config, actor=actor)
            fell_back.append(str(image.config_id))
        snapshot_force_deleted.send(sender=SandboxConfig, snapshot_id=snapshot_id, fingerprint=fingerprint)
    return fell_back


def do_delete_template(config: SandboxConfig, template_id: str, *, actor: Actor) -> None:
    """Delete one of the space's own templates; platform templates only by platform admins.

    Another tenant's template is not found (404); the backend refuses one sandboxes use."""
    backend = get_backend(config)
    templates = backend.templates()
    if templates is None:
        raise RemoteError(ErrorKind.UNSUPPORTED, f"{backend.label} templates cannot be deleted from the console")
    template = _find(templates.list(), "template_id", template_id)
    owner = template_owner(template, config) if template is not None else None
    if owner is None or is_snapshot_id(template_id):
        raise CatalogItemNotFound(f"No template {template_id} in this space.")
    if owner == PLATFORM and not is_platform_admin(actor.user):
        raise CatalogItemForbidden(f"{template_id} is a platform template: only platform admins can delete it.")
    templates.delete(template_id)
    with transaction.atomic():
        TemplateRecord.objects.filter(fingerprint=config_fingerprint(config), template_id=template_id).delete()
        record_audit(
            actor,
            AuditAction.TEMPLATE_DELETE,
            space=config.space,
            target_type="template",
            target_id=template_id,
            target_name=template_id,
            details={"config": str(config.id), "platform_template": owner == PLATFORM},
        )


def visible_template_ids(config: SandboxConfig) -> list[str] | None:
    """Template ids for pickers (never snapshots), or None when the backend cannot list them."""
    try:
        catalog = load_catalog(config)
    except RemoteError:
        return None
    if not catalog.templates_supported:
        return None
    return [t.template_id for t in catalog.templates]
