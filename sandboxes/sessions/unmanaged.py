"""Unmanaged resources: what the backends hold under this installation's labels that no live
object owns, found per installation (never per config: a deleted space's configs are gone
too, and with them the reaper's old way in).

On every platform backend's own account, list the sandboxes, workspace volumes, snapshots
and templates carrying this installation's id, and judge each by its labels against the
rows: its space gone, its config gone, or (sandboxes and volumes) its session gone. A
sandbox serving a job (`META_PURPOSE`: a skill or template build) counts as the config's
while its config lives. Items without a space label (platform templates, a build of no
space) are never listed, so never touched; another installation's labels never match.

`find_unmanaged` lists them for the platform page, each backend's listing bounded by
`sessions.unmanaged_list_timeout_s`; `reap_unmanaged` (the reaper job, `sessions.reaper_unmanaged`) deletes
those older than the grace; `do_delete_unmanaged` deletes one from the page after judging it
again (audited). Sandboxes go before volumes and snapshots before their parents (newest
first), so the engine's "in use" refusals settle within a pass or two.

A space's own API key is an account of its own (E2B, Cube): it is reachable only while its
config exists, which is why deleting a space tears down first (`sessions.teardown`).

May import what the sessions room may (`catalog`, `models`, `backends`, `console`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.models import FINISHED_JOB_STATUSES, AdminJob, AuditAction, Space
from console.services import Actor, ServiceError, record_audit

from ..backends.base import (
    META_CONFIG,
    META_INSTALLATION,
    META_JOB,
    META_PURPOSE,
    META_SESSION,
    META_SPACE,
    Backend,
    ListQuery,
    RemoteError,
    SandboxState,
    is_snapshot_id,
)
from ..catalog.bridge import get_backend
from ..models import PlatformBackend, SandboxConfig, Session
from .tuning import SESSIONS

logger = logging.getLogger(__name__)

SANDBOX, VOLUME, SNAPSHOT, TEMPLATE = "sandbox", "volume", "snapshot", "template"
# Deleted in this order: a volume is refused while a sandbox mounts it, an image while a
# sandbox runs from it.
ORDER = (SANDBOX, VOLUME, SNAPSHOT, TEMPLATE)
# Longest a job may keep a sandbox of its own (skill builds, verification) before it counts.
JOB_GRACE = timedelta(hours=1)
NEVER = datetime.min.replace(tzinfo=UTC)


def serves_a_running_job(metadata: Mapping[str, str]) -> bool:
    """Whether a sandbox is a job's own (`META_PURPOSE`: a skill or template build) whose job
    may still be working: its `META_JOB` names a job not yet finished, or it names none (an
    older console's). Such a sandbox may outlive the session grace up to `JOB_GRACE`; one
    whose job ended (failed, say, by a restart) gets the session grace."""
    if not metadata.get(META_PURPOSE):
        return False
    job_id = metadata.get(META_JOB, "")
    if not job_id:
        return True
    try:
        uuid.UUID(job_id)
    except ValueError:
        return False
    return AdminJob.objects.filter(pk=job_id).exclude(status__in=FINISHED_JOB_STATUSES).exists()


@dataclass(frozen=True)
class Unmanaged:
    backend_id: str
    backend_name: str
    kind: str  # SANDBOX, VOLUME, SNAPSHOT or TEMPLATE
    ident: str
    reason: str
    space: str
    config: str = ""
    session: str = ""
    created_at: datetime | None = None
    for_job: bool = False

    def older_than(self, grace: timedelta, now: datetime) -> bool:
        allowed = max(grace, JOB_GRACE) if self.for_job else grace
        return self.created_at is not None and now - self.created_at >= allowed


@dataclass
class Listing:
    items: list[Unmanaged] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "backend X: what went wrong"
    backends: int = 0


@dataclass
class _Owners:
    """The rows labels are judged against, read once per listing."""

    spaces: set[str]
    configs: set[str]
    sessions: set[tuple[str, str]]

    @classmethod
    def read(cls, spaces: set[str]) -> _Owners:
        return cls(
            spaces={str(pk) for pk in Space.objects.filter(pk__in=valid_uuids(spaces)).values_list("pk", flat=True)},
            configs={str(pk) for pk in SandboxConfig.objects.values_list("pk", flat=True)},
            sessions={
                (str(space), key)
                for space, key in Session.objects.filter(space_id__in=valid_uuids(spaces)).values_list(
                    "space_id", "key"
                )
            },
        )

    def reason(self, metadata: Mapping[str, str], *, kind: str) -> str | None:
        """Why nothing owns it, or None when something does (or the labels name no space).
        A template belongs to its space's catalog (any config of it may start from it)."""
        space, config, session = metadata.get(META_SPACE), metadata.get(META_CONFIG), metadata.get(META_SESSION)
        by_session = kind in (SANDBOX, VOLUME)
        if not space:
            return None
        if space not in self.spaces:
            return "its space is gone"
        if kind != TEMPLATE and config and config not in self.configs:
            return "its config is gone"
        if by_session and session and (space, session) not in self.sessions:
            return "its session is gone"
        return None


def valid_uuids(values: Iterable[str]) -> list[str]:
    """The values that are UUIDs (forged or foreign ids are none), as text."""
    import uuid

    found = []
    for value in values:
        try:
            found.append(str(uuid.UUID(value)))
        except ValueError:
            continue
    return found


@dataclass(frozen=True)
class _Labelled:
    kind: str
    ident: str
    metadata: Mapping[str, str]
    created_at: datetime | None


def _labelled(backend: Backend) -> Iterator[_Labelled]:
    """Everything on one account carrying this installation's labels."""
    mine = {META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}
    for info in backend.iter_sandboxes(ListQuery(metadata=mine)):
        if info.state != SandboxState.GONE:
            yield _Labelled(SANDBOX, info.sandbox_id, info.metadata, info.started_at)
    volumes = backend.volumes()
    if volumes is not None:
        for volume in volumes.list(mine):
            yield _Labelled(VOLUME, volume.name, volume.metadata, volume.created_at)
    snapshots = backend.snapshots()
    if snapshots is not None:
        for snapshot in snapshots.list():
            if snapshot.labels.get(META_INSTALLATION) == settings.CONSOLE_INSTALLATION_ID:
                yield _Labelled(SNAPSHOT, snapshot.snapshot_id, snapshot.labels, snapshot.created_at)
    templates = backend.templates()
    if templates is not None:
        for template in templates.list():
            if template.labels.get(META_INSTALLATION) == settings.CONSOLE_INSTALLATION_ID and not is_snapshot_id(
                template.template_id
            ):
                yield _Labelled(TEMPLATE, template.template_id, template.labels, template.created_at)


def _list_one(platform: PlatformBackend) -> list[_Labelled]:
    return list(_labelled(get_backend(platform)))


def find_unmanaged(*, timeout_s: float | None = None) -> Listing:
    """What no live object owns, on every platform backend; each listing within the deadline
    (a backend that does not answer in time is named in `errors`, the others still listed)."""
    timeout = SESSIONS.unmanaged_list_timeout_s if timeout_s is None else timeout_s
    platforms = list(PlatformBackend.objects.order_by("name"))
    listing = Listing(backends=len(platforms))
    if not platforms:
        return listing
    pool = ThreadPoolExecutor(max_workers=min(8, len(platforms)), thread_name_prefix="unmanaged")
    try:
        futures = {platform.pk: pool.submit(_list_one, platform) for platform in platforms}
        deadline = timezone.now() + timedelta(seconds=timeout)
        found: dict[str, list[_Labelled]] = {}
        for platform in platforms:
            left = max(0.0, (deadline - timezone.now()).total_seconds())
            try:
                found[str(platform.pk)] = futures[platform.pk].result(timeout=left)
            except FutureTimeout:
                listing.errors.append(f"{platform.name}: did not answer within {timeout:g} s")
            except RemoteError as exc:
                listing.errors.append(f"{platform.name}: {exc.kind}: {exc.message}")
            except Exception as exc:  # one broken backend never hides the others' listings
                logger.warning("listing unmanaged resources on %s failed", platform.name, exc_info=True)
                listing.errors.append(f"{platform.name}: {exc.__class__.__name__}")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    owners = _Owners.read({str(item.metadata.get(META_SPACE, "")) for items in found.values() for item in items})
    by_id = {str(p.pk): p for p in platforms}
    for backend_id, items in found.items():
        for item in items:
            reason = owners.reason(item.metadata, kind=item.kind)
            if reason is None:
                continue
            listing.items.append(
                Unmanaged(
                    backend_id=backend_id,
                    backend_name=by_id[backend_id].name,
                    kind=item.kind,
                    ident=item.ident,
                    reason=reason,
                    space=item.metadata.get(META_SPACE, ""),
                    config=item.metadata.get(META_CONFIG, ""),
                    session=item.metadata.get(META_SESSION, ""),
                    created_at=item.created_at,
                    for_job=serves_a_running_job(item.metadata),
                )
            )
    listing.items.sort(key=lambda u: (u.backend_name, ORDER.index(u.kind), -(u.created_at or NEVER).timestamp()))
    return listing


def _delete(backend: Backend, kind: str, ident: str) -> None:
    if kind == SANDBOX:
        backend.delete(ident)
        return
    capability = {VOLUME: backend.volumes, SNAPSHOT: backend.snapshots, TEMPLATE: backend.templates}[kind]()
    if capability is None:
        raise ServiceError(f"{backend.label} cannot delete a {kind}.")
    capability.delete(ident)


@dataclass
class ReapResult:
    deleted: list[str] = field(default_factory=list)
    young: int = 0
    errors: list[str] = field(default_factory=list)


def reap_unmanaged(*, grace: timedelta | None = None) -> ReapResult:
    """Delete what no live object owns once older than the grace (the reaper job's part)."""
    grace = grace if grace is not None else timedelta(seconds=SESSIONS.reaper_grace_s)
    result = ReapResult()
    listing = find_unmanaged()
    result.errors.extend(listing.errors)
    now = timezone.now()
    for item in listing.items:
        if not item.older_than(grace, now):
            result.young += 1
            continue
        backend = get_backend(PlatformBackend.objects.get(pk=item.backend_id))
        try:
            _delete(backend, item.kind, item.ident)
        except (RemoteError, ServiceError) as exc:
            result.errors.append(f"{item.kind} {item.ident}: {exc}")
            continue
        result.deleted.append(f"{item.kind} {item.ident}")
        logger.info(
            "reaper deleted unmanaged %s %s (%s)",
            item.kind,
            item.ident,
            item.reason,
            extra={"action": "delete_unmanaged", "kind": item.kind, "ident": item.ident, "space_id": item.space},
        )
    return result


def do_delete_unmanaged(backend_id: str, kind: str, ident: str, *, actor: Actor) -> Unmanaged:
    """Delete one unmanaged resource from the platform page, after judging it again: a form
    names it, the listing decides (never a live object's)."""
    platform = PlatformBackend.objects.filter(pk__in=valid_uuids({backend_id})).first()  # a forged id is none
    if platform is None or kind not in ORDER:
        raise ServiceError("No such unmanaged resource.")
    try:
        found = _list_one(platform)
    except RemoteError as exc:
        raise ServiceError(f"{platform.name} could not be listed: {exc.kind}: {exc.message}") from exc
    item = next((i for i in found if i.kind == kind and i.ident == ident), None)
    owners = _Owners.read({str(item.metadata.get(META_SPACE, ""))} if item else set())
    reason = owners.reason(item.metadata, kind=kind) if item else None
    if item is None or reason is None:
        raise ServiceError(f"{kind} {ident} is not an unmanaged resource of {platform.name} (gone, or owned).")
    _delete(get_backend(platform), kind, ident)
    with transaction.atomic():
        record_audit(
            actor,
            AuditAction.UNMANAGED_DELETE,
            target_type=kind,
            target_id=ident,
            target_name=ident,
            details={"backend": platform.name, "reason": reason, "space": item.metadata.get(META_SPACE, "")},
        )
    return Unmanaged(
        backend_id=str(platform.pk),
        backend_name=platform.name,
        kind=kind,
        ident=ident,
        reason=reason,
        space=item.metadata.get(META_SPACE, ""),
        created_at=item.created_at,
    )
