"""netpolicy.advise: what a refusal offers (allow, a private exception, editing the deny list
or the HTTP rules, or nothing with the reason), checked by deciding again with the entry, so
nothing is offered that enforcement would not follow. Table-driven; pure."""

from __future__ import annotations

import ipaddress

import pytest

from netpolicy import Kind, Offer, Policy, advise, decide, parse_destination, reserved_class, with_entry

RESERVED = (
    reserved_class(ipaddress.ip_network("172.17.0.1/32"), Kind.HOST, "the Docker host"),
    reserved_class(ipaddress.ip_network("172.18.0.1/32"), Kind.HOST, "the Docker host"),
    reserved_class(ipaddress.ip_network("172.19.0.0/16"), Kind.SANDBOX, "other sandbox"),
)
NEVER = "the Docker host and other sandboxes are never reachable"


def on(**lists: object) -> Policy:
    return Policy.parse(allow_internet_access=True, **lists)  # type: ignore[arg-type]


ONLY = on(allow_out=["a.test"])
OPEN = on()
DENY = on(deny_out=["example.com", "203.0.113.0/24"])
RULES = on(allow_out=["api.test"], l7_rules=["deny api.test * /admin"])

# (policy, destination, words the refusal was logged with, offer, entry, text contains)
CASES = [
    # Allow-only: the destination joins the allow list.
    (ONLY, "b.test", "not in the allow list", Offer.ALLOW, "b.test", "Add b.test to the allow list"),
    (ONLY, "b.test:443", "not in the allow list", Offer.ALLOW, "b.test", "allow list"),
    (ONLY, "203.0.113.7:443", "not in the allow list", Offer.ALLOW, "203.0.113.7/32", "allow list"),
    (ONLY, "10.1.2.3:80", "always denied: private range", Offer.ALLOW, "10.1.2.3/32", "allow list"),
    (ONLY, "[2001:db8::1]:80", "", Offer.ALLOW, "2001:db8::1/128", "allow list"),
    # Allow-everything: only a private address, as a private exception; never an allow entry.
    (OPEN, "10.1.2.3:80", "always denied: private range", Offer.PRIVATE, "10.1.2.3/32", "private addresses"),
    (OPEN, "[fd00::5]:80", "", Offer.PRIVATE, "fd00::5/128", "keeps allowing everything else"),
    (OPEN, "203.0.113.7", "", Offer.NONE, None, "Allowed by the current policy already"),
    (OPEN, "b.test", "", Offer.NONE, None, "Allowed by the current policy already"),
    # The Docker host and other sandboxes: never, however the refusal was worded.
    (OPEN, "172.17.0.1:80", "always denied: the Docker host", Offer.NONE, None, NEVER),
    (OPEN, "172.18.0.1:443", "always denied: the Docker host", Offer.NONE, None, NEVER),
    (OPEN, "172.19.0.2:80", "always denied: other sandbox", Offer.NONE, None, NEVER),
    (OPEN, "172.19.0.2:80", "other sandbox", Offer.NONE, None, NEVER),  # an older console's words
    (OPEN, "172.17.0.1", "always-denied destination (the host itself or a sandbox network)", Offer.NONE, None, NEVER),
    (OPEN, "172.17.0.1:80", "", Offer.NONE, None, NEVER),  # decided again with the reserved ranges
    (ONLY, "172.17.0.1:80", "not in the allow list", Offer.NONE, None, NEVER),
    (ONLY, "172.19.0.9:80", "", Offer.NONE, None, NEVER),
    # Link-local, metadata, loopback: never.
    (OPEN, "169.254.169.254:80", "always denied: link-local/metadata", Offer.NONE, None, "never reachable"),
    (ONLY, "169.254.169.254:80", "", Offer.NONE, None, "link-local and metadata addresses are never reachable"),
    (ONLY, "127.0.0.1:80", "", Offer.NONE, None, "loopback"),
    # A deny entry: edit the deny list, never an allow entry over it.
    (DENY, "api.example.com", "deny entry example.com", Offer.EDIT_DENY, None, "edit the deny list"),
    (DENY, "example.com:443", "deny entry example.com", Offer.EDIT_DENY, None, "edit the deny list"),
    (DENY, "203.0.113.7", "deny entry 203.0.113.0/24", Offer.EDIT_DENY, None, "edit the deny list"),
    (on(allow_out=["a.test"], deny_out=["b.a.test"]), "b.a.test", "", Offer.EDIT_DENY, None, "deny list"),
    # An address a denied name resolved to (the packet filter refuses it as that entry's), met
    # under another name or raw: decide alone cannot know the address, the logged words can.
    (DENY, "203.0.114.9:80", "deny entry example.com", Offer.EDIT_DENY, None, "edit the deny list"),
    (DENY, "other.test", "deny entry example.com", Offer.EDIT_DENY, None, "resolves to"),
    # ... unless that entry has left the deny list since: then it is allowed now.
    (OPEN, "203.0.114.9:80", "deny entry example.com", Offer.NONE, None, "Allowed by the current policy already"),
    # An HTTP rule: edit the rules.
    (
        RULES,
        "http://api.test/admin/x",
        "HTTP rule 1 (deny any method api.test/admin)",
        Offer.EDIT_RULES,
        None,
        "HTTP rules",
    ),
    # Nothing to do, or nothing that would help.
    (Policy(allow_internet_access=False), "a.test", "", Offer.NONE, None, "Outbound access is off"),
    (OPEN, "a.test", "no upstream resolver set", Offer.NONE, None, "no resolver upstream"),
    (
        ONLY,
        "a.test",
        "the name sent does not resolve to the address connected to",
        Offer.NONE,
        None,
        "does not resolve",
    ),
    (ONLY, "x.a.test", "", Offer.NONE, None, "Allowed by the current policy already"),
]


@pytest.mark.parametrize(("policy", "text", "words", "offer", "entry", "text_has"), CASES)
def test_advise(policy: Policy, text: str, words: str, offer: Offer, entry: str | None, text_has: str) -> None:
    advice = advise(policy, parse_destination(text), refused_with=words, reserved=RESERVED)
    assert advice.offer == offer, advice
    assert (str(advice.entry) if advice.entry is not None else None) == entry
    assert text_has in advice.text, advice
    if advice.can_approve:
        # What is offered is what enforcement then does: decided again, it is let through.
        assert advice.entry is not None
        assert decide(
            with_entry(policy, advice.offer, advice.entry), parse_destination(text), reserved=RESERVED
        ).allowed


def test_an_unnameable_destination_offers_nothing() -> None:
    assert advise(OPEN, None).offer == Offer.NONE


def test_an_approval_that_would_change_nothing_is_not_offered() -> None:
    # Allow-only, and the name resolves into a private range: the name alone would not do.
    policy = on(allow_out=["a.test"])
    destination = parse_destination("b.test").resolved("10.0.0.5")
    advice = advise(policy, destination)
    assert advice.offer == Offer.NONE
    assert "would change nothing" in advice.text


@pytest.mark.parametrize(
    "text",
    ["[64:ff9b::a9fe:a9fe]:80", "[64:ff9b::169.254.169.254]:80", "[64:ff9b::7f00:1]:80", "[64:ff9b::6464:64c8]:80"],
)
@pytest.mark.parametrize("policy", [OPEN, ONLY, on(allow_out=["64:ff9b::/96"])])
def test_the_nat64_form_of_a_never_reachable_address_is_never_offered_nor_opened(policy: Policy, text: str) -> None:
    """64:ff9b::/96 is NAT64: a host with a NAT64 gateway sends 64:ff9b::a9fe:a9fe to the
    cloud metadata address 169.254.169.254. The metadata, link-local and loopback addresses are
    never reachable, so their NAT64 forms are not either: no approval offered, and an allow
    entry over the NAT64 prefix does not open them."""
    destination = parse_destination(text)
    assert not decide(policy, destination, reserved=RESERVED).allowed
    assert not advise(policy, destination, reserved=RESERVED).can_approve
