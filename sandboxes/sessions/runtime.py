"""The session runtime: the one place that turns a session key into a live sandbox.

The API, the UI, tasks and the terminal all call `resolve()` and the functions below; none
of them talks to a backend about sessions directly.

resolve(space, key):
  fast path   binding hit -> connect (resumes a paused or stopped sandbox) -> return
  slow path   (miss, bound sandbox gone, or a stale sandbox that may be rebuilt now)
              take the session's lifecycle lock -> re-read the binding -> claim an existing
              sandbox by metadata (oldest wins, duplicates deleted) -> only then create one
              from the effective template with the space's network switches sent
              explicitly, or take a ready one from the config's warm pool
              (`provisioning.from_warm_pool`) -> write the binding (SET NX)

Stale and the turn lease: a stale sandbox (bound before the session's stale time) is
rebuilt at once when no turn is in flight; within a turn only the first resolve may rebuild
(it consumes the turn's one-shot ticket); when the lease cannot be read, a turn is assumed
in flight and nothing is torn down. A rebuild waits (sessions.rebuild_wait_s) for the
session's other execs, commands and open terminals to end, else is deferred to the next turn;
an exec whose sandbox went under it anyway (a forced Rebuild, a delete) answers
`sandbox_replaced` (or 404), never the exit code of a killed process.

Warm exec: a session whose row says running, bound to the sandbox the row names, not stale
and with no turn's first resolve due, runs its command with no connect (`_known_running`),
on a backend whose exec refuses an idle or gone sandbox (`exec_refuses_when_idle`); on that
refusal (`NotStarted`: nothing ran) the exec resolves the session and runs it there.

Pause: one guarded path for the UI, the API and the idle sweep (`pause`): under the session's
lifecycle lock, only with nothing in flight (sessions/inflight.py), holding the session's row
while the engine freezes the sandbox, with the engine call bounded (sessions.engine_timeout_s).
A call that fails because the engine and the runtime disagree on the sandbox's state is
repaired (`Backend.repair`) and answered in words; so is any call racing a pause or a delete.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.utils import timezone

from console.crypto import decrypt, encrypt
from console.models import AuditAction, Space
from console.services import SYSTEM, Actor, ServiceError, record_audit

from ..backends.base import (
    META_BINDING_VERSION,
    META_CONFIG,
    META_INSTALLATION,
    META_SESSION,
    META_SPACE,
    Backend,
    ErrorKind,
    ExecRequest,
    ExecResult,
    ListQuery,
    NotStarted,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
)
from ..catalog.bridge import get_backend, sandbox_resources
from ..catalog.conflicts import Conflict
from ..catalog.network import network_spec_for, refuse_unless_honoured, spec_fingerprint
from ..models import ExecSlot, SandboxConfig, Session, SessionState
from .ahead import Ahead, looking_ahead, remember
from .inflight import Count, busy_reason, in_flight, quiet_sessions
from .limits import release_exec_slot, take_exec_slot
from .lookup import SessionRow, check_session_key, create_session
from .observe import observe_resolve, resolving_since, took_slow_path
from .provisioning import WORKSPACE_LAYOUT, effective_template, from_warm_pool, prepare_workspace, ready_workspace
from .store import (
    LOCK_TTL_MS,
    TURN_TTL_S,
    Binding,
    HeldLock,
    LockLost,
    LockTimeout,
    SessionStore,
    SessionStoreUnavailable,
    TurnLease,
    binding_key,
    lifecycle_lock,
    lock_key,
    now_iso,
    turn_key,
)
from .store_select import get_store
from .tuning import SESSIONS

logger = logging.getLogger(__name__)

GONE_KINDS = frozenset({ErrorKind.NOT_FOUND, ErrorKind.GONE})
# Failures that a pause racing the call, or an engine at odds with itself, produce.
RACE_KINDS = frozenset({ErrorKind.CONFLICT, ErrorKind.INTERNAL, ErrorKind.TIMEOUT, ErrorKind.UNAVAILABLE})
# How long a user's Pause waits for another lifecycle operation of the session to end.
PAUSE_LOCK_WAIT_S = 5.0


@contextlib.contextmanager
def off_the_database() -> Iterator[None]:
    """While the engine runs a command, this thread's pooled database connection goes back to
    the pool (settings: DATABASE_POOL_SIZE), so a few connections serve many execs in flight;
    the next query takes one again. Without a pool (SQLite, tests) or inside a transaction:
    nothing is done."""
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()
    yield


def sandbox_or_none(backend: Backend, sandbox_id: str) -> SandboxInfo | None:
    """`backend.get(sandbox_id)`, or None when the backend says it is not there (any more).
    Bounded by sessions.engine_timeout_s: a state read never holds a worker longer."""
    try:
        return backend.get(sandbox_id, timeout_s=SESSIONS.engine_timeout_s)
    except RemoteError as exc:
        if exc.kind in GONE_KINDS:
            return None
        raise


# A slow path whose lock lease ran out starts over (waiting for the new holder) this often.
LOCK_LOST_RETRIES = 2
# How long past its own timeout an exec still counts as in flight (a process that died mid-exec).
EXEC_GRACE = timedelta(seconds=60)
ACTIVITY_WRITE_INTERVAL = timedelta(seconds=30)
HOLDER = f"{socket.gethostname()}:{os.getpid()}"


class SessionDeleted(RemoteError):
    """The session was deleted while this call was on its way (the API answers 404)."""

    def __init__(self, key: str) -> None:
        super().__init__(ErrorKind.NOT_FOUND, f"the session {key!r} was deleted")
        self.key = key


class SessionConflict(Conflict):
    """A call refused or cut by the session's own state, not a backend failure: 409 with a
    code of its own (the API answers `code`, and the message says what to do)."""

    code = "conflict"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(ErrorKind.CONFLICT, message, retryable=retryable)


class SessionBusy(SessionConflict):
    """A pause refused: something is in flight in the session."""

    code = "session_busy"


class SessionNotRunning(SessionConflict):
    """A call that raced a pause (or found the sandbox stopped under it)."""

    code = "session_not_running"


class SandboxReplaced(SessionConflict):
    """The sandbox a call ran in was replaced or removed while it ran."""

    code = "sandbox_replaced"


# A session's binding and turn lease as its caller read them with its row (None: not read).
SessionRead = tuple[Binding | None, TurnLease] | None


@dataclass(frozen=True)
class Resolved:
    session: Session
    sandbox: SandboxInfo
    binding: Binding
    action: str  # bound | claimed | pooled | created | rebuilt


class Runtime:
    """Resolve and manage sessions against one session store (the process's by default)."""

    def __init__(self, store: SessionStore | None = None, *, lock_ttl_ms: int = LOCK_TTL_MS) -> None:
        self.store = store or get_store()
        self.lock_ttl_ms = lock_ttl_ms

    # Keys -----------------------------------------------------------------------------

    @staticmethod
    def keys(session: Session) -> tuple[str, str, str]:
        return (
            binding_key(session.space_id, session.key),
            lock_key(session.space_id, session.key),
            turn_key(session.space_id, session.key),
        )

    # Turns ------------------------------------------------------------------------------

    def begin_turn(self, session: Session) -> None:
        """A new turn: its first resolve may rebuild a stale sandbox (one-shot ticket)."""
        self.store.begin_turn(self.keys(session)[2], TURN_TTL_S)

    def end_turn(self, session: Session) -> None:
        self.store.end_turn(self.keys(session)[2])

    def rebuild_allowed(self, session: Session, bound_at: datetime, lease: TurnLease | None = None) -> bool:
        """Whether a sandbox bound at `bound_at` must be rebuilt by this resolve."""
        stale = session.stale_at is not None and bound_at < session.stale_at
        tkey = self.keys(session)[2]
        try:
            lease = lease or self.store.turn_lease(tkey)
            if not lease.in_flight:
                return stale
            # The first resolve of the turn consumes the ticket whether or not it rebuilds,
            # so a sandbox that goes stale mid-turn stays until the next turn.
            first_of_turn = lease.ticket_unused and self.store.consume_ticket(tkey)
        except SessionStoreUnavailable:
            return False  # cannot read the lease: assume a turn is in flight, tear nothing down
        return stale and first_of_turn

    # Resolve ----------------------------------------------------------------------------

    def resolve(
        self,
        space: Space,
        key: str,
        *,
        config: SandboxConfig | None = None,
        actor: Actor = SYSTEM,
        labels: Sequence[str] = (),
        found: tuple[bool, Session | None] = (False, None),
        started: float | None = None,
    ) -> Resolved:
        """The session `key` of `space` (created with `labels` when new) on a live sandbox.
        The session's row and its binding and turn lease are read together (`read_session_with`:
        the store's round trip overlaps the database's, or both are prepared statements).
        `found`: (looked up already?, the session or None), as the API reads it with its token:
        a session it found none of is created at once. `started` (time.perf_counter()): when
        the caller's wait began (its request), for what a warm source records."""
        started = time.perf_counter() if started is None else started
        check_session_key(key)
        looked_up, session = found
        read: SessionRead = None
        with looking_ahead(space.pk, key) as ahead:  # the engine answers while the row is read
            if not looked_up or session is not None:
                session, read = self.store.read_session_with(
                    binding_key(space.pk, key), turn_key(space.pk, key), SessionRow(space, key)
                )
            if session is None:
                # New: written once, as active (it is resolved now); a racing creator's row if
                # another process created it first.
                session = create_session(space, key, config=config, actor=actor, labels=labels, active=True)
                read, ahead = None, None
            else:
                session.space = space
            with self.telling_deleted(session), resolving_since(started):
                return self.resolve_session(session, read=read, ahead=ahead)

    def resolve_session(
        self,
        session: Session,
        *,
        own_calls: int = 0,
        may_rebuild: bool = True,
        read: SessionRead = None,
        ahead: Ahead | None = None,
    ) -> Resolved:
        """Resolve, timed by path and outcome (console.metrics) and logged. `own_calls`: calls
        the caller counted in flight itself (an exec), which a stale rebuild does not wait for.
        `may_rebuild=False` (opening a terminal): a stale sandbox is kept, the ticket unused.
        `read`: the session's binding and turn lease if the caller read them with its row.
        `ahead`: a look at the sandbox sent before the row was read (sessions.ahead)."""
        with observe_resolve(session) as observed:
            observed.resolved = self._resolve_session(session, own_calls, may_rebuild, read, ahead)
            return observed.resolved

    def _resolve_session(
        self, session: Session, own_calls: int, may_rebuild: bool, read: SessionRead, ahead: Ahead | None
    ) -> Resolved:
        bkey, _, tkey = self.keys(session)
        if self._touch(session) or session.state != SessionState.RUNNING:
            ahead = None  # sent before a write that must come first, or the row says not running
        binding, lease = read if read is not None else self.store.read_session(bkey, tkey)
        if binding is not None:
            rebuild = may_rebuild and self.rebuild_allowed(session, binding.created_at, lease)
            if not rebuild:
                info = self._connect(session, binding, racing=True, ahead=ahead)
                if info is not None and info.sandbox_id == binding.sandbox_id:
                    return self._finish(session, info, binding, "bound")
                # Gone, or connect answered with another id: settle it under the lock.
            return self._resolve_locked(session, rebuild=rebuild, own_calls=own_calls)
        # A resolve that creates or claims is a turn's resolve too: it uses up the ticket, so
        # a sandbox made by this turn is never rebuilt by the same turn.
        if lease.in_flight and lease.ticket_unused:
            with contextlib.suppress(SessionStoreUnavailable):
                self.store.consume_ticket(tkey)
        return self._resolve_locked(session, rebuild=False)

    @staticmethod
    def _touch(session: Session) -> bool:
        """Record activity before the sandbox is looked at. The idle sweep idles only a session
        whose activity did not move, holding its row meanwhile: so this write either lands
        first (the sweep leaves the session alone) or waits for the pause to be done (and the
        connect below resumes the sandbox), never lets a caller open a process in a sandbox
        being frozen. Sessions active in the last interval are not idle candidates: no write.
        True when it wrote."""
        now = timezone.now()
        if session.last_activity is None or now - session.last_activity > ACTIVITY_WRITE_INTERVAL:
            Session.objects.filter(pk=session.pk).update(last_activity=now)
            session.last_activity = now
            return True
        return False

    def _resolve_locked(self, session: Session, *, rebuild: bool, own_calls: int = 0) -> Resolved:
        took_slow_path()
        made: list[str] = []  # sandboxes an attempt created and could not bind (its lease ran out)
        for attempt in range(LOCK_LOST_RETRIES + 1):
            try:
                return self._slow_path(session, rebuild=rebuild, made=made, own_calls=own_calls)
            except LockLost:
                # Our lease ran out mid-way: someone else may be deciding now. Start over
                # behind them; what we made is found again by metadata (claimed), never lost.
                if attempt == LOCK_LOST_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def _connect(
        self, session: Session, binding: Binding, *, racing: bool = False, ahead: Ahead | None = None
    ) -> SandboxInfo | None:
        """Connect (resume); None when the sandbox is gone. A failure that a pause racing the
        resume or an engine at odds with itself explains is repaired and tried once more, then
        answered in words (`racing`: not holding the session's lock, so wait for its holder).
        `ahead`: a look sent early, which answers for the connect when it found the sandbox
        bound here running (sessions.ahead)."""
        backend = get_backend(session.config)
        try:
            # The look's timeout is the connect's: handled as the connect's own below.
            info = ahead.running(backend, binding.sandbox_id) if ahead is not None else None
            return info if info is not None else backend.connect(binding.sandbox_id)
        except RemoteError as exc:
            if exc.kind in GONE_KINDS:
                return None
            # An engine that cannot be reached is no race: it answers 503 as it came.
            if exc.kind not in RACE_KINDS or exc.kind == ErrorKind.UNAVAILABLE or isinstance(exc, SessionConflict):
                raise
            first = exc
        if racing:
            self._wait_for_lifecycle(session)
        repaired = self._repair_quietly(backend, binding.sandbox_id)
        try:
            return backend.connect(binding.sandbox_id)
        except RemoteError as exc:
            if exc.kind in GONE_KINDS:
                return None
            self._refresh_or_deleted(session, ["state"])
            if exc.kind not in (ErrorKind.CONFLICT, ErrorKind.INTERNAL):
                raise  # a timeout or an engine gone: said as such (504, 503)
            raise SessionNotRunning(
                f"Session {session.key!r}: its sandbox could not be resumed ({first.message})"
                + (f"; it was found in a broken state and {repaired}" if repaired else "")
                + ". Try again in a moment; if it persists, rebuild the session.",
            ) from exc

    def _wait_for_lifecycle(self, session: Session) -> None:
        """Wait (bounded) for whoever holds the session's lifecycle lock — a pause, rebuild
        or delete in progress — to be done; a deleted session is SessionDeleted."""
        if self.deleted(session):
            raise SessionDeleted(session.key)
        self._refresh_or_deleted(session, ["state"])

    def deleted(self, session: Session) -> bool:
        """Whether a DELETE removed `session` (under a call that failed). A DELETE deletes the
        sandbox first and the row last, holding the session's lifecycle lock: while the row is
        there, wait (bounded) for the lock's holder to be done, then look again."""
        rows = Session.objects.filter(pk=session.pk)
        if not rows.exists():
            return True
        with (
            contextlib.suppress(RemoteError),
            lifecycle_lock(self.store, self.keys(session)[1], wait_s=SESSIONS.engine_timeout_s, holder=HOLDER),
        ):
            pass
        return not rows.exists()

    @contextlib.contextmanager
    def telling_deleted(self, session: Session, *also: type[Exception]) -> Iterator[None]:
        """A call on `session`: a failure it meets because a DELETE removed the session under
        it (the sandbox gone mid-call, a row of the session vanished, a foreign key to it
        broken, or one of `also`) is `SessionDeleted`, which the API answers 404. A failure
        already said in words (`SessionConflict`) stands as it is."""
        failures: tuple[type[Exception], ...] = (RemoteError, ObjectDoesNotExist, IntegrityError, *also)
        try:
            yield
        except (SessionDeleted, SessionConflict):
            raise
        except failures as exc:
            if self.deleted(session):
                raise SessionDeleted(session.key) from exc
            raise

    @staticmethod
    def _repair_quietly(backend: Backend, sandbox_id: str) -> str | None:
        try:
            return backend.repair(sandbox_id)
        except (RemoteError, OSError) as exc:
            logger.warning("repair of sandbox %s failed: %s", sandbox_id, exc, extra={"sandbox_id": sandbox_id})
            return None

    def _refresh_or_deleted(self, session: Session, fields: list[str]) -> None:
        try:
            session.refresh_from_db(fields=fields)
        except Session.DoesNotExist:
            raise SessionDeleted(session.key) from None

    def _slow_path(self, session: Session, *, rebuild: bool, made: list[str], own_calls: int = 0) -> Resolved:
        backend = get_backend(session.config)
        with lifecycle_lock(self.store, self.keys(session)[1], holder=HOLDER, ttl_ms=self.lock_ttl_ms) as held:
            if rebuild and not self._quiet_for_rebuild(session, own_calls):
                rebuild = False  # deferred: the stale sandbox stays until the next turn
            resolved = self._decide(session, backend, held, rebuild=rebuild, made=made)
            # What an earlier attempt made while its lease ran out, if another holder bound
            # something else meanwhile: ours now, under the lock, so delete it (no orphan).
            for orphan in [m for m in made if m != resolved.sandbox.sandbox_id]:
                held.check()
                self._delete_quietly(backend, orphan)
                made.remove(orphan)
            return resolved

    def _quiet_for_rebuild(self, session: Session, own_calls: int) -> bool:
        """Wait up to sessions.rebuild_wait_s for the session's other execs, commands and open
        terminals to end; False (defer the rebuild) if they do not."""
        deadline = time.monotonic() + SESSIONS.rebuild_wait_s
        while True:
            reason = busy_reason(session.pk, own_calls=own_calls)
            if reason is None:
                return True
            if time.monotonic() >= deadline:
                logger.info(
                    "stale rebuild of session %s deferred: %s",
                    session.key,
                    reason,
                    extra={"action": "rebuild_deferred", "session_key": session.key, "reason": reason},
                )
                return False
            time.sleep(0.2)

    def _decide(
        self, session: Session, backend: Backend, held: HeldLock, *, rebuild: bool, made: list[str]
    ) -> Resolved:
        """The slow path's decision, holding the session's lifecycle lock."""
        bkey = self.keys(session)[0]
        self._refresh_or_deleted(session, ["stale_at", "binding_version"])
        binding = self.store.get_binding(bkey)
        if binding is not None:
            fresh = session.stale_at is None or binding.created_at >= session.stale_at
            if not rebuild or fresh:
                info = self._connect(session, binding)
                if info is not None:
                    if info.sandbox_id != binding.sandbox_id:
                        binding = self._rebind(held, bkey, binding, info)
                    return self._finish(session, info, binding, "bound")
            else:
                held.check()
                self._delete_quietly(backend, binding.sandbox_id)
            held.check()
            self.store.delete_binding_if(bkey, binding)
        previous_version = max(binding.version if binding else 0, session.binding_version)
        claimed = self._claim(session, backend, rebuild=rebuild)
        pooled = None if claimed is not None or rebuild or binding is not None else previous_version + 1
        if claimed is not None:
            info, version = claimed
            action = "claimed"
        elif pooled is not None and (warm := from_warm_pool(session, backend, pooled)) is not None:
            info, version, action = warm, pooled, "pooled"
        else:
            info, version = self._create(session, backend, previous_version + 1), previous_version + 1
            action = "rebuilt" if rebuild or binding is not None else "created"
        # A claimed sandbox keeps its own start time, so a stale one still looks stale.
        started = info.started_at if action == "claimed" and info.started_at is not None else None
        bound = Binding(
            sandbox_id=info.sandbox_id,
            version=version,
            config_id=str(session.config_id),
            created=started.isoformat() if started is not None else now_iso(),
        )
        # Never bind on a lease that ran out: the sandbox stays, to be claimed by whoever
        # holds the lock now, or by our own retry (which deletes it if another was bound).
        try:
            held.check()
        except LockLost:
            if action != "claimed":
                made.append(info.sandbox_id)
            raise
        if not self.store.set_binding_if_absent(bkey, bound):
            return self._lost_the_race(session, backend, bkey, info, action)
        resolved = self._finish(session, info, bound, action)
        self._catch_up_policy(session, backend)
        return resolved

    @staticmethod
    def _catch_up_policy(session: Session, backend: Backend) -> None:
        """A sandbox just bound runs the spec read before it was made (or claimed); a policy
        saved meanwhile skipped it in its live pass (no sandbox on the row yet). Now that the
        row names it, any later pass sees it; the change before is applied here."""
        spec = network_spec_for(session.space, session)
        fingerprint = spec_fingerprint(spec)
        if fingerprint == session.policy_fingerprint:
            return
        egress = backend.egress()
        if egress is None or not backend.network_capabilities().live_update:
            return  # fixed at create: the policy page lists it as keeping older rules
        try:
            egress.update(session.sandbox_id, spec)
        except RemoteError as exc:
            logger.warning("policy catch-up of session %s failed: %s", session.key, exc)
            # Never applied, as far as the periodic catch-up (network-catch-up) sees: it retries.
            session.policy_applied_at = None
            Session.objects.filter(pk=session.pk).update(policy_applied_at=None)
            return
        session.policy_fingerprint, session.policy_applied_at = fingerprint, timezone.now()
        Session.objects.filter(pk=session.pk).update(
            policy_fingerprint=fingerprint, policy_applied_at=session.policy_applied_at
        )

    def _lost_the_race(self, session: Session, backend: Backend, bkey: str, mine: SandboxInfo, action: str) -> Resolved:
        """Another writer bound the session first: theirs stands, ours (if new) goes."""
        winner = self.store.get_binding(bkey)
        if winner is not None:
            if winner.sandbox_id == mine.sandbox_id:
                return self._finish(session, mine, winner, "bound")
            if action != "claimed":  # a claimed one may be theirs to keep; the reaper decides
                self._delete_quietly(backend, mine.sandbox_id)
            info = self._connect(session, winner)
            if info is not None:
                return self._finish(session, info, winner, "bound")
        raise RemoteError(ErrorKind.CONFLICT, "another writer bound this session; try again", retryable=True)

    def _rebind(self, held: HeldLock, bkey: str, old: Binding, info: SandboxInfo) -> Binding:
        """Connect answered with a new id for the bound sandbox (E2B after a resume): move the
        binding to it, or the reaper would see the live sandbox as unowned."""
        moved = Binding(sandbox_id=info.sandbox_id, version=old.version, config_id=old.config_id, created=old.created)
        held.check()
        if self.store.delete_binding_if(bkey, old) and self.store.set_binding_if_absent(bkey, moved):
            return moved
        return self.store.get_binding(bkey) or moved

    def _claim(self, session: Session, backend: Backend, *, rebuild: bool) -> tuple[SandboxInfo, int] | None:
        """Adopt a sandbox this console created for the session (oldest wins)."""
        query = ListQuery(metadata=self.session_metadata(session))
        found = [s for s in backend.iter_sandboxes(query) if s.state != SandboxState.GONE]
        if len(found) > 1:
            # Listings may round creation times (Docker: to the second); ask each for its own.
            found = [info for info in (sandbox_or_none(backend, s.sandbox_id) for s in found) if info]
        found.sort(key=lambda s: (s.started_at is None, s.started_at or timezone.now()))
        if rebuild and session.stale_at is not None:
            # Rebuilding for staleness: what was created before the stale time goes too.
            keep = [s for s in found if s.started_at is not None and s.started_at >= session.stale_at]
            for old in found:
                if old not in keep:
                    self._delete_quietly(backend, old.sandbox_id)
            found = keep
        if not found:
            return None
        winner, duplicates = found[0], found[1:]
        for duplicate in duplicates:
            self._delete_quietly(backend, duplicate.sandbox_id)
        info = backend.connect(winner.sandbox_id)
        if info.started_at is None and winner.started_at is not None:
            info = replace(info, started_at=winner.started_at)
        self._keep_traffic_token(session, info)
        # A claimed sandbox may come from a create cut before its workspace was laid out
        # (input/ would still be the session user's to write); the layout is idempotent.
        prepare_workspace(backend, info.sandbox_id)
        version = int(winner.metadata.get(META_BINDING_VERSION, "0") or 0)
        return info, version

    @staticmethod
    def _keep_traffic_token(session: Session, info: SandboxInfo) -> None:
        """A claimed sandbox's traffic token (E2B answers it on connect) replaces the session's."""
        if info.traffic_token and info.traffic_token != decrypt(session.traffic_token_encrypted):
            session.traffic_token_encrypted = encrypt(info.traffic_token)
            Session.objects.filter(pk=session.pk).update(traffic_token_encrypted=session.traffic_token_encrypted)

    def _create(self, session: Session, backend: Backend, version: int) -> SandboxInfo:
        config = session.config
        template = effective_template(session.space, config)
        persistent = config.persistent_workspace and backend.volumes() is not None
        network = network_spec_for(session.space, session)
        refuse_unless_honoured(network, backend, config.name)  # a settings conflict: 409, never 502
        spec = SandboxSpec(
            template_id=template.template_id,
            network=network,
            metadata={**self.session_metadata(session), META_BINDING_VERSION: str(version)},
            resources=sandbox_resources(config),
            timeout_s=config.idle_timeout_s,
            auto_pause=True,
            auto_resume=True,
            workspace_volume=session.workspace_volume if persistent else None,
            workspace_layout=WORKSPACE_LAYOUT,
        )
        if persistent and not session.has_persistent_workspace:
            # Recorded before the create, so a delete after a crash mid-create still removes it.
            if not Session.objects.filter(pk=session.pk).update(has_persistent_workspace=True):
                raise SessionDeleted(session.key)
            session.has_persistent_workspace = True
        info = backend.create(spec)
        try:
            ready_workspace(backend, info)
        except RemoteError:
            self._delete_quietly(backend, info.sandbox_id)
            raise
        session.template_id = template.template_id
        session.traffic_token_encrypted = encrypt(info.traffic_token or "")
        session.policy_fingerprint, session.policy_applied_at = spec_fingerprint(network), timezone.now()
        kept = Session.objects.filter(pk=session.pk).update(
            template_id=session.template_id,
            traffic_token_encrypted=session.traffic_token_encrypted,
            policy_fingerprint=session.policy_fingerprint,
            policy_applied_at=session.policy_applied_at,
        )
        if not kept:  # deleted meanwhile (not through Runtime.delete, which waits for the lock)
            self._delete_quietly(backend, info.sandbox_id)
            raise SessionDeleted(session.key)
        record_audit(
            SYSTEM,
            AuditAction.SESSION_SANDBOX_CREATE,
            space=session.space,
            target_type="session",
            target_id=session.id,
            target_name=session.key,
            details={"sandbox_id": info.sandbox_id, "template": template.template_id, "version": version},
        )
        return info

    @staticmethod
    def session_metadata(session: Session) -> dict[str, str]:
        return {
            META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID,
            META_SPACE: str(session.space_id),
            META_CONFIG: str(session.config_id),
            META_SESSION: session.key,
        }

    @staticmethod
    def _delete_quietly(backend: Backend, sandbox_id: str) -> None:
        with contextlib.suppress(RemoteError):  # the reaper removes what is left
            backend.delete(sandbox_id)

    def _finish(self, session: Session, info: SandboxInfo, binding: Binding, action: str) -> Resolved:
        now = timezone.now()
        changes: dict[str, object] = {}
        if session.sandbox_id != info.sandbox_id:
            changes["sandbox_id"] = info.sandbox_id
        if session.bound_at != binding.created_at:
            changes["bound_at"] = binding.created_at
        if session.binding_version != binding.version:
            changes["binding_version"] = binding.version
        if session.state != SessionState.RUNNING:
            changes["state"] = SessionState.RUNNING
        if session.last_activity is None or now - session.last_activity > ACTIVITY_WRITE_INTERVAL:
            changes["last_activity"] = now
        if changes:
            Session.objects.filter(pk=session.pk).update(**changes)
            for name, value in changes.items():
                setattr(session, name, value)
        remember(session.space_id, session.key, get_backend(session.config), binding.sandbox_id)
        return Resolved(session=session, sandbox=info, binding=binding, action=action)

    # Operations ---------------------------------------------------------------------------

    def exec(self, session: Session, request: ExecRequest) -> ExecResult:
        """Run a command in the session's sandbox; counted as in flight meanwhile, so no pause
        freezes the sandbox under it and a stale rebuild waits for it (or is deferred)."""
        backend = get_backend(session.config)
        with self.telling_deleted(session), self.exec_in_flight(session, request.timeout_s):
            known = self._known_running(session, backend)
            if known is not None:
                try:
                    return self._exec_in(session, backend, known, request, known=True)
                except NotStarted:
                    pass  # the engine's own word that it is not running: resolve, run it there
            sandbox_id = self.resolve_session(session, own_calls=1).sandbox.sandbox_id
            return self._exec_in(session, backend, sandbox_id, request)

    def _known_running(self, session: Session, backend: Backend) -> str | None:
        """The session's sandbox when the runtime knows it is running and nothing would make
        a resolve do more than connect to it: bound to the sandbox the row names, the row
        says running, not stale, and no turn's first resolve is still due (that resolve
        decides a rebuild). Only for a backend whose exec refuses an idle or gone sandbox
        (`exec_refuses_when_idle`): the exec itself then checks, and no connect is needed."""
        if not backend.exec_refuses_when_idle or session.state != SessionState.RUNNING or not session.sandbox_id:
            return None
        bkey, _, tkey = self.keys(session)
        try:
            binding, lease = self.store.read_session(bkey, tkey)
        except SessionStoreUnavailable:
            return None  # the full resolve says what to say
        if binding is None or binding.sandbox_id != session.sandbox_id or (lease.in_flight and lease.ticket_unused):
            return None
        if session.stale_at is not None and binding.created_at < session.stale_at:
            return None
        self._touch(session)
        return binding.sandbox_id

    def _exec_in(
        self, session: Session, backend: Backend, sandbox_id: str, request: ExecRequest, *, known: bool = False
    ) -> ExecResult:
        try:
            with off_the_database():
                result = backend.exec(sandbox_id, request)
        except RemoteError as exc:
            if isinstance(exc, SessionConflict) or (known and isinstance(exc, NotStarted)):
                raise  # said in words; or, on the known sandbox, the caller resolves and retries
            raise self._explain(session, backend, sandbox_id, exc) from exc
        killed = result.exit_code is None or result.exit_code < 0 or result.exit_code >= 128
        if killed and not result.timed_out:
            # Killed by a signal: by its own doing, or because its sandbox went under it.
            gone = self._replaced_or_none(session, backend, sandbox_id)
            if gone is not None:
                raise gone
        return result

    def _replaced(self, session: Session, backend: Backend, sandbox_id: str) -> RemoteError | None:
        """Why the sandbox a call ran in is no longer the session's (waiting for a rebuild or
        delete in progress to be done first), or None when it still is."""
        self._wait_for_lifecycle(session)  # SessionDeleted when a delete did it
        binding = self.store.get_binding(self.keys(session)[0])
        if binding is not None and binding.sandbox_id == sandbox_id and sandbox_or_none(backend, sandbox_id):
            return None
        return SandboxReplaced(
            f"Session {session.key!r}: its sandbox was replaced or removed while the command ran "
            "(a rebuild or a delete), so the command was cut short. Its result is lost; run it again.",
        )

    def _replaced_or_none(self, session: Session, backend: Backend, sandbox_id: str) -> RemoteError | None:
        """`_replaced`, or None when the engine cannot tell now (the result stands as it came)."""
        try:
            return self._replaced(session, backend, sandbox_id)
        except SessionDeleted:
            raise
        except RemoteError:
            return None

    def _explain(self, session: Session, backend: Backend, sandbox_id: str, exc: RemoteError) -> RemoteError:
        """A failed call on the session's sandbox, in words when a pause, a rebuild or a delete
        raced it or the engine disagreed with itself; else the failure as it came."""
        if exc.kind not in GONE_KINDS and exc.kind not in RACE_KINDS:
            return exc
        try:
            gone = self._replaced(session, backend, sandbox_id)
            if gone is not None:
                return gone
            repaired = self._repair_quietly(backend, sandbox_id) if exc.kind != ErrorKind.NOT_FOUND else None
            info = sandbox_or_none(backend, sandbox_id)
        except SessionDeleted:
            raise
        except RemoteError:
            return exc  # the engine cannot tell now (unreachable, say): the failure as it came
        if repaired or info is None or info.state != SandboxState.RUNNING:
            state = "repaired: " + repaired if repaired else (str(info.state) if info else "gone")
            return SessionNotRunning(
                f"Session {session.key!r}: its sandbox was not running when the call reached it ({state})."
                " POST …/resolve (or run the call again) resumes it.",
            )
        return exc

    @contextlib.contextmanager
    def exec_in_flight(self, session: Session, timeout_s: float | None) -> Iterator[None]:
        """An exec slot of the space's limits, and the exec counted in flight on its session:
        one statement to take the slot and count in, one to free it and count out."""
        until = timezone.now() + timedelta(seconds=timeout_s or 3600) + EXEC_GRACE
        slots: list[ExecSlot] = []

        def take(count: Count) -> None:
            # One of the space's places, or refused uncounted.
            slots.append(take_exec_slot(session.space, session, until, count))

        def free(count: Count) -> None:
            # Counted out only if this frees the slot: a release of this process as dead (a
            # freeze past the heartbeat window) freed it and lowered the session's count already.
            release_exec_slot(slots[0], count)

        with in_flight(session, timeout_s or 3600, counting=take, ending=free):
            yield

    def pause(
        self,
        session: Session,
        *,
        actor: Actor,
        idle_since: datetime | None = None,
        lock_wait_s: float = PAUSE_LOCK_WAIT_S,
    ) -> SandboxInfo:
        """The one way a sandbox is paused (the UI, the API and the idle sweep alike).

        Under the session's lifecycle lock, and only with nothing in flight (an exec, a file
        call, a background command, an open terminal): else `SessionBusy`, in words. The
        session's row is held from that check until the engine has answered, so a call that
        starts meanwhile waits for the pause and then resumes the sandbox; it never starts a
        process in a sandbox being frozen (docker/for-linux#891). The engine call is bounded
        (sessions.engine_timeout_s); a failure is checked for a broken state and repaired.
        `idle_since` (the idle sweep): pause only a running session whose activity did not move.
        """
        bkey, lkey, _ = self.keys(session)
        backend = get_backend(session.config)
        reason = busy_reason(session.pk)
        if reason is not None:  # refused before the lock: busy sessions do not crowd it
            raise self._busy(session, reason)
        try:
            with lifecycle_lock(self.store, lkey, holder=HOLDER, ttl_ms=self.lock_ttl_ms, wait_s=lock_wait_s) as held:
                held.check()
                binding = self.store.get_binding(bkey)
                if binding is None:
                    raise ServiceError("This session has no sandbox to pause.")
                with transaction.atomic():
                    rows = quiet_sessions().filter(pk=session.pk)
                    if idle_since is not None:
                        rows = rows.filter(state=SessionState.RUNNING, last_activity=idle_since)
                    # A conditional write takes the row (on SQLite, the database) and keeps it
                    # until the engine has answered; a call counting itself in flight waits.
                    if not rows.update(last_activity=F("last_activity")):
                        self._refresh_or_deleted(session, ["state"])
                        raise self._busy(session, busy_reason(session.pk) or "its activity moved on")
                    info = self._engine_pause(session, backend, binding.sandbox_id)
                    state = SessionState.STOPPED if info.state == SandboxState.STOPPED else SessionState.PAUSED
                    Session.objects.filter(pk=session.pk).update(state=state)
                    record_audit(
                        actor,
                        AuditAction.SESSION_PAUSE,
                        space=session.space,
                        target_type="session",
                        target_id=session.id,
                        target_name=session.key,
                        details={"sandbox_id": binding.sandbox_id, "state": state},
                    )
        except LockTimeout:
            raise SessionBusy(
                f"Session {session.key!r} is being resumed, rebuilt or deleted right now; pause it again in a moment."
            ) from None
        session.state = state
        return info

    @staticmethod
    def _busy(session: Session, reason: str) -> SessionBusy:
        return SessionBusy(
            f"Session {session.key!r} is busy ({reason}); it was not paused."
            " Pause it once that work is done (the idle sweep pauses it when it is quiet)."
        )

    def _engine_pause(self, session: Session, backend: Backend, sandbox_id: str) -> SandboxInfo:
        try:
            return backend.pause(sandbox_id, timeout_s=SESSIONS.engine_timeout_s)
        except RemoteError as exc:
            if exc.kind in GONE_KINDS or exc.kind not in RACE_KINDS:
                raise
            repaired = self._repair_quietly(backend, sandbox_id)
            if not repaired:
                raise
            raise RemoteError(
                ErrorKind.UNAVAILABLE,
                f"Session {session.key!r}: the engine did not pause its sandbox ({exc.message}); the sandbox"
                f" was found in a broken state and {repaired}. It is running; pause it again later.",
                retryable=True,
            ) from exc

    def resume(self, session: Session, *, actor: Actor) -> Resolved:
        resolved = self.resolve_session(session)
        record_audit(
            actor,
            AuditAction.SESSION_RESUME,
            space=session.space,
            target_type="session",
            target_id=session.id,
            target_name=session.key,
            details={"sandbox_id": resolved.sandbox.sandbox_id, "action": resolved.action},
        )
        return resolved

    def rebuild(self, session: Session, *, actor: Actor) -> Resolved:
        """Replace the sandbox now (the persistent workspace, if any, is kept)."""
        bkey, lkey, _ = self.keys(session)
        backend = get_backend(session.config)
        with lifecycle_lock(self.store, lkey, holder=HOLDER, ttl_ms=self.lock_ttl_ms):
            binding = self.store.get_binding(bkey)
            if binding is not None:
                self._delete_quietly(backend, binding.sandbox_id)
                self.store.delete_binding_if(bkey, binding)
            for leftover in backend.iter_sandboxes(ListQuery(metadata=self.session_metadata(session))):
                self._delete_quietly(backend, leftover.sandbox_id)
        resolved = self.resolve_session(session)
        record_audit(
            actor,
            AuditAction.SESSION_REBUILD,
            space=session.space,
            target_type="session",
            target_id=session.id,
            target_name=session.key,
            details={"sandbox_id": resolved.sandbox.sandbox_id, "version": resolved.binding.version},
        )
        return resolved

    def delete(self, session: Session, *, actor: Actor) -> None:
        """Delete the session, its sandboxes, its binding and its persistent workspace."""
        bkey, lkey, tkey = self.keys(session)
        backend = get_backend(session.config)
        with lifecycle_lock(self.store, lkey, holder=HOLDER, ttl_ms=self.lock_ttl_ms):
            if not Session.objects.filter(pk=session.pk).exists():
                raise SessionDeleted(session.key)  # a racing delete got there first
            binding = self.store.get_binding(bkey)
            if binding is not None:
                backend.delete(binding.sandbox_id)
                self.store.delete_binding_if(bkey, binding)
            for leftover in backend.iter_sandboxes(ListQuery(metadata=self.session_metadata(session))):
                backend.delete(leftover.sandbox_id)
            volumes = backend.volumes()
            # Only a session that had one: on Cube a delete costs a housekeeping sandbox.
            if volumes is not None and session.has_persistent_workspace:
                volumes.delete(session.workspace_volume)
            self.store.end_turn(tkey)
            with transaction.atomic():
                # Lock the row first: a terminal, command or artifact row inserted meanwhile
                # either commits before (and is deleted with it) or fails its foreign key after,
                # never makes this delete fail at commit.
                if not Session.objects.select_for_update().filter(pk=session.pk).values_list("pk", flat=True):
                    raise SessionDeleted(session.key)
                record_audit(
                    actor,
                    AuditAction.SESSION_DELETE,
                    space=session.space,
                    target_type="session",
                    target_id=session.id,
                    target_name=session.key,
                    details={"key": session.key},
                )
                for artifact in session.artifacts.all():
                    artifact.file.delete(save=False)
                session.delete()

    def running_sandbox(self, session: Session) -> SandboxInfo | None:
        """The session's bound sandbox when it is running, else None; reads only.

        Never creates, connects (a connect resumes a paused sandbox), resumes or rebuilds, so
        GET pages may call it: browsing a paused session's files offers a resume instead.
        """
        binding = self.store.get_binding(self.keys(session)[0])
        if binding is None:
            return None
        info = sandbox_or_none(get_backend(session.config), binding.sandbox_id)
        return info if info is not None and info.state == SandboxState.RUNNING else None

    def inspect(self, session: Session) -> dict[str, object]:
        """What the binding inspector shows; each part tolerates an unavailable store."""
        bkey, lkey, tkey = self.keys(session)
        report: dict[str, object] = {"store": self.store.name}
        try:
            binding = self.store.get_binding(bkey)
            report["binding"] = binding
            report["lock_holder"] = self.store.lock_holder(lkey)
            report["turn"] = self.store.turn_lease(tkey)
        except SessionStoreUnavailable as exc:
            report["error"] = exc.message
        report["traffic_token_present"] = bool(session.traffic_token_encrypted)
        return report

    def traffic_token(self, session: Session) -> str:
        return decrypt(session.traffic_token_encrypted)
