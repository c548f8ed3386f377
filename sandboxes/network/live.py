"""A changed network spec applied to running sandboxes, and which sessions keep older rules.

After a policy save (any caller of `console.services.do_update_network_policy`, through the
`network_policy_changed` signal), an approval or a session grant, every session of the space
with a bound sandbox whose backend has `egress()` and `NetworkCapabilities.live_update` gets
its spec (space policy + its grants) through `EgressCapability.update`, and its
`policy_fingerprint` is set. Sessions on backends fixed at create keep their old
fingerprint: the policy page lists them until they are rebuilt.

With Celery (`JOB_RUNNER=celery`) the pass runs as a task once the change is committed;
in-process it runs at commit, bounded by `network.apply_budget_s` (what is left is listed as
keeping older rules). The periodic `network-catch-up` pass (`catch_up`) tries again the
sessions whose spec was last applied before their space's policy was saved: a pass that ran
out of its budget or failed never leaves a sandbox on older rules (outbound on after it was
turned off) until the next change.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import F, Q
from django.utils import timezone

from console.models import AuditAction, Space
from console.periodic import periodic
from console.services import SYSTEM, Actor, record_audit

from ..backends.base import NetworkSpec, RemoteError
from ..catalog.bridge import get_backend
from ..catalog.network import merge_grants, network_spec_for, spec_fingerprint, unsupported_policy_switches
from ..models import Session, SessionState
from .tuning import NETWORK

logger = logging.getLogger(__name__)


@dataclass
class ApplyReport:
    applied: list[str] = field(default_factory=list)  # session keys
    fixed_at_create: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # the backend cannot honour the new spec
    failed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, list[str]]:
        return {k: v for k, v in self.__dict__.items() if v}


def bound_sessions(space: Space) -> Any:
    return (
        Session.objects.filter(space=space)
        .exclude(sandbox_id="")
        .exclude(state=SessionState.GONE)
        .select_related("config__backend", "space")
        .prefetch_related("egress_grants")
    )


def session_spec(space_spec: NetworkSpec, session: Session) -> NetworkSpec:
    """The session's spec from its space's (computed once per pass) and its prefetched grants."""
    return merge_grants(space_spec, sorted(session.egress_grants.all(), key=lambda grant: grant.created))


def apply_to_session(session: Session, report: ApplyReport, space_spec: NetworkSpec | None = None) -> None:
    spec = network_spec_for(session.space, session) if space_spec is None else session_spec(space_spec, session)
    fingerprint = spec_fingerprint(spec)
    if fingerprint == session.policy_fingerprint:
        report.unchanged.append(session.key)
        return
    try:
        backend = get_backend(session.config)
        egress = backend.egress()
        caps = backend.network_capabilities()
        if egress is None or not caps.live_update:
            report.fixed_at_create.append(session.key)
            return
        if unsupported_policy_switches(spec, caps):
            report.refused.append(session.key)
            return
        egress.update(session.sandbox_id, spec)
    except RemoteError as exc:
        logger.warning("live policy update of session %s failed: %s", session.key, exc)
        report.failed.append(session.key)
        return
    now = timezone.now()
    Session.objects.filter(pk=session.pk).update(policy_fingerprint=fingerprint, policy_applied_at=now)
    session.policy_fingerprint, session.policy_applied_at = fingerprint, now
    report.applied.append(session.key)


def apply_space_policy(
    space: Space, *, actor: Actor = SYSTEM, sessions: list[Session] | None = None, budget_s: float | None = None
) -> ApplyReport:
    """Apply the space's current spec to its (or the given) bound sessions; one audit row.
    Bounded by `budget_s` (default: network.apply_budget_s, a request's)."""
    report = ApplyReport()
    deadline = time.monotonic() + (NETWORK.apply_budget_s if budget_s is None else budget_s)
    space_spec = network_spec_for(space) if sessions is None else None
    for session in sessions if sessions is not None else bound_sessions(space):
        if time.monotonic() > deadline:
            report.failed.append(session.key)
            continue
        apply_to_session(session, report, space_spec)
    if report.applied or report.failed or report.refused:
        record_audit(
            actor,
            AuditAction.NETWORK_POLICY_APPLY,
            space=space,
            target_type="network_policy",
            target_id=space.id,
            target_name=space.name,
            details=report.as_json(),
        )
    return report


def apply_soon(space: Space, actor: Actor = SYSTEM, session: Session | None = None) -> None:
    """Called once a change is committed: a Celery task, or now (in-process runner)."""
    if settings.JOB_RUNNER == "celery":
        from celery import current_app

        args = [str(space.pk), str(session.pk) if session is not None else ""]
        current_app.send_task("sandboxes.apply_network_policy", args=args)
        return
    apply_space_policy(space, actor=actor, sessions=[session] if session is not None else None)


# Sessions one catch-up pass looks at, the longest behind first, and the time it may spend
# on them (it runs in the background, not in a request); the next pass goes on.
CATCH_UP_BATCH = 500
CATCH_UP_BUDGET_S = 30.0


def behind_sessions() -> Any:
    """Bound sessions whose spec was applied before their space's policy was last saved."""
    applied_before = Q(policy_applied_at__isnull=True) | Q(policy_applied_at__lt=F("space__network_policy__updated"))
    return (
        Session.objects.exclude(sandbox_id="")
        .exclude(state=SessionState.GONE)
        .filter(applied_before, space__network_policy__isnull=False)
        .select_related("config__backend", "space")
        .prefetch_related("egress_grants")
        .order_by(F("policy_applied_at").asc(nulls_first=True))
    )


@periodic("network-catch-up", task="sandboxes.network_catch_up", every=60)
def catch_up() -> list[ApplyReport]:
    """The space's spec again on the sessions a live pass missed (module docstring); those
    already on it, or on a backend fixed at create, are marked as seen so no pass takes them
    again until the next change."""
    by_space: dict[Any, list[Session]] = {}
    for session in behind_sessions()[:CATCH_UP_BATCH]:
        by_space.setdefault(session.space_id, []).append(session)
    reports = []
    deadline = time.monotonic() + CATCH_UP_BUDGET_S
    for sessions in by_space.values():
        left = max(0.0, deadline - time.monotonic())
        report = apply_space_policy(sessions[0].space, sessions=sessions, budget_s=left)
        seen = set(report.unchanged) | set(report.fixed_at_create) | set(report.refused)
        Session.objects.filter(pk__in=[s.pk for s in sessions if s.key in seen]).update(
            policy_applied_at=timezone.now()
        )
        reports.append(report)
    return reports


def on_policy_changed(sender: Any, space: Space, actor: Actor = SYSTEM, **kwargs: Any) -> None:
    try:
        apply_soon(space, actor)
    except Exception:  # the policy is saved; a failed pass shows as sessions keeping old rules
        logger.exception("applying the network policy of space %s failed", space.pk)


@dataclass(frozen=True)
class OldRules:
    session: Session
    reason: str
    can_rebuild: bool


def sessions_keeping_old_rules(space: Space) -> list[OldRules]:
    """Bound sessions whose sandbox runs an older spec than the space's current one."""
    found = []
    space_spec = network_spec_for(space)
    for session in bound_sessions(space):
        if spec_fingerprint(session_spec(space_spec, session)) == session.policy_fingerprint:
            continue
        label = session.config.backend.name
        try:
            backend = get_backend(session.config)
            label = backend.label
            live = backend.egress() is not None and backend.network_capabilities().live_update
        except RemoteError:
            live = False
        reason = (
            "the live update did not reach it yet (or failed): the next change retries, a rebuild applies it"
            if live
            else f"{label} fixes the network at create: rebuild to apply the new rules"
        )
        found.append(OldRules(session, reason, can_rebuild=True))
    return found
