"""Keeping warm pools filled: `refill(config)` makes a config's pool match its declared size,
its space's current skill image and network policy, within the space's quota.

One refill per config at a time, across processes (a store lock, never waited for). In order:
members left half-made by a refill that died are forgotten (their sandboxes, labelled
`META_POOL`, go with the reaper); ready sandboxes made from another template (a skill
install) or under another network spec (a policy change) are drained, and so is what exceeds
the size or the space's quota; then new ones are made, each recorded as a member row *before* its create, so a
sandbox is never made that no row or label explains. A member whose row went meanwhile (a
teardown, a drain) has its sandbox deleted by the refill that made it.

A config (or its space) deleted before or while its pool refills ends the refill with the
reason in `skipped` (`PoolGone`): no row is written for it (a member's INSERT refused by the
vanished key is the sign), a sandbox made meanwhile is deleted as above, and a labelled one
that slips past goes with the teardown's label sweep or the per-installation clean-up. A pool
the backend keeps itself is looked at again once ensured: when the config went, or a teardown
runs (whose drain may have come before the ensure), the refill drains it, or nothing would.

`kick(config)` starts a refill in the background after the transaction commits (a Celery task
when JOB_RUNNER is celery, else a thread); `refill_all` is the periodic pass.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError, close_old_connections, connection, transaction
from django.utils import timezone

from console.models import Space
from console.periodic import periodic

from ..backends.base import (
    META_CONFIG,
    META_INSTALLATION,
    META_POOL,
    META_SPACE,
    Backend,
    ListQuery,
    RemoteError,
    SandboxSpec,
    SandboxState,
)
from ..backends.capabilities import WarmPoolCapability
from ..catalog.bridge import get_backend, sandbox_resources
from ..catalog.network import network_spec_for, spec_fingerprint, unsupported_policy_switches
from ..models import MemberState, PoolClaim, PoolMember, SandboxConfig, is_native_pool_of, native_pool_name
from ..sessions.limits import pool_overflow, pool_room
from ..sessions.lookup import BeingDeleted, refuse_while_deleted
from ..sessions.provisioning import WORKSPACE_LAYOUT, effective_template, ready_workspace
from ..sessions.store import LockTimeout, SessionStoreUnavailable, lifecycle_lock
from ..sessions.store_select import get_store
from .tuning import POOLS

logger = logging.getLogger(__name__)
HOLDER = "pool-refill"
LOCK_TTL_MS = 60_000


def pool_lock_key(config: SandboxConfig) -> str:
    return f"console:lock:pool:{config.pk}"


def pool_name(config: SandboxConfig, template_id: str, fingerprint: str) -> str:
    """A native pool's name: one per config, template and network spec."""
    return native_pool_name(config.pk, template_id, fingerprint)


def member_volume(member_id: uuid.UUID) -> str:
    """A pooled sandbox's persistent /workspace, handed to the session that claims it."""
    return f"sandbox-console-ws-{member_id}"


@dataclass
class Wanted:
    """What a config's pool should hold now."""

    size: int
    template_id: str
    fingerprint: str
    spec: SandboxSpec  # without the member's own label and volume
    why_smaller: str = ""  # the size was cut (quota, platform limit, a policy the backend cannot keep)


class PoolGone(Exception):
    """The config of the pool being refilled, or its space, was deleted: the refill ends."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def refuse_if_gone(config: SandboxConfig) -> None:
    """Raise PoolGone when the config's row (or its whole space) is no more."""
    if SandboxConfig.objects.filter(pk=config.pk).exists():
        return
    if Space.objects.filter(pk=config.space_id).exists():
        raise PoolGone("the pool's config was deleted")
    raise PoolGone("the pool's space was deleted")


@dataclass
class RefillReport:
    config: str
    made: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: str = ""


def wanted(config: SandboxConfig, backend: Backend) -> Wanted:
    space = config.space
    template = effective_template(space, config).template_id
    network = network_spec_for(space)
    spec = SandboxSpec(
        template_id=template,
        network=network,
        metadata={
            META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID,
            META_SPACE: str(space.pk),
            META_CONFIG: str(config.pk),
        },
        resources=sandbox_resources(config),
        timeout_s=config.idle_timeout_s,
        workspace_layout=WORKSPACE_LAYOUT,
    )
    size, why = min(config.pool_size, config.backend.max_pool_size), ""
    if size < config.pool_size:
        why = f"the backend allows pools of {config.backend.max_pool_size}"
    if size and unsupported_policy_switches(network, backend.network_capabilities()):
        size, why = 0, "the backend cannot enforce the space's network policy"
    return Wanted(size=size, template_id=template, fingerprint=spec_fingerprint(network), spec=spec, why_smaller=why)


def refill(config: SandboxConfig) -> RefillReport:
    """Bring one config's pool to what it should hold (module docstring)."""
    report = RefillReport(config=f"{config.space.name} / {config.name}")
    try:
        with lifecycle_lock(get_store(), pool_lock_key(config), ttl_ms=LOCK_TTL_MS, wait_s=0, holder=HOLDER):
            _refill_locked(config, report)
    except LockTimeout:
        report.skipped = "another refill of this pool is running"
    except PoolGone as exc:
        report.skipped = exc.reason
    except SessionStoreUnavailable as exc:
        report.skipped = exc.message
    return report


def _refill_locked(config: SandboxConfig, report: RefillReport) -> None:
    refuse_if_gone(config)  # the config was loaded before its rows went (a teardown, a refill in the background)
    backend = get_backend(config)
    members = PoolMember.objects.filter(config=config)
    cutoff = timezone.now() - timedelta(seconds=POOLS.refill_timeout_s)
    members.filter(state=MemberState.REFILLING, created__lt=cutoff).delete()  # the reaper takes their sandboxes
    want = wanted(config, backend)
    try:
        refuse_while_deleted(config.space, config)
    except BeingDeleted as exc:
        want.size, report.skipped = 0, str(exc)
    native = backend.warm_pools()
    if native is not None:
        _refill_native(native, config, want, report)
        return
    ready = _alive(backend, config, list(members.filter(state=MemberState.READY).order_by("ready_at")), report)
    outdated = [m for m in ready if m.template_id != want.template_id or m.policy_fingerprint != want.fingerprint]
    current = [m for m in ready if m not in outdated]
    for member in outdated + current[want.size :]:
        drain_member(backend, member, report)
    # Past the space's quota (lowered, or live sessions grew): the newest ready ones go.
    for member in current[: want.size][::-1][: pool_overflow(config.space)]:
        drain_member(backend, member, report)
    have = min(len(current), want.size) + members.filter(state=MemberState.REFILLING).count()
    missing = min(want.size - have, pool_room(config.space))
    if missing <= 0:
        return
    if connection.in_atomic_block or POOLS.refill_parallel <= 1:
        # Inside a transaction other threads would not see its rows: one at a time, here.
        outcomes = [_make_reporting(config, backend, want) for _ in range(missing)]
    else:
        with ThreadPoolExecutor(max_workers=POOLS.refill_parallel, thread_name_prefix="pool-refill") as workers:
            outcomes = list(workers.map(lambda _: _make_in_thread(config, backend, want), range(missing)))
    for outcome in outcomes:
        if outcome.startswith("!"):
            report.errors.append(outcome[1:])
        else:
            report.made.append(outcome)


def _refill_native(native: WarmPoolCapability, config: SandboxConfig, want: Wanted, report: RefillReport) -> None:
    """A backend that keeps the pool itself: the config's other pools (an older skill image or
    network spec) drained, the current one kept at its size."""
    current = pool_name(config, want.template_id, want.fingerprint)
    try:
        for name in native.pools():
            if name != current and is_native_pool_of(name, config.pk):
                native.drain(name)
                report.drained.append(name)
        native.ensure(current, want.spec, want.size)
        if want.size and (gone := _going(config)):
            native.drain(current)  # a teardown drained the config's pools before this ensure made it again
            raise PoolGone(gone)
    except RemoteError as exc:
        logger.warning("pool refill of %s failed: %s", config.name, exc.message, extra={"config_id": str(config.pk)})
        report.errors.append(f"{exc.kind}: {exc.message}")


def _going(config: SandboxConfig) -> str:
    """Why the config's pool must not be kept (its row or space went, or a teardown of either
    runs: it may have drained the backend's pools already), or ''."""
    try:
        refuse_if_gone(config)
        refuse_while_deleted(config.space, config)
    except PoolGone as exc:
        return exc.reason
    except BeingDeleted as exc:
        return str(exc)
    return ""


def _alive(backend: Backend, config: SandboxConfig, ready: list[PoolMember], report: RefillReport) -> list[PoolMember]:
    """The ready members whose sandboxes the engine lists as they wait (running, or paused
    when pools keep theirs paused); the others are forgotten, so a claim may trust the rest."""
    if not ready:
        return ready
    waiting = SandboxState.PAUSED if POOLS.keep_paused else SandboxState.RUNNING
    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_CONFIG: str(config.pk)})
    try:
        listed = {i.sandbox_id: i.state for i in backend.iter_sandboxes(query) if i.metadata.get(META_POOL)}
    except RemoteError as exc:
        report.errors.append(f"listing the pool: {exc.message}")
        return ready
    alive = []
    for member in ready:
        if listed.get(member.sandbox_id) in (waiting, SandboxState.RUNNING):
            alive.append(member)
        elif PoolMember.objects.filter(pk=member.pk, state=MemberState.READY).delete()[0]:
            _forget(backend, member.pk, member.sandbox_id, member.workspace_volume)
            report.drained.append(member.sandbox_id)
    return alive


def _make_in_thread(config: SandboxConfig, backend: Backend, want: Wanted) -> str:
    try:
        return _make_reporting(config, backend, want)
    finally:
        connection.close()  # this thread's own connection


def _make_reporting(config: SandboxConfig, backend: Backend, want: Wanted) -> str:
    """A new member's sandbox id, or "!" and why none was made."""
    try:
        return make_member(config, backend, want)
    except RemoteError as exc:
        logger.warning("pool refill of %s failed: %s", config.name, exc.message, extra={"config_id": str(config.pk)})
        return f"!{exc.kind}: {exc.message}"


def make_member(config: SandboxConfig, backend: Backend, want: Wanted) -> str:
    """One new ready sandbox: its row first, then the sandbox (labelled with the row), its
    workspace laid out, idled if pools keep theirs paused, and the row marked ready."""
    persistent = config.persistent_workspace and backend.volumes() is not None
    try:
        member = PoolMember.objects.create(
            space=config.space, config=config, template_id=want.template_id, policy_fingerprint=want.fingerprint
        )
    except IntegrityError:  # autocommit, as refills run: the key a teardown just deleted is refused here
        refuse_if_gone(config)
        raise
    volume = member_volume(member.pk) if persistent else ""
    if volume:
        PoolMember.objects.filter(pk=member.pk).update(workspace_volume=volume)
    spec = SandboxSpec(
        template_id=want.spec.template_id,
        network=want.spec.network,
        metadata={**want.spec.metadata, META_POOL: str(member.pk)},
        resources=want.spec.resources,
        timeout_s=want.spec.timeout_s,
        workspace_volume=volume or None,
        workspace_layout=want.spec.workspace_layout,
    )
    try:
        info = backend.create(spec)
    except RemoteError:
        PoolMember.objects.filter(pk=member.pk).delete()
        _delete_volume(backend, volume)
        raise
    try:
        ready_workspace(backend, info)
        if POOLS.keep_paused:
            backend.pause(info.sandbox_id)
    except RemoteError:
        _forget(backend, member.pk, info.sandbox_id, volume)
        raise
    marked = PoolMember.objects.filter(pk=member.pk, state=MemberState.REFILLING).update(
        state=MemberState.READY, sandbox_id=info.sandbox_id, ready_at=timezone.now()
    )
    if not marked:  # drained or torn down meanwhile
        _forget(backend, member.pk, info.sandbox_id, volume)
        refuse_if_gone(config)
        return "!the pool was drained while a sandbox was made"
    return info.sandbox_id


def drain_member(backend: Backend, member: PoolMember, report: RefillReport | None = None) -> None:
    """Delete a ready member: its row first (so nobody claims it), then its sandbox and volume."""
    if not PoolMember.objects.filter(pk=member.pk, state=MemberState.READY).delete()[0]:
        return  # claimed meanwhile
    try:
        backend.delete(member.sandbox_id)
        _delete_volume(backend, member.workspace_volume)
    except RemoteError as exc:  # labelled, without a row: the reaper deletes it
        if report is not None:
            report.errors.append(f"{member.sandbox_id}: {exc.message}")
        return
    if report is not None:
        report.drained.append(member.sandbox_id)


def _forget(backend: Backend, member_id: uuid.UUID, sandbox_id: str, volume: str) -> None:
    PoolMember.objects.filter(pk=member_id).delete()
    with contextlib.suppress(RemoteError):  # labelled, without a row: the reaper deletes it
        backend.delete(sandbox_id)
        _delete_volume(backend, volume)


def _delete_volume(backend: Backend, volume: str) -> None:
    volumes = backend.volumes()
    if volume and volumes is not None:
        volumes.delete(volume)


# --- In the background ------------------------------------------------------------------------

_running: set[str] = set()  # configs this process refills now (state, not a cache)
_running_lock = threading.Lock()


def kick(config_id: object) -> None:
    """Refill a config's pool in the background once the current transaction commits."""
    if POOLS.refill_on_change:
        transaction.on_commit(lambda: _start(str(config_id)))


def _start(config_id: str) -> None:
    if settings.JOB_RUNNER == "celery":
        refill_config_task.delay(config_id)
        return
    with _running_lock:
        if config_id in _running:
            return
        _running.add(config_id)
    threading.Thread(target=_refill_in_thread, args=(config_id,), name=f"pool-{config_id[:8]}", daemon=True).start()


def _refill_in_thread(config_id: str) -> None:
    try:
        close_old_connections()
        refill_config(config_id)
    finally:
        connection.close()
        with _running_lock:
            _running.discard(config_id)


@shared_task(name="sandboxes.pool_refill_config", ignore_result=True)
def refill_config_task(config_id: str) -> None:
    refill_config(config_id)


def refill_config(config_id: str) -> RefillReport | None:
    config = SandboxConfig.objects.select_related("space", "backend").filter(pk=config_id).first()
    if config is None:
        return None
    report = refill(config)
    if report.made or report.drained or report.errors:
        logger.info(
            "pool of %s: made %d, drained %d%s",
            report.config,
            len(report.made),
            len(report.drained),
            f", errors: {'; '.join(report.errors[:3])}" if report.errors else "",
            extra={"action": "pool_refill", "config_id": config_id},
        )
    return report


def pooled_configs() -> Any:
    """Configs with a pool, or with pool members left to drain."""
    from django.db.models import Q

    return (
        SandboxConfig.objects.filter(Q(pool_size__gt=0) | Q(pool_members__state=MemberState.READY))
        .distinct()
        .select_related("space", "backend")
    )


def refill_all() -> list[RefillReport]:
    """The periodic pass: every pool topped up or drained; old claim records pruned."""
    PoolClaim.objects.filter(at__lt=timezone.now() - timedelta(seconds=POOLS.claims_retention_s)).delete()
    reports = []
    for config in pooled_configs():
        started = time.monotonic()
        reports.append(refill(config))
        logger.debug("pool refill of %s took %.2f s", config.name, time.monotonic() - started)
    return reports


@periodic("pool-refill", task="sandboxes.pool_refill", every=lambda: POOLS.refill_interval_s)
def refill_pass() -> None:
    refill_all()
