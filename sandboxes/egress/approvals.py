"""Approving a refused attempt: for the space (an entry in its policy, through
`console.services.do_update_network_policy`) or for one session (a `SessionGrant` that ends
with it). Both are applied live where the backend can.

The rule (docs/network.md, "Approvals never cut traffic"): an approval never turns
a space that allows every destination into one that allows only listed ones. So:
- the space allows only listed destinations: the destination (a name, or the address as a
  /32 or /128) joins the allow list;
- the space allows everything: a refusal by the always-denied private ranges adds a
  private exception (a CIDR also allowed); anything else cannot be approved by adding an
  allow entry (link-local and metadata stay denied);
- a refusal by a deny entry is never approved by an allow entry (deny entries win): the row
  offers to edit the deny list instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from console.models import NetworkPolicy
from console.services import Actor, ServiceError, do_update_network_policy, record_audit

from ..backends.base import NetworkSpec
from ..catalog.network import network_spec_for, policy_spec
from ..models import EgressEvent, Session, SessionGrant
from .explain import Target, decide, parse_target
from .live import apply_soon


def target_of(event: EgressEvent) -> Target | None:
    """The destination of a refusal as something an entry can name (port and path dropped)."""
    try:
        return parse_target(event.destination)
    except ValueError:
        return None


@dataclass(frozen=True)
class Proposal:
    """What approving a row would do, or why it cannot be approved by an allow entry."""

    action: str  # "allow" | "private" | "edit_deny" | "none"
    entry: str
    text: str

    @property
    def can_approve(self) -> bool:
        return self.action in ("allow", "private")


def propose(spec: NetworkSpec, target: Target | None) -> Proposal:
    """What approving a refusal of `target` under the space's `spec` would add (see above)."""
    if target is None:
        return Proposal("none", "", "The destination cannot be named by an allow entry.")
    decision = decide(spec, target)
    if decision.allowed:
        return Proposal("none", target.entry, f"Allowed by the current policy already ({decision.rule}).")
    if not spec.allow_internet_access:
        return Proposal("none", target.entry, "Outbound access is off: turn it on on the policy page first.")
    if decision.rule.startswith("deny entry"):
        return Proposal("edit_deny", target.entry, f"Refused by {decision.rule}: edit the deny list to let it through.")
    if spec.allow_out:
        return Proposal("allow", target.entry, f"Add {target.entry} to the allow list.")
    if decision.rule.startswith("private range") and target.address is not None:
        return Proposal(
            "private",
            target.entry,
            f"Add {target.entry} to the private addresses also allowed (the space keeps allowing everything else).",
        )
    return Proposal("none", target.entry, f"Cannot be approved: {decision.rule}.")


def do_allow_for_space(event: EgressEvent, *, actor: Actor) -> Proposal:
    """Add the refused destination to the space's policy (one audit row, applied live)."""
    policy = NetworkPolicy.objects.get_or_create(space=event.space)[0]
    proposal = propose(policy_spec(policy), target_of(event))
    if not proposal.can_approve:
        raise ServiceError(proposal.text)
    allow_out, allow_private = list(policy.allow_out), list(policy.allow_private)
    (allow_out if proposal.action == "allow" else allow_private).append(proposal.entry)
    do_update_network_policy(
        event.space,
        allow_internet_access=policy.allow_internet_access,
        allow_out=allow_out,
        deny_out=list(policy.deny_out),
        l7_rules=list(policy.l7_rules),
        allow_public_traffic=policy.allow_public_traffic,
        allow_private=allow_private,
        actor=actor,
        audit_action="egress.allow_space",
        audit_details={"entry": proposal.entry, "kind": proposal.action, "refusal": str(event.pk)},
    )
    return proposal


def do_allow_for_session(event: EgressEvent, *, actor: Actor) -> SessionGrant:
    """A grant for the refused destination that ends with the event's session (applied live)."""
    if event.session_id is None:
        raise ServiceError("This refusal is no session's (a skill build's): allow it for the space instead.")
    session = Session.objects.select_related("space", "config__backend").get(pk=event.session_id)
    return do_grant_session(session, event.destination, actor=actor, refusal=str(event.pk))


def do_grant_session(session: Session, destination: str, *, actor: Actor, refusal: str | None = None) -> SessionGrant:
    try:
        target = parse_target(destination)
    except ValueError as exc:
        raise ServiceError(str(exc), field_errors={"destination": [str(exc)]}) from None
    proposal = propose(network_spec_for(session.space), target)
    if not proposal.can_approve:
        raise ServiceError(proposal.text)
    kind = SessionGrant.Kind.ALLOW if proposal.action == "allow" else SessionGrant.Kind.PRIVATE
    try:
        with transaction.atomic():
            grant = SessionGrant.objects.create(
                session=session, kind=kind, entry=proposal.entry, created_by=actor.name[:150]
            )
            record_audit(
                actor,
                "egress.allow_session",
                space=session.space,
                target_type="session",
                target_id=session.id,
                details={"entry": proposal.entry, "kind": kind, "refusal": refusal},
            )
            transaction.on_commit(lambda: apply_soon(session.space, actor, session))
    except IntegrityError:
        raise ServiceError(f"This session already has a grant for {proposal.entry}.") from None
    return grant


def do_revoke_grant(grant: SessionGrant, *, actor: Actor) -> None:
    session = grant.session
    with transaction.atomic():
        record_audit(
            actor,
            "egress.revoke_session",
            space=session.space,
            target_type="session",
            target_id=session.id,
            details={"entry": grant.entry, "kind": grant.kind},
        )
        grant.delete()
        transaction.on_commit(lambda: apply_soon(session.space, actor, session))


def build_proposals(events: list[EgressEvent]) -> list[str]:
    """The allow entries that would have let these (a skill build's) refusals through."""
    entries: list[str] = []
    for event in events:
        target = target_of(event)
        if target is not None and target.entry and target.entry not in entries:
            entries.append(target.entry)
    return entries
