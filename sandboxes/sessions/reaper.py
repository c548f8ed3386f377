"""The reaper and the idle sweep: periodic housekeeping of session sandboxes.

Reaper: per installation, what no live object owns any more (`unmanaged`: a deleted space's
or config's sandboxes, volumes and images); then on every config, list the sandboxes this
installation created (paged, with the repeated-page-token guard), read their bindings in one
batch and their sessions in one query, and then, per session and under that session's
lifecycle lock (re-reading both):

- a session that still exists keeps a sandbox: if no binding owns one (a store that came
  back empty, a process killed between create and bind, a binding pointing at a sandbox that
  is gone), the oldest is claimed — bound to the session with its own start time — never
  deleted; duplicates of a bound session are deleted once older than the grace;
- only sandboxes whose session is gone (or that sit on a config the session no longer uses)
  are deleted, once older than the grace period, paused ones included;
- a warm pool's sandbox (`META_POOL`) is judged by its member row: ready, being made, or
  claimed by a session that is bound to it or not bound at all (a crash between claim and
  bind: that session's next resolve takes it back) is never deleted; one without a row, or
  claimed by a session gone or bound elsewhere, goes after the grace (its volume too, unless
  a session took it).

Ages come from the backend's own timestamps, never from this process's memory. A sandbox
without this installation's metadata is never listed, so never touched. When the binding
store does not answer, nothing is decided. One pass runs at a time across all processes (a
store-level lock); a session whose lock is held (a resolve at work) is left for the next pass.

Idle sweep: sessions idle past their config's timeout and not kept awake (`keep_awake_until`,
set on the session page) — and with no background command
running, no exec in flight, no open terminal and no turn in flight — are idled (paused or
stopped, per the config) under their lifecycle lock, or, on a backend that idles its
sandboxes itself (E2B, Cube: TTL with auto-pause), left to it and their state read back; the
next resolve brings them back with /workspace intact.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from console import metrics
from console.jobs import JobContext, JobFailed, job_handler, prune_housekeeping_jobs
from console.periodic import periodic
from console.services import SYSTEM

from ..backends.base import (
    META_BINDING_VERSION,
    META_CONFIG,
    META_INSTALLATION,
    META_POOL,
    META_SESSION,
    META_SPACE,
    Backend,
    ListQuery,
    RemoteError,
    SandboxInfo,
    SandboxState,
)
from ..catalog.bridge import get_backend
from ..models import MemberState, PoolMember, SandboxConfig, Session, SessionState
from .inflight import quiet_sessions
from .runtime import Runtime, sandbox_or_none
from .store import (
    Binding,
    HeldLock,
    LockTimeout,
    SessionStore,
    SessionStoreUnavailable,
    binding_key,
    lifecycle_lock,
    lock_key,
    turn_key,
)
from .store_select import get_store
from .tuning import SESSIONS
from .unmanaged import JOB_GRACE, reap_unmanaged, serves_a_running_job, valid_uuids

logger = logging.getLogger(__name__)
# Longest a job may keep a sandbox of its own (skill builds, verification) before it counts
# as a leftover.
# The store-level lock that keeps reaper passes from overlapping across processes.
REAPER_LOCK = "console:lock:reaper-pass"
HOLDER = "reaper"
# Sessions per batched query.
BATCH = 500


class ReaperBusy(LockTimeout):
    """Another process is running a reaper pass; this one does nothing."""


@dataclass
class ReapReport:
    config: str
    listed: int = 0
    bound: int = 0
    too_young: int = 0
    busy: int = 0
    claimed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "listed": self.listed,
            "bound": self.bound,
            "too_young": self.too_young,
            "busy": self.busy,
            "claimed": self.claimed,
            "deleted": self.deleted,
            "repaired": self.repaired,
            "errors": self.errors,
        }


def is_owned(store: SessionStore, metadata: dict[str, str] | Any, sandbox_id: str) -> bool:
    space, key = metadata.get(META_SPACE), metadata.get(META_SESSION)
    if not space or not key:
        return False  # e.g. a connection test's leftover
    binding = store.get_binding(binding_key(space, key))
    return binding is not None and binding.sandbox_id == sandbox_id


def _sessions_on(groups: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """(space id, session key) -> the session's config id, for the sessions that exist."""
    found: dict[tuple[str, str], str] = {}
    for start in range(0, len(groups), BATCH):
        chunk = groups[start : start + BATCH]
        wanted = set(chunk)
        rows = Session.objects.filter(
            space_id__in={space for space, _ in chunk}, key__in={key for _, key in chunk}
        ).values_list("space_id", "key", "config_id")
        for space_id, key, config_id in rows:
            if (str(space_id), key) in wanted:
                found[(str(space_id), key)] = str(config_id)
    return found


@dataclass
class _Pass:
    """One config's pass: what it needs to decide, and where it reports."""

    config: SandboxConfig
    backend: Backend
    store: SessionStore
    grace: timedelta
    now: datetime
    report: ReapReport

    def old_enough(self, info: SandboxInfo, allowed: timedelta | None = None) -> bool:
        if info.started_at is None or self.now - info.started_at < (allowed or self.grace):
            self.report.too_young += 1
            return False
        return True

    def delete(self, info: SandboxInfo, held: HeldLock | None = None) -> None:
        if held is not None:
            held.check()  # never act on a lease that ran out
        self.backend.delete(info.sandbox_id)
        self.report.deleted.append(info.sandbox_id)
        metrics.REAPER_DELETIONS.labels(backend_kind=self.backend.kind).inc()
        logger.info(
            "reaper deleted sandbox %s",
            info.sandbox_id,
            extra={
                "action": "delete",
                "sandbox_id": info.sandbox_id,
                "config_id": str(self.config.id),
                "session_key": info.metadata.get(META_SESSION, ""),
            },
        )

    def alive(self, sandbox_id: str) -> bool:
        info = sandbox_or_none(self.backend, sandbox_id)
        return info is not None and info.state != SandboxState.GONE

    def settle(self, space: str, key: str, infos: list[SandboxInfo]) -> None:
        """Decide one session's listed sandboxes, holding its lifecycle lock."""
        bkey = binding_key(space, key)
        with lifecycle_lock(self.store, lock_key(space, key), wait_s=0, holder=HOLDER) as held:
            # Re-read under the lock: a resolve may have bound, or a delete removed, meanwhile.
            binding = self.store.get_binding(bkey)
            session_here = _sessions_on([(space, key)]).get((space, key)) == str(self.config.id)
            owner = next((i for i in infos if binding is not None and i.sandbox_id == binding.sandbox_id), None)
            owner_id: str | None = None
            if owner is not None:
                owner_id = owner.sandbox_id  # a bound sandbox is never deleted here
                self.report.bound += 1
            elif session_here and binding is not None and self.alive(binding.sandbox_id):
                owner_id = binding.sandbox_id  # bound to a sandbox the listing did not show
            elif session_here:
                owner_id = self.claim(held, space, key, bkey, binding, infos)
                if owner_id is None:
                    return
            # What is left: duplicates of a bound session, or sandboxes whose session is gone
            # (or runs on another config now).
            for info in infos:
                if info.sandbox_id != owner_id and self.old_enough(info):
                    self.delete(info, held)

    def claim(
        self, held: HeldLock, space: str, key: str, bkey: str, stale: Binding | None, infos: list[SandboxInfo]
    ) -> str | None:
        """Bind the session's oldest sandbox to it (its own start time kept)."""
        # Listings may round creation times (Docker: to the second); ask each for its own
        # (claims are rare: a store that came back empty, a create cut before its bind).
        precise = [sandbox_or_none(self.backend, i.sandbox_id) for i in infos]
        candidates = [i for i in precise if i is not None and i.state != SandboxState.GONE]
        if not candidates:
            return None
        candidates.sort(key=lambda s: (s.started_at is None, s.started_at or self.now))
        winner = candidates[0]
        version = int(winner.metadata.get(META_BINDING_VERSION, "0") or 0)
        started = winner.started_at or self.now
        bound = Binding(winner.sandbox_id, version, str(self.config.id), started.isoformat())
        held.check()
        if stale is not None:
            self.store.delete_binding_if(bkey, stale)  # it pointed at a sandbox that is gone
        if not self.store.set_binding_if_absent(bkey, bound):
            return None  # bound meanwhile by someone else; the next pass looks again
        state = {SandboxState.PAUSED: SessionState.PAUSED, SandboxState.STOPPED: SessionState.STOPPED}.get(
            winner.state, SessionState.RUNNING
        )
        Session.objects.filter(space_id=space, key=key).update(
            sandbox_id=winner.sandbox_id, bound_at=started, binding_version=version, state=state
        )
        self.report.claimed.append(winner.sandbox_id)
        metrics.REAPER_CLAIMS.labels(backend_kind=self.backend.kind).inc()
        logger.info(
            "reaper bound sandbox %s to session %s",
            winner.sandbox_id,
            key,
            extra={"action": "claim", "sandbox_id": winner.sandbox_id, "space_id": space, "session_key": key},
        )
        return winner.sandbox_id


def _pool_member_keeps(store: SessionStore, member: PoolMember, sandbox_id: str) -> bool:
    """Whether a pooled sandbox's member row still owns it (module docstring)."""
    if member.sandbox_id not in ("", sandbox_id):
        return False
    if member.state != MemberState.CLAIMED:
        return True
    if member.session is None:
        return False
    binding = store.get_binding(binding_key(str(member.space_id), member.session.key))
    return binding is None or binding.sandbox_id == sandbox_id


def _settle_pooled(run: _Pass, infos: list[SandboxInfo]) -> None:
    """Warm pool sandboxes (`META_POOL`) of the config, by their member rows."""
    ids = [info.metadata[META_POOL] for info in infos]
    members = {str(m.pk): m for m in PoolMember.objects.filter(pk__in=valid_uuids(ids)).select_related("session")}
    volumes = run.backend.volumes()
    for info in infos:
        member = members.get(info.metadata[META_POOL])
        if member is not None and _pool_member_keeps(run.store, member, info.sandbox_id):
            run.report.bound += 1
            continue
        if not run.old_enough(info):
            continue
        run.delete(info)
        taken = member is not None and member.session_id is not None
        if member is not None:
            PoolMember.objects.filter(pk=member.pk).delete()
        if volumes is not None and not taken and member is not None and member.workspace_volume:
            try:
                volumes.delete(member.workspace_volume)
            except RemoteError as exc:
                run.report.errors.append(f"volume {member.workspace_volume}: {exc.message}")


def _repair_group(run: _Pass, space: str, key: str, infos: list[SandboxInfo]) -> None:
    """Mend a session's sandboxes the engine and the runtime disagree on (a pause wedged by
    docker/for-linux#891): under the session's lock, so never a pause in progress."""
    live = [i for i in infos if i.state in (SandboxState.RUNNING, SandboxState.PAUSED)]
    if not live:
        return
    try:
        with lifecycle_lock(run.store, lock_key(space, key), wait_s=0, holder=HOLDER):
            for info in live:
                done = run.backend.repair(info.sandbox_id)
                if done:
                    run.report.repaired.append(f"{info.sandbox_id}: {done}")
                    logger.warning(
                        "reaper repaired sandbox %s: %s",
                        info.sandbox_id,
                        done,
                        extra={"action": "repair", "sandbox_id": info.sandbox_id, "session_key": key},
                    )
    except LockTimeout:
        return  # a resolve, pause or delete is at work on it; the next pass looks again
    except (RemoteError, OSError) as exc:
        run.report.errors.append(f"repair of session {key}: {exc}")


def reap_config(config: SandboxConfig, store: SessionStore, *, grace: timedelta) -> ReapReport:
    report = ReapReport(config=f"{config.space.name} / {config.name}")
    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_CONFIG: str(config.id)})
    backend = get_backend(config)
    run = _Pass(config, backend, store, grace, timezone.now(), report)
    groups: dict[tuple[str, str], list[SandboxInfo]] = defaultdict(list)
    unowned: list[SandboxInfo] = []
    pooled: list[SandboxInfo] = []
    try:
        for info in backend.iter_sandboxes(query):
            report.listed += 1
            if info.state == SandboxState.GONE:
                continue
            space, key = info.metadata.get(META_SPACE), info.metadata.get(META_SESSION)
            if space and key:
                if all(seen.sandbox_id != info.sandbox_id for seen in groups[(space, key)]):
                    groups[(space, key)].append(info)  # a repeated page lists it twice
            elif info.metadata.get(META_POOL):
                pooled.append(info)
            else:
                unowned.append(info)  # a job's sandbox, or a connection test's leftover
    except RemoteError as exc:
        # Decide on what was listed; the rest waits for the next pass.
        report.errors.append(f"{exc.kind}: {exc.message}")
    try:
        for info in unowned:
            # A job's sandbox (a skill build, say) may legitimately outlive the session grace
            # while its job runs; once the job ended (a restart failed it), it may not.
            allowed = max(grace, JOB_GRACE) if serves_a_running_job(info.metadata) else grace
            if run.old_enough(info, allowed):
                run.delete(info)
        _settle_pooled(run, pooled)
        bindings = store.get_bindings(binding_key(space, key) for space, key in groups)
    except RemoteError as exc:
        report.errors.append(f"{exc.kind}: {exc.message}")
        return report
    for (space, key), infos in groups.items():
        _repair_group(run, space, key, infos)
        binding = bindings.get(binding_key(space, key))
        owns = binding is not None and any(i.sandbox_id == binding.sandbox_id for i in infos)
        if owns and len(infos) == 1:
            report.bound += 1  # the common case: settled without a lock
            continue
        try:
            run.settle(space, key, infos)
        except LockTimeout:
            report.busy += 1  # a resolve (or delete) is at work on it; the next pass looks again
        except SessionStoreUnavailable as exc:
            report.errors.append(f"{exc.kind}: {exc.message}")
            return report
        except RemoteError as exc:
            report.errors.append(f"{exc.kind}: {exc.message}")
    return report


def reap_all(store: SessionStore | None = None, *, grace: timedelta | None = None) -> list[ReapReport]:
    """One pass over every config; raises `ReaperBusy` when another process runs one."""
    store = store or get_store()
    grace = grace if grace is not None else timedelta(seconds=SESSIONS.reaper_grace_s)
    configs = list(SandboxConfig.objects.select_related("space").order_by("created"))
    try:
        with lifecycle_lock(store, REAPER_LOCK, wait_s=0, holder=HOLDER):
            reports = [reap_config(config, store, grace=grace) for config in configs]
            store.purge_expired()
            return reports
    except ReaperBusy:
        raise
    except LockTimeout as exc:
        raise ReaperBusy(exc.message) from None
    except SessionStoreUnavailable as exc:
        # Nothing is decided without the store; every config says why.
        message = f"{exc.kind}: {exc.message}"
        return [ReapReport(config=f"{c.space.name} / {c.name}", errors=[message]) for c in configs]


@job_handler("sandboxes.reap", label="Reaper pass", housekeeping=True)
def reap_job(ctx: JobContext) -> dict[str, Any]:
    prune_housekeeping_jobs("sandboxes.reap")
    try:
        reports = reap_all()
    except ReaperBusy as exc:
        ctx.log(f"Skipped: another reaper pass is running ({exc.message}).")
        return {"skipped": True, "configs": [], "deleted": 0, "claimed": 0}
    for report in reports:
        ctx.log(
            f"{report.config}: listed {report.listed}, bound {report.bound}, claimed {len(report.claimed)}, "
            f"young {report.too_young}, busy {report.busy}, deleted {len(report.deleted)}"
            + (f", errors: {'; '.join(report.errors)}" if report.errors else "")
        )
    result = {
        "configs": [r.as_json() for r in reports],
        "deleted": sum(len(r.deleted) for r in reports),
        "claimed": sum(len(r.claimed) for r in reports),
    }
    errors = [e for r in reports for e in r.errors]
    if SESSIONS.reaper_unmanaged:
        # Per installation: what carries this installation's labels and no live object owns
        # (a deleted space's or config's leftovers), which no config's pass lists any more.
        unmanaged = reap_unmanaged()
        ctx.log(
            f"Unmanaged: deleted {len(unmanaged.deleted)}, young {unmanaged.young}"
            + (f", errors: {'; '.join(unmanaged.errors)}" if unmanaged.errors else "")
        )
        result["unmanaged_deleted"] = unmanaged.deleted
        errors += unmanaged.errors
    if errors:
        raise JobFailed("; ".join(errors[:5]))
    return result


def _idle_candidates(now: datetime) -> Any:
    """Running sessions with nothing in flight in them (sessions/inflight.py)."""
    return (
        quiet_sessions(now)
        .filter(state=SessionState.RUNNING, last_activity__isnull=False)
        .filter(Q(keep_awake_until__isnull=True) | Q(keep_awake_until__lte=now))
        .select_related("config", "space")
    )


def _turn_in_flight(store: SessionStore, session: Session) -> bool:
    try:
        return store.turn_lease(turn_key(session.space_id, session.key)).in_flight
    except SessionStoreUnavailable:
        return True  # cannot read the lease: assume a turn is in flight


def idle_sweep(runtime: Runtime | None = None) -> int:
    """Idle the quiet running sessions whose config's timeout has passed; returns how many."""
    runtime = runtime or Runtime()
    now = timezone.now()
    idled = 0
    for session in _idle_candidates(now):
        if now - session.last_activity < timedelta(seconds=session.config.idle_timeout_s):
            continue
        if _turn_in_flight(runtime.store, session):
            continue
        try:
            backend = get_backend(session.config)
            if backend.idles_itself():
                # Left to the backend's own auto-pause: only read the state back for the pages.
                state = backend.get(session.sandbox_id).state
                if state in (SandboxState.PAUSED, SandboxState.STOPPED):
                    Session.objects.filter(pk=session.pk).update(state=str(state))
                    idled += 1
                continue
            # The one guarded pause: it re-checks under the session's lock that nothing is in
            # flight and the activity did not move, and holds the row while the engine pauses.
            runtime.pause(session, actor=SYSTEM, idle_since=session.last_activity, lock_wait_s=0)
            idled += 1
        except Exception as exc:
            # One session's failure (or busy lock) must not stop the sweep.
            logger.info(
                "idle sweep left session %s: %s",
                session.key,
                exc.__class__.__name__,
                extra={"action": "idle_skipped", "session_key": session.key, "space_id": str(session.space_id)},
            )
            continue
        logger.info(
            "idle sweep idled session %s",
            session.key,
            extra={"action": "idle", "session_key": session.key, "sandbox_id": session.sandbox_id},
        )
    return idled


@job_handler("sandboxes.idle_sweep", label="Idle sweep", housekeeping=True)
def idle_sweep_job(ctx: JobContext) -> dict[str, Any]:
    prune_housekeeping_jobs("sandboxes.idle_sweep")
    idled = idle_sweep()
    if idled:
        ctx.log(f"Idled {idled} session(s).")
    return {"idled": idled}


@periodic("reaper", task="sandboxes.reaper_pass", every=lambda: SESSIONS.reaper_interval_s)
def start_reaper_pass() -> None:
    """The periodic entry point: one audited job per pass."""
    from console.jobs import start_job

    start_job("sandboxes.reap", actor=SYSTEM)


@periodic("idle-sweep", task="sandboxes.idle_sweep", every=lambda: SESSIONS.idle_sweep_interval_s)
def start_idle_sweep() -> None:
    """The periodic entry point of the idle sweep: one job per sweep."""
    from console.jobs import start_job

    start_job("sandboxes.idle_sweep", actor=SYSTEM)
