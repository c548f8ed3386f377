"""What a refusal offers an admin: allow the destination (for the space or one session), a
private exception, editing the deny list or the HTTP rules, or nothing, with the reason.

The rules: an approval never turns a space that allows every destination into one that allows
only listed ones (one allow entry would cut everything else off), so with no allow list only a
private address can be approved (as a private exception); a deny entry is never overridden
(deny entries win: edit the deny list instead); the never-reachable classes (the host, other
sandboxes, link-local and metadata, loopback) cannot be opened at all. Anything offered is
checked by deciding again with it: an approval that would not change the decision is not
offered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from .addresses import AddressClass, Kind
from .decide import Decision, Destination, Rule, decide, parse_words
from .entries import Cidr, Entry
from .policy import Policy


class Offer(StrEnum):
    ALLOW = "allow"  # the entry joins the allow list (or a session's grants)
    PRIVATE = "private"  # the address joins the private exceptions
    EDIT_DENY = "edit_deny"  # refused by a deny entry: only editing the deny list changes it
    EDIT_RULES = "edit_rules"  # refused by an HTTP rule
    NONE = "none"


@dataclass(frozen=True)
class Advice:
    offer: Offer
    text: str
    entry: Entry | None = None

    @property
    def can_approve(self) -> bool:
        return self.offer in (Offer.ALLOW, Offer.PRIVATE)


NEVER_WORDS = {
    Kind.HOST.value: "the Docker host and other sandboxes are never reachable",
    Kind.SANDBOX.value: "the Docker host and other sandboxes are never reachable",
    Kind.LINK_LOCAL.value: "link-local and metadata addresses are never reachable",
    Kind.LOOPBACK.value: "loopback addresses never leave the sandbox",
}


def with_entry(policy: Policy, offer: Offer, entry: Entry) -> Policy:
    """The policy with an approved entry added (the approval's effect)."""
    if offer == Offer.PRIVATE:
        assert isinstance(entry, Cidr)
        return dataclasses.replace(policy, allow_private=(*policy.allow_private, entry))
    return dataclasses.replace(policy, allow_out=(*policy.allow_out, entry))


def advise(
    policy: Policy,
    destination: Destination | None,
    *,
    refused_with: str = "",
    reserved: Sequence[AddressClass] = (),
) -> Advice:
    """What approving a refusal of `destination` (logged with the words `refused_with`, when
    read from a log) under `policy` would do, or why nothing can."""
    if destination is None:
        return Advice(Offer.NONE, "The destination cannot be named by an allow entry.")
    logged, detail = parse_words(refused_with) if refused_with else (Rule.UNKNOWN, "")
    if logged == Rule.ALWAYS_DENIED and detail in NEVER_WORDS:
        return Advice(Offer.NONE, f"Cannot be approved: {NEVER_WORDS[detail]}.")
    if logged == Rule.NO_UPSTREAM:
        return Advice(Offer.NONE, "Cannot be approved: no resolver upstream is set, so no name resolves; set it first.")
    if logged == Rule.HOST_MISMATCH:
        return Advice(Offer.NONE, "Cannot be approved: the name sent does not resolve to the address connected to.")
    now = decide(policy, destination, reserved=reserved)
    if now.allowed and logged == Rule.DENY_ENTRY and _still_denied(policy, detail):
        # Refused as an address the denied name resolved to, met under another name or raw:
        # deciding by the destination alone cannot see that, the logged entry can.
        return Advice(
            Offer.EDIT_DENY,
            f"Refused by deny entry {detail}: the address is one that name resolves to; edit the deny list "
            "to let it through.",
        )
    if now.allowed:
        return Advice(Offer.NONE, f"Allowed by the current policy already ({now.sentence}).")
    proposal = _proposal(policy, destination, now)
    if not proposal.can_approve or proposal.entry is None:
        return proposal
    after = decide(with_entry(policy, proposal.offer, proposal.entry), destination, reserved=reserved)
    if not after.allowed:
        return Advice(
            Offer.NONE, f"Cannot be approved: adding {proposal.entry} would change nothing ({after.sentence})."
        )
    return proposal


def _proposal(policy: Policy, destination: Destination, now: Decision) -> Advice:
    entry = destination.entry
    if now.rule == Rule.OUTBOUND_OFF:
        return Advice(Offer.NONE, "Outbound access is off: turn it on on the policy page first.")
    if now.rule == Rule.DENY_ENTRY:
        return Advice(Offer.EDIT_DENY, f"Refused by {now.words}: edit the deny list to let it through.")
    if now.rule in (Rule.HTTP_RULE, Rule.HTTP_UNMATCHED, Rule.TLS_UNMATCHED):
        return Advice(Offer.EDIT_RULES, f"Refused by {now.words}: edit the HTTP rules to let it through.")
    if now.rule == Rule.ALWAYS_DENIED and now.detail != Kind.PRIVATE.value:
        return Advice(Offer.NONE, f"Cannot be approved: {NEVER_WORDS.get(now.detail, now.sentence)}.")
    if policy.allow_only:
        return Advice(Offer.ALLOW, f"Add {entry} to the allow list.", entry)
    if now.rule == Rule.ALWAYS_DENIED and isinstance(entry, Cidr):
        return Advice(
            Offer.PRIVATE,
            f"Add {entry} to the private addresses also allowed (the space keeps allowing everything else).",
            entry,
        )
    return Advice(Offer.NONE, f"Cannot be approved: {now.sentence}.")


def _still_denied(policy: Policy, entry_text: str) -> bool:
    """Whether the deny entry a refusal was logged with is still in the policy's deny list."""
    return any(str(entry) == entry_text.strip() for entry in policy.deny_out)
