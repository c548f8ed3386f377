"""Deletes that tear down: a space, a config or a session goes through its backends first.

Deleting one is a job (`start_teardown`, handlers below) that deletes, in order and on every
backend account the target's configs use:

0. its warm pools: their member rows go first, so no refill adds a sandbox (a refill whose
   row went deletes what it made) and the pooled sandboxes are deleted by their labels in 2;
1. its sessions, each through `Runtime.delete` under the session's lifecycle lock (bound
   sandbox, leftovers carrying the session's metadata, persistent workspace, binding, row),
   and a skill-image snapshot the session ran from that nothing else uses any more;
2. every other sandbox carrying the target's labels (skill and template builds, leftovers
   of a crash), then every workspace volume carrying them;
3. its snapshots (skill images included) and templates, newest first (Docker images stack:
   a child goes before its parent);
4. the space's networks and their host state (`Backend.release_space`).

Each step reports what went and what could not go, in the job's log; the rows are deleted
only when nothing stayed. A partly failed teardown leaves the rows, a "could not delete X"
line for each leftover, and the delete page offers to try again. Whatever slips past (a
sandbox created while the teardown ran) carries labels whose owner is gone, and the
per-installation clean-up (`sessions.unmanaged`) deletes it after the grace.

`inventory` says on the confirm pages exactly what a teardown will delete, from the rows
(no backend call on a GET).

May import what the sessions room may (`catalog`, `models`, `backends`, `console`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from console.jobs import JobContext, JobFailed, job_handler, start_job
from console.models import AdminJob, AuditAction, JobStatus, Space
from console.services import SYSTEM, Actor, ServiceError, do_delete_space, record_audit

from ..backends.base import (
    META_CONFIG,
    META_INSTALLATION,
    META_SPACE,
    Backend,
    ErrorKind,
    ListQuery,
    RemoteError,
    SnapshotInfo,
    TemplateInfo,
    is_snapshot_id,
)
from ..catalog.bridge import config_fingerprint, get_backend, labelled_owner
from ..catalog.services import do_delete_config
from ..catalog.templates import recorded_snapshot_ids, snapshot_is_own, snapshot_retired
from ..models import PoolMember, SandboxConfig, Session, SessionImage, is_native_pool_of
from .lookup import TEARDOWN_KINDS
from .runtime import Runtime, SessionDeleted

logger = logging.getLogger(__name__)
NEVER_KEY = datetime.min.replace(tzinfo=UTC)

# While one of the first two runs, no new session starts on its object (`lookup`).
KIND_SPACE, KIND_CONFIG = "sandboxes.teardown_space", "sandboxes.teardown_config"
assert set(TEARDOWN_KINDS) == {KIND_SPACE, KIND_CONFIG}
KIND_SESSION = "sandboxes.teardown_session"


@dataclass
class Report:
    """What one teardown deleted (by kind of resource) and what it could not."""

    deleted: dict[str, list[str]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    log: Callable[[str], None] = logger.info

    def went(self, what: str, ident: str) -> None:
        self.deleted.setdefault(what, []).append(ident)
        self.log(f"Deleted {what} {ident}.")

    def stayed(self, what: str, ident: str, exc: Exception) -> None:
        reason = f"{exc.kind}: {exc.message}" if isinstance(exc, RemoteError) else str(exc)
        line = f"could not delete {what} {ident} ({reason})"
        self.failed.append(line)
        self.log(line[0].upper() + line[1:] + ".")

    def counts(self) -> dict[str, int]:
        return {what: len(ids) for what, ids in self.deleted.items()}

    def as_json(self) -> dict[str, Any]:
        return {"deleted": self.deleted, "counts": self.counts(), "failed": self.failed}


# --- What a teardown will delete (the confirm pages) -------------------------------------


@dataclass
class Inventory:
    sessions: int
    live_sandboxes: int
    workspaces: int
    skill_images: int
    configs: int = 0
    accounts: int = 0

    def lines(self, scope: str) -> list[str]:
        """The confirm page's words: exactly what goes, in the order it goes."""
        lines = [
            f"{self.sessions} session(s) and their sandboxes ({self.live_sandboxes} bound now, running or "
            f"paused), {self.workspaces} persistent /workspace volume(s), bindings and artifacts.",
            f"Every other sandbox and workspace volume the backends hold under this {scope}'s labels "
            "(skill and template builds, leftovers).",
            f"Its snapshots on the backends, the {self.skill_images} current skill image(s) and their older "
            "generations included"
            + (", and the templates built for it." if scope == "space" else " (the space's templates stay)."),
        ]
        if scope == "space":
            lines.append(
                "The networks its backends keep for it (on Docker: with their resolver, proxy and packet-filter rules)."
            )
            lines.append(
                f"Then its rows: {self.configs} sandbox config(s), its network policy, members, tokens and jobs. "
                "Its audit events stay, without the link to the space."
            )
        else:
            lines.append(f"Then the {scope}'s rows.")
        lines.append(
            "This runs as a job on "
            f"{self.accounts} backend account(s); anything that cannot be deleted is named in its log, "
            f"and the {scope} stays until it can (you can try again)."
        )
        return lines


def inventory(space: Space, config: SandboxConfig | None = None) -> Inventory:
    sessions: QuerySet[Session] = Session.objects.filter(space=space)
    images = SessionImage.objects.filter(space=space)
    configs = list(SandboxConfig.objects.filter(space=space).select_related("backend"))
    if config is not None:
        sessions, images, configs = sessions.filter(config=config), images.filter(config=config), [config]
    return Inventory(
        sessions=sessions.count(),
        live_sandboxes=sessions.exclude(sandbox_id="").count(),
        workspaces=sessions.filter(has_persistent_workspace=True).count(),
        skill_images=images.count(),
        configs=len(configs),
        accounts=len({config_fingerprint(c) for c in configs}),
    )


# --- Starting one -------------------------------------------------------------------------


def running_teardown(kind: str, target_id: str) -> AdminJob | None:
    return (
        AdminJob.objects.filter(kind=kind, params__target=target_id, status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
        .order_by("-created")
        .first()
    )


def last_failed_teardown(kind: str, target_id: str) -> AdminJob | None:
    job = AdminJob.objects.filter(kind=kind, params__target=target_id).order_by("-created").first()
    return job if job is not None and job.status == JobStatus.FAILED else None


def start_teardown(kind: str, space: Space, target_id: str, *, actor: Actor) -> AdminJob:
    """The teardown job of a space, config or session; one at a time per target."""
    with transaction.atomic():
        Space.objects.select_for_update().filter(pk=space.pk).values_list("pk", flat=True).first()
        if running_teardown(kind, target_id) is not None:
            raise ServiceError("Its deletion is already running; follow it on its job page.")
        return start_job(kind, actor=actor, space=space, params={"target": target_id})


# --- The steps ----------------------------------------------------------------------------


def _accounts(configs: Iterable[SandboxConfig]) -> list[tuple[SandboxConfig, Backend]]:
    """One (config, backend) per backend account: configs on one account share its sandboxes."""
    seen: dict[str, tuple[SandboxConfig, Backend]] = {}
    for config in configs:
        seen.setdefault(config_fingerprint(config), (config, get_backend(config)))
    return list(seen.values())


def delete_session(
    session: Session, *, actor: Actor, report: Report | None = None, release_snapshot: bool = True
) -> None:
    """`Runtime.delete`, then the skill-image snapshot the session ran from when nothing else
    uses it any more (an old generation no session runs from and no config points at). A
    space's or config's teardown leaves that to its image step (`release_snapshot=False`)."""
    template_id, config = session.template_id, session.config
    Runtime().delete(session, actor=actor)
    if release_snapshot:
        release_unused_snapshot(config, template_id, actor=actor, report=report)


def release_unused_snapshot(
    config: SandboxConfig, snapshot_id: str, *, actor: Actor, report: Report | None = None
) -> bool:
    """Delete one of the space's snapshots that no session and no skill-image pointer uses;
    the skills app retires the generations recorded on it. True when it went."""
    if not is_snapshot_id(snapshot_id):
        return False
    if (
        Session.objects.filter(template_id=snapshot_id).exists()
        or SessionImage.objects.filter(snapshot_id=snapshot_id).exists()
    ):
        return False
    snapshots = get_backend(config).snapshots()
    if snapshots is None:
        return False
    try:
        found = next((s for s in snapshots.list() if s.snapshot_id == snapshot_id), None)
        if found is None or not snapshot_is_own(found, config, recorded_snapshot_ids(config)):
            return False
        snapshots.delete(snapshot_id)
    except RemoteError as exc:
        if report is not None:
            report.stayed("snapshot", snapshot_id, exc)
        else:
            logger.warning("could not delete the unused snapshot %s: %s", snapshot_id, exc)
        return False
    snapshot_retired.send(sender=SandboxConfig, snapshot_id=snapshot_id, fingerprint=config_fingerprint(config))
    record_audit(
        actor,
        AuditAction.SNAPSHOT_DELETE,
        space=config.space,
        target_type="snapshot",
        target_id=snapshot_id,
        target_name=snapshot_id,
        details={"config": str(config.id), "reason": "its last session was deleted"},
    )
    if report is not None:
        report.went("snapshot", snapshot_id)
    return True


def _delete_sessions(
    sessions: Iterable[Session], *, actor: Actor, report: Report, release_snapshots: bool = False
) -> None:
    for session in sessions:
        try:
            delete_session(session, actor=actor, report=report, release_snapshot=release_snapshots)
        except SessionDeleted:
            continue  # deleted meanwhile
        except (RemoteError, ServiceError) as exc:
            report.stayed("session", session.key, exc)
            continue
        report.went("session", f"{session.key} (sandbox {session.sandbox_id or 'none'})")


def _delete_labelled(backend: Backend, labels: dict[str, str], report: Report) -> None:
    """Sandboxes, then workspace volumes, under `labels` on one account."""
    try:
        sandboxes = list(backend.iter_sandboxes(ListQuery(metadata=labels)))
    except RemoteError as exc:
        report.stayed("the sandboxes listed under", _label_words(labels), exc)
        sandboxes = []
    for info in sandboxes:
        try:
            backend.delete(info.sandbox_id)
        except RemoteError as exc:
            report.stayed("sandbox", info.sandbox_id, exc)
        else:
            report.went("sandbox", info.sandbox_id)
    volumes = backend.volumes()
    if volumes is None:
        return
    try:
        found = volumes.list(labels)
    except RemoteError as exc:
        report.stayed("the volumes listed under", _label_words(labels), exc)
        return
    for volume in found:
        try:
            volumes.delete(volume.name)
        except RemoteError as exc:
            report.stayed("volume", volume.name, exc)
        else:
            report.went("volume", volume.name)


def _label_words(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in labels.items())


def _owned_snapshots(config: SandboxConfig, backend: Backend, only_config: bool) -> list[SnapshotInfo]:
    snapshots = backend.snapshots()
    if snapshots is None:
        return []
    recorded = recorded_snapshot_ids(config)
    if only_config:
        recorded = set(SessionImage.objects.filter(config=config).values_list("snapshot_id", flat=True))
    found = [s for s in snapshots.list() if snapshot_is_own(s, config, recorded)]
    if only_config:
        found = [s for s in found if s.labels.get(META_CONFIG, str(config.id)) == str(config.id)]
    return sorted(found, key=lambda s: s.created_at or NEVER_KEY, reverse=True)


def _owned_templates(config: SandboxConfig, backend: Backend, only_config: bool) -> list[TemplateInfo]:
    templates = backend.templates()
    if templates is None:
        return []
    if only_config:
        return []  # the space's templates are its catalog: other configs may start from them
    return [
        t
        for t in templates.list()
        if not is_snapshot_id(t.template_id) and labelled_owner(t.labels, config.space) == "own"
    ]


def _delete_images(config: SandboxConfig, backend: Backend, report: Report, *, only_config: bool) -> None:
    """Snapshots newest first (a child before its parent), then the space's templates; a
    snapshot refused once is tried again after the others went."""
    try:
        snapshots = _owned_snapshots(config, backend, only_config)
        templates = _owned_templates(config, backend, only_config)
    except RemoteError as exc:
        report.stayed("the snapshots and templates of", config.name, exc)
        return
    capability = backend.snapshots()
    refused: list[tuple[SnapshotInfo, RemoteError]] = []
    for snapshot in snapshots:
        assert capability is not None
        try:
            capability.delete(snapshot.snapshot_id)
        except RemoteError as exc:
            refused.append((snapshot, exc))
        else:
            report.went("snapshot", snapshot.snapshot_id)
    for snapshot, first in refused:
        assert capability is not None
        try:
            capability.delete(snapshot.snapshot_id)
        except RemoteError as exc:
            report.stayed("snapshot", snapshot.snapshot_id, exc if exc.kind != ErrorKind.INTERNAL else first)
        else:
            report.went("snapshot", snapshot.snapshot_id)
    template_capability = backend.templates()
    for template in templates:
        assert template_capability is not None
        try:
            template_capability.delete(template.template_id)
        except RemoteError as exc:
            report.stayed("template", template.template_id, exc)
        else:
            report.went("template", template.template_id)


def _release_networks(space: Space, accounts: list[tuple[SandboxConfig, Backend]], report: Report) -> None:
    for _, backend in accounts:
        try:
            released = backend.release_space(str(space.pk))
        except RemoteError as exc:
            report.stayed("the networks of space", space.name, exc)
            continue
        for name in released:
            report.went("network", f"{name} (with its resolver, proxy and packet-filter rules)")
        if not released:
            # Docker removes a space's network with its last sandbox (above).
            report.log(f"No network of space {space.name} is left on {backend.label}.")


def _labels(space: Space, config: SandboxConfig | None = None) -> dict[str, str]:
    labels = {META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_SPACE: str(space.pk)}
    if config is not None:
        labels[META_CONFIG] = str(config.pk)
    return labels


# --- The teardowns ------------------------------------------------------------------------


def tear_down_space(space: Space, *, actor: Actor, report: Report) -> bool:
    """Everything of the space on its backends, then (when nothing stayed) its rows."""
    configs = list(SandboxConfig.objects.filter(space=space).select_related("backend", "space"))
    accounts = _accounts(configs)
    report.log(f"Tearing down space {space.name}: {len(configs)} config(s) on {len(accounts)} backend account(s).")
    _stop_pools(PoolMember.objects.filter(space=space), report)
    for config in configs:
        _drain_native_pools(config, get_backend(config), report)
    _delete_sessions(Session.objects.filter(space=space).select_related("config", "space"), actor=actor, report=report)
    for config, backend in accounts:
        _delete_labelled(backend, _labels(space), report)
        _delete_images(config, backend, report, only_config=False)
    _release_networks(space, accounts, report)
    return not report.failed


def tear_down_config(config: SandboxConfig, *, actor: Actor, report: Report) -> bool:
    backend = get_backend(config)
    report.log(f"Tearing down config {config.name} of space {config.space.name}.")
    _stop_pools(PoolMember.objects.filter(config=config), report)
    _drain_native_pools(config, backend, report)
    _delete_sessions(config.sessions.select_related("config", "space"), actor=actor, report=report)
    _delete_labelled(backend, _labels(config.space, config), report)
    _delete_images(config, backend, report, only_config=True)
    return not report.failed


def _stop_pools(members: QuerySet[PoolMember], report: Report) -> None:
    """Forget the warm pools' rows; their sandboxes and volumes carry the labels deleted next."""
    count, _ = members.filter(session__isnull=True).delete()
    if count:
        report.log(f"Stopped the warm pool: {count} pooled sandbox(es) to delete.")


def _drain_native_pools(config: SandboxConfig, backend: Backend, report: Report) -> None:
    """The pools a backend keeps itself for the config (`Backend.warm_pools()`), drained, so it
    makes no sandbox for them again; what they had ready carries the labels deleted next."""
    native = backend.warm_pools()
    if native is None:
        return
    try:
        names = [name for name in native.pools() if is_native_pool_of(name, config.pk)]
    except RemoteError as exc:
        report.stayed("the warm pools of", config.name, exc)
        return
    for name in names:
        try:
            native.drain(name)
        except RemoteError as exc:
            report.stayed("warm pool", name, exc)
        else:
            report.went("warm pool", name)


def _fail(report: Report, what: str) -> None:
    raise JobFailed(
        f"{what} was not deleted: " + "; ".join(report.failed[:10]) + (" …" if len(report.failed) > 10 else "")
    )


@job_handler(KIND_SPACE, label="Delete a space")
def teardown_space_job(ctx: JobContext) -> dict[str, Any]:
    space = Space.objects.filter(pk=ctx.params["target"]).first()
    if space is None:
        ctx.log("The space is already gone.")
        return {"deleted": {}, "failed": []}
    actor = _job_actor(ctx)
    report = Report(log=ctx.log)
    ctx.progress(5)
    if not tear_down_space(space, actor=actor, report=report):
        _fail(report, f"Space {space.name}")
    ctx.progress(90, f"Nothing of space {space.name} is left on its backends; deleting its rows.")
    # The job outlives the space: it leaves it first (its starter still follows it).
    AdminJob.objects.filter(pk=ctx.job.pk).update(space=None)
    do_delete_space(space, actor=actor, details={"torn_down": report.counts()})
    return report.as_json()


@job_handler(KIND_CONFIG, label="Delete a sandbox config")
def teardown_config_job(ctx: JobContext) -> dict[str, Any]:
    config = SandboxConfig.objects.filter(pk=ctx.params["target"]).select_related("space", "backend").first()
    if config is None:
        ctx.log("The config is already gone.")
        return {"deleted": {}, "failed": []}
    report = Report(log=ctx.log)
    ctx.progress(5)
    if not tear_down_config(config, actor=_job_actor(ctx), report=report):
        _fail(report, f"Config {config.name}")
    ctx.progress(90, f"Nothing of config {config.name} is left on its backend; deleting its row.")
    do_delete_config(config, actor=_job_actor(ctx), torn_down=report.counts())
    return report.as_json()


@job_handler(KIND_SESSION, label="Delete a session")
def teardown_session_job(ctx: JobContext) -> dict[str, Any]:
    session = Session.objects.filter(pk=ctx.params["target"]).select_related("config", "space").first()
    if session is None:
        ctx.log("The session is already gone.")
        return {"deleted": {}, "failed": []}
    report = Report(log=ctx.log)
    _delete_sessions([session], actor=_job_actor(ctx), report=report, release_snapshots=True)
    if report.failed:
        _fail(report, f"Session {session.key}")
    return report.as_json()


def _job_actor(ctx: JobContext) -> Actor:
    user = ctx.job.created_by
    return Actor(user=user, source_ip=None) if user is not None else SYSTEM


__all__ = [
    "KIND_CONFIG",
    "KIND_SESSION",
    "KIND_SPACE",
    "Inventory",
    "Report",
    "delete_session",
    "inventory",
    "last_failed_teardown",
    "release_unused_snapshot",
    "running_teardown",
    "start_teardown",
    "tear_down_config",
    "tear_down_space",
]
