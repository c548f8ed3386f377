"""Approving a refused attempt: for the space (an entry in its policy, through
`console.services.do_update_network_policy`) or for one session (a `SessionGrant` that ends
with it). Both are applied live where the backend can.

What may be approved is `advice.refusal_advice`'s answer, the same the pages show (docs/
network.md, "Approvals never cut traffic"): an approval never turns a space that allows
every destination into one that allows only listed ones; a deny entry is never overridden by
an allow entry; the Docker host, other sandboxes, link-local and metadata and loopback
addresses are never reachable; and an approval that would not change what is enforced is
refused with the reason, never saved.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from console.models import AuditAction, NetworkPolicy
from console.services import Actor, ServiceError, do_update_network_policy, record_audit
from netpolicy import Advice, Offer, PolicyError, parse_destination

from ..models import EgressEvent, Session, SessionGrant
from .advice import destination_of, event_advice, refusal_advice, reserved_for
from .live import apply_soon


def do_allow_for_space(event: EgressEvent, *, actor: Actor) -> Advice:
    """Add the refused destination to the space's policy (one audit row, applied live).

    The policy is read, advised on and written under its row lock (the one the policy
    service takes): an edit saved meanwhile is extended, never overwritten with stale lists."""
    reserved = reserved_for(event.space)  # asks the backends: before the lock is taken
    with transaction.atomic():
        NetworkPolicy.objects.get_or_create(space=event.space)
        policy = NetworkPolicy.objects.select_for_update().get(space=event.space)
        advice = event_advice(event, reserved=reserved)
        if not advice.can_approve or advice.entry is None:
            raise ServiceError(advice.text)
        entry = str(advice.entry)
        allow_out, allow_private = list(policy.allow_out), list(policy.allow_private)
        (allow_out if advice.offer == Offer.ALLOW else allow_private).append(entry)
        do_update_network_policy(
            event.space,
            allow_internet_access=policy.allow_internet_access,
            allow_out=allow_out,
            deny_out=list(policy.deny_out),
            l7_rules=list(policy.l7_rules),
            allow_public_traffic=policy.allow_public_traffic,
            allow_private=allow_private,
            actor=actor,
            audit_action=AuditAction.EGRESS_ALLOW_SPACE,
            audit_details={"entry": entry, "kind": advice.offer.value, "refusal": str(event.pk)},
        )
    return advice


def do_allow_for_session(event: EgressEvent, *, actor: Actor) -> SessionGrant:
    """A grant for the refused destination that ends with the event's session (applied live)."""
    if event.session_id is None:
        raise ServiceError("This refusal is no session's (a skill build's): allow it for the space instead.")
    session = Session.objects.select_related("space", "config__backend").get(pk=event.session_id)
    return do_grant_session(session, event.destination, actor=actor, refusal=str(event.pk), rule=event.rule)


def do_grant_session(
    session: Session, destination: str, *, actor: Actor, refusal: str | None = None, rule: str = ""
) -> SessionGrant:
    try:
        target = parse_destination(destination)
    except PolicyError as exc:
        raise ServiceError(str(exc), field_errors={"destination": [str(exc)]}) from None
    advice = refusal_advice(session.space, target, rule=rule, session=session)
    if not advice.can_approve or advice.entry is None:
        raise ServiceError(advice.text)
    entry = str(advice.entry)
    kind = SessionGrant.Kind.ALLOW if advice.offer == Offer.ALLOW else SessionGrant.Kind.PRIVATE
    try:
        with transaction.atomic():
            grant = SessionGrant.objects.create(session=session, kind=kind, entry=entry, created_by=actor.name[:150])
            record_audit(
                actor,
                AuditAction.EGRESS_ALLOW_SESSION,
                space=session.space,
                target_type="session",
                target_id=session.id,
                target_name=session.key,
                details={"entry": entry, "kind": kind, "refusal": refusal},
            )
            transaction.on_commit(lambda: apply_soon(session.space, actor, session))
    except IntegrityError:
        raise ServiceError(f"This session already has a grant for {entry}.") from None
    return grant


def do_revoke_grant(grant: SessionGrant, *, actor: Actor) -> None:
    session = grant.session
    with transaction.atomic():
        record_audit(
            actor,
            AuditAction.EGRESS_REVOKE_SESSION,
            space=session.space,
            target_type="session",
            target_id=session.id,
            target_name=session.key,
            details={"entry": grant.entry, "kind": grant.kind},
        )
        grant.delete()
        transaction.on_commit(lambda: apply_soon(session.space, actor, session))


def build_proposals(events: list[EgressEvent]) -> list[str]:
    """The allow entries that would have let these (a skill build's) refusals through."""
    entries: list[str] = []
    for event in events:
        target = destination_of(event.destination)
        if target is not None and str(target.entry) not in entries:
            entries.append(str(target.entry))
    return entries
