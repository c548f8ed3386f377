"""Handing a ready pooled sandbox to a session: `take`, the warm source the runtime asks
(`sessions.provisioning.from_warm_pool`) under the session's lifecycle lock, when the session
has no binding and no sandbox carries its labels.

- A session that claimed a member and was never bound (its process died between the claim and
  the bind, or the store lost the binding) gets that member back: reclaimable, never leaked.
- Otherwise only a new session (never bound) claims: one ready member of its config made from
  the current template, taken by a conditional update (on PostgreSQL the row is picked with
  SKIP LOCKED), so two sessions never get one sandbox; a session holds at most one member (a
  one-to-one column), so one session never takes two.
- At claim the sandbox is resumed if it waits paused, the session's network spec is applied
  live where it differs from the pool's (else the member goes back and the resolve creates),
  and the session takes over its workspace volume, template, traffic token and fingerprint.

Every first resolve on a config with a pool leaves a `PoolClaim` row (hit or miss, why, how
long the claim took and how long the caller waited for the whole resolve), written once the
resolve is done (`sessions.observe.after_resolve`), and the console.metrics series
`POOL_CLAIMS` / `POOL_CLAIM_SECONDS` / `POOL_RESOLVE_SECONDS`; a claim starts a refill
(`keeper.kick`).

The hot path of a hit: one statement claims the row and answers it (UPDATE … RETURNING), two
adopt it (the session's row, the audit), one commit; no engine call for a member kept running
(the pool trusts it as its refill saw it).
"""

from __future__ import annotations

import contextlib
import logging
import time

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from console import metrics
from console.crypto import encrypt
from console.models import AuditAction
from console.services import SYSTEM, record_audit

from ..backends.base import Backend, ErrorKind, NetworkSpec, RemoteError, SandboxInfo, SandboxSpec, SandboxState
from ..catalog.network import network_spec_for, spec_fingerprint
from ..models import MemberState, PoolClaim, PoolMember, Session
from ..sessions.observe import after_resolve
from ..sessions.provisioning import effective_template
from .keeper import kick, pool_name
from .tuning import POOLS

logger = logging.getLogger(__name__)
GONE_KINDS = frozenset({ErrorKind.NOT_FOUND, ErrorKind.GONE})
CLAIM_ATTEMPTS = 5

MISS_EMPTY = "the pool had no ready sandbox (it is refilling)"
MISS_IMAGE = "the pool's sandboxes run an older image (a skill install); it is refilling with the new one"
MISS_POLICY = "the session's network policy differs from the pool's and the backend cannot apply it live"
MISS_BROKEN = "the pooled sandbox did not answer"


def take(session: Session, backend: Backend, version: int) -> SandboxInfo | None:
    """A running sandbox from the config's pool, made the session's; None: create one."""
    if session.template_id:  # it had a sandbox (made, or taken here): only its own claim returns
        return _reclaim(session, backend, version)
    if session.binding_version or session.sandbox_id:
        return None  # not a new session: a pool serves first resolves only
    config = session.config
    if config.pool_size <= 0 and backend.warm_pools() is None:
        return None
    started = time.perf_counter()
    info, reason = _claim(session, backend, version)
    elapsed = time.perf_counter() - started
    hit = info is not None
    metrics.POOL_CLAIMS.labels(outcome="hit" if hit else "miss").inc()
    if hit:
        metrics.POOL_CLAIM_SECONDS.observe(elapsed)
    kick(config.pk)
    logger.info(
        "pool %s for session %s%s",
        "hit" if hit else "miss",
        session.key,
        f": {reason}" if reason else "",
        extra={"action": "pool_claim", "session_key": session.key, "duration_ms": round(elapsed * 1000, 1)},
    )

    def record(waited_s: float, answered: bool) -> None:
        # Written once the resolve is done, with what its caller waited (the Pools page's
        # "ready in"): one statement, outside the claim's transaction.
        metrics.POOL_RESOLVE_SECONDS.labels(outcome="hit" if hit else "miss").observe(waited_s)
        try:
            PoolClaim.objects.create(
                space_id=session.space_id,
                config_id=config.pk,
                hit=hit,
                reason=reason,
                duration_ms=elapsed * 1000,
                resolve_ms=waited_s * 1000 if answered and waited_s else None,
            )
        except DatabaseError as exc:  # a lost sample, never a failed resolve
            logger.warning("pool claim of session %s not recorded: %s", session.key, exc)

    after_resolve(record)
    return info


def _claim(session: Session, backend: Backend, version: int) -> tuple[SandboxInfo | None, str]:
    config = session.config
    template = effective_template(session.space, config).template_id
    network = network_spec_for(session.space, session)
    fingerprint = spec_fingerprint(network)
    native = backend.warm_pools()
    if native is not None:
        spec = SandboxSpec(template_id=template, network=network, metadata={})
        info = native.claim(pool_name(config, template, fingerprint), spec)
        if info is None:
            return None, MISS_EMPTY
        _adopt(session, info, template, fingerprint, "", version)
        return info, ""
    for _ in range(CLAIM_ATTEMPTS):
        # One transaction (one commit on the hot path): the claim and the adoption. A failure
        # rolls the claim back; a kill after the commit leaves it claimed, and reclaimable.
        failed: tuple[PoolMember, RemoteError] | None = None
        try:
            with transaction.atomic():
                member = _take_row(session, template)
                if member is None:
                    break  # none ready, or the session holds one already: below
                try:
                    info = _ready(backend, member)
                except RemoteError as exc:
                    failed = (member, exc)
                    transaction.set_rollback(True)
                else:
                    if member.policy_fingerprint != fingerprint and not _apply_network(
                        backend, info.sandbox_id, network
                    ):
                        transaction.set_rollback(True)  # back to ready
                        return None, MISS_POLICY
                    _adopt(session, info, template, fingerprint, member.workspace_volume, version)
                    return info, ""
        except IntegrityError:
            break  # the session took a member meanwhile (one per session): below
        assert failed is not None
        member, error = failed
        _forget(backend, member)
        if error.kind not in GONE_KINDS:
            return None, f"{MISS_BROKEN} ({error.kind})"
        # gone under the pool: the next one
    else:
        return None, MISS_EMPTY
    if PoolMember.objects.filter(session=session).exists():  # taken before and never adopted (a crash)
        info = _reclaim(session, backend, version)
        return info, "" if info is not None else MISS_BROKEN
    return None, _why_none(session, template)


def _ready(backend: Backend, member: PoolMember) -> SandboxInfo:
    """A ready member's sandbox, running. One kept running is trusted as the pool saw it
    (each refill pass checks its ready sandboxes against the engine's listing, and a sandbox
    gone since is found by the next call's own error, as for any bound sandbox); one kept
    paused is resumed."""
    if POOLS.keep_paused:
        return backend.connect(member.sandbox_id)
    return SandboxInfo(
        sandbox_id=member.sandbox_id,
        state=SandboxState.RUNNING,
        template_id=member.template_id,
        started_at=member.ready_at,
    )


def _running(backend: Backend, sandbox_id: str) -> SandboxInfo:
    """The member's sandbox, running: a state read when it waits running (a connect would
    apply its network state again, which its create did), else a connect (resume)."""
    info = backend.get(sandbox_id)
    return info if info.state == SandboxState.RUNNING else backend.connect(sandbox_id)


def _take_row(session: Session, template: str) -> PoolMember | None:
    """One ready member of the session's config and template, now the session's; None when
    none is left or the session holds a member already (one per session). One statement,
    answering the row it wrote: the row is picked (on PostgreSQL with SKIP LOCKED, so racing
    claims take different rows) and moved from ready only once."""
    ready = PoolMember.objects.filter(config_id=session.config_id, state=MemberState.READY, template_id=template)
    rows = ready.select_for_update(skip_locked=True) if connection.features.has_select_for_update_skip_locked else ready
    pick_sql, pick_params = rows.order_by("ready_at").values("pk")[:1].query.sql_with_params()
    fields = {f.name: f for f in PoolMember._meta.concrete_fields}
    quote = connection.ops.quote_name
    table = quote(PoolMember._meta.db_table)
    column = {name: quote(str(fields[name].column)) for name in ("id", "state", "session", "claimed_at")}
    returned = ", ".join(quote(str(f.column)) for f in fields.values())
    # `id = (SELECT …)`: evaluated once (an IN over a locking subquery may run it per row).
    sql = (
        f"UPDATE {table} SET {column['state']} = %s, {column['session']} = %s, {column['claimed_at']} = %s"  # noqa: S608 - quoted names; values are parameters
        f" WHERE {column['id']} = ({pick_sql}) AND {column['state']} = %s"
        f" AND NOT EXISTS (SELECT 1 FROM {table} held WHERE held.{column['session']} = %s)"
        f" RETURNING {returned}"
    )
    session_pk = fields["session"].get_db_prep_value(session.pk, connection)
    now = fields["claimed_at"].get_db_prep_value(timezone.now(), connection)
    params = [MemberState.CLAIMED, session_pk, now, *pick_params, MemberState.READY, session_pk]
    for _ in range(CLAIM_ATTEMPTS):
        taken = next(iter(PoolMember.objects.raw(sql, params)), None)
        if taken is not None:
            return taken
        # The session holds a member already, none is left, or (without SKIP LOCKED) another
        # claim took the row picked: then pick again.
        if PoolMember.objects.filter(session=session).exists() or not ready.exists():
            return None
    return None


def _why_none(session: Session, template: str) -> str:
    others = PoolMember.objects.filter(config=session.config, state=MemberState.READY).exclude(template_id=template)
    return MISS_IMAGE if others.exists() else MISS_EMPTY


def _apply_network(backend: Backend, sandbox_id: str, network: NetworkSpec) -> bool:
    egress = backend.egress()
    if egress is None or not backend.network_capabilities().live_update:
        return False
    try:
        egress.update(sandbox_id, network)
    except RemoteError:
        return False
    return True


def _reclaim(session: Session, backend: Backend, version: int) -> SandboxInfo | None:
    """The member this session claimed and never bound (module docstring), if any."""
    member = PoolMember.objects.filter(session=session, state=MemberState.CLAIMED).first()
    if member is None:
        return None
    try:
        info = _running(backend, member.sandbox_id)
    except RemoteError as exc:
        if exc.kind not in GONE_KINDS:
            raise
        PoolMember.objects.filter(pk=member.pk).delete()
        return None
    _adopt(session, info, member.template_id, member.policy_fingerprint, member.workspace_volume, version)
    return info


def _adopt(session: Session, info: SandboxInfo, template: str, fingerprint: str, volume: str, version: int) -> None:
    """The session takes the sandbox over: its row says so (as a create would) and the audit."""
    session.template_id = template
    session.traffic_token_encrypted = encrypt(info.traffic_token or "")
    session.policy_fingerprint, session.policy_applied_at = fingerprint, timezone.now()
    changes: dict[str, object] = {
        "template_id": session.template_id,
        "traffic_token_encrypted": session.traffic_token_encrypted,
        "policy_fingerprint": fingerprint,
        "policy_applied_at": session.policy_applied_at,
    }
    if volume:
        session.workspace_name, session.has_persistent_workspace = volume, True
        changes.update(workspace_name=volume, has_persistent_workspace=True)
    Session.objects.filter(pk=session.pk).update(**changes)
    record_audit(
        SYSTEM,
        AuditAction.SESSION_SANDBOX_CREATE,
        space=session.space,
        target_type="session",
        target_id=session.id,
        target_name=session.key,
        details={"sandbox_id": info.sandbox_id, "template": template, "version": version, "warm_pool": True},
    )


def _forget(backend: Backend, member: PoolMember) -> None:
    PoolMember.objects.filter(pk=member.pk).delete()
    with contextlib.suppress(RemoteError):  # labelled, without a row: the reaper deletes it
        backend.delete(member.sandbox_id)
