"""Explain (netpolicy.decide through each layer, with the backends' reserved ranges), the
policy-vs-backend check and the spec's fingerprint: pure, no resolver, no network.

Outbound off = nothing; no allow list = everything but the always-denied set and the deny
list; an allow list = only those; a plain domain is the name and its subdomains; deny entries
win; private ranges need a CIDR allow entry inside them or a private exception; link-local,
the Docker host and other sandboxes never.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from netpolicy import (
    Kind,
    PolicyError,
    decide,
    reserved_class,
)
from sandboxes.backends.base import NetworkCapabilities, NetworkSpec
from sandboxes.catalog.network import spec_fingerprint, unsupported_policy_switches
from sandboxes.network.explain import BackendView, explain, parse_target

ON: dict[str, Any] = {"allow_internet_access": True, "allow_public_traffic": False}
HOST = reserved_class(ipaddress.ip_network("172.17.0.1/32"), Kind.HOST, "the Docker host")
OTHER = reserved_class(ipaddress.ip_network("172.19.0.0/16"), Kind.SANDBOX, "other sandbox")
CUBE_LIKE = NetworkCapabilities(
    allow_out_cidr=True,
    allow_out_domain=True,
    deny_out_cidr=True,
    inbound_toggle=True,
    deny_wins=False,
    allow_private=True,
)
E2B_LIKE = NetworkCapabilities(
    allow_out_cidr=True, allow_out_domain=True, deny_out_cidr=True, inbound_toggle=True, deny_wins=False
)
FULL = NetworkCapabilities(
    allow_out_cidr=True,
    allow_out_domain=True,
    deny_out_cidr=True,
    deny_out_domain=True,
    l7_rules=True,
    inbound_toggle=True,
    live_update=True,
    allow_private=True,
)


def spec(**fields: Any) -> NetworkSpec:
    return NetworkSpec.parse(**{**ON, **fields})


@pytest.mark.parametrize(
    ("policy", "destination", "allowed", "rule"),
    [
        (NetworkSpec(allow_internet_access=False, allow_public_traffic=False), "example.com", False, "outbound"),
        # A plain domain is the name and its subdomains, in the allow list and the deny list.
        (spec(allow_out=("example.com",)), "api.example.com", True, "allow entry example.com"),
        (spec(allow_out=("example.com",)), "example.com", True, "allow entry example.com"),
        (spec(allow_out=("example.com",)), "badexample.com", False, "not in the allow list"),
        (spec(deny_out=("example.com",)), "api.example.com", False, "deny entry example.com"),
        (spec(deny_out=("example.com",)), "badexample.com", True, "no allow list"),
        (spec(), "203.0.113.9", True, "no allow list"),
        (spec(), "example.com:443", True, "no allow list"),
        (spec(), "10.1.2.3", False, "always denied: a private range"),
        (spec(), "[fd00::5]:80", False, "always denied: a private range"),
        (spec(), "172.17.0.1", False, "always denied: the Docker host"),
        (spec(), "172.19.0.2:80", False, "always denied: other sandbox"),
        (spec(allow_private=("10.1.0.0/16",)), "10.1.2.3", True, "private address also allowed"),
        (spec(allow_private=("172.17.0.0/16",)), "172.17.0.1", False, "the Docker host"),
        (spec(allow_out=("0.0.0.0/0",)), "169.254.169.254", False, "link-local"),
        (spec(allow_out=("0.0.0.0/0",)), "10.1.2.3", False, "a private range"),
        (spec(deny_out=("203.0.113.0/24",)), "203.0.113.9", False, "deny entry 203.0.113.0/24"),
        (spec(allow_out=("*.example.com",)), "api.example.com", True, "allow entry *.example.com"),
        (spec(allow_out=("*.example.com",)), "example.com", False, "not in the allow list"),
        (spec(allow_out=("*.example.com",)), "other.test", False, "not in the allow list"),
        # Deny wins over allow, whichever comes first in the lists.
        (
            spec(allow_out=("*.example.com",), deny_out=("admin.example.com",)),
            "https://admin.example.com/x",
            False,
            "deny entry admin.example.com",
        ),
        # A CIDR allow entry inside a private range opens it (allow-only mode).
        (spec(allow_out=("10.5.0.0/16",)), "10.5.0.1", True, "allow entry 10.5.0.0/16"),
    ],
)
def test_explain_decides(policy: NetworkSpec, destination: str, allowed: bool, rule: str) -> None:
    answer = explain(parse_target(destination), policy, reserved=(HOST, OTHER))
    assert (answer.allowed, rule in answer.rule) == (allowed, True), answer
    # The answer is netpolicy's decision with the same reserved ranges: the enforcing layers'.
    assert answer.decision == decide(policy, parse_target(destination), reserved=(HOST, OTHER))


def test_the_reserved_ranges_come_from_the_backends() -> None:
    views = (BackendView("local", "Docker", FULL, reserved=(HOST,)), BackendView("cloud", "E2B", E2B_LIKE))
    answer = explain(parse_target("172.17.0.1"), spec(allow_out=("172.17.0.0/16",)), backends=views)
    assert (answer.allowed, answer.rule) == (False, "always denied: the Docker host")
    without = explain(parse_target("172.17.0.1"), spec(allow_out=("172.17.0.0/16",)))
    assert (without.allowed, without.rule) == (True, "allow entry 172.17.0.0/16")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "give one destination"),
        ("a b", "give one destination"),
        ("ftp://example.com/", "only http:// and https://"),
        ("*.example.com", "not a wildcard"),
        ("host.test:port", "the port must be a number"),
        ("not_a_name", "not a domain name"),
    ],
)
def test_bad_destinations_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(PolicyError, match=reason):
        parse_target(text)


def test_a_name_is_matched_never_resolved_and_the_answer_says_so() -> None:
    answer = explain(parse_target("pypi.org"), spec(allow_out=("pypi.org",)))
    assert answer.allowed
    assert answer.rule == "allow entry pypi.org"
    assert any("after resolution" in text for _, text in answer.lines)
    assert answer.as_json()["layer"] == "dns"


def test_session_grants_and_http_rules_are_layers_of_the_answer() -> None:
    space = spec(allow_out=("pypi.org",), l7_rules=("deny files.example * /admin", "allow files.example"))
    session = spec(
        allow_out=("pypi.org", "files.example"), l7_rules=("deny files.example * /admin", "allow files.example")
    )
    granted = explain(parse_target("http://files.example/data"), space, session_spec=session, grants=("files.example",))
    assert granted.allowed
    assert ("space policy", "refused: not in the allow list (only listed destinations are reachable)") in granted.lines
    assert ("session grants", "allowed by this session's grant: allow entry files.example") in granted.lines
    admin = explain(
        parse_target("http://files.example/admin/x"), space, session_spec=session, grants=("files.example",)
    )
    assert not admin.allowed
    assert admin.rule.startswith("HTTP rule 1")
    assert any(layer == "http rules" and text.startswith("refused: HTTP rule 1") for layer, text in admin.lines)
    # Asked without a port or scheme, the HTTP rules' say for plain HTTP is a layer too.
    bare = explain(parse_target("files.example"), session)
    assert any(layer == "http rules" for layer, _ in bare.lines)


def test_the_backend_layer_names_what_a_config_cannot_enforce() -> None:
    policy = spec(allow_out=("10.0.0.0/8",), deny_out=("10.9.0.0/16",))
    problems = tuple(unsupported_policy_switches(policy, CUBE_LIKE))
    assert problems == ("deny entry 10.9.0.0/16 inside allow entry 10.0.0.0/8 (on this backend allow entries win)",)
    answer = explain(
        parse_target("10.9.1.1"),
        policy,
        backends=(BackendView("cloud", "Cube", CUBE_LIKE, problems), BackendView("local", "Docker", FULL)),
    )
    assert not answer.allowed
    assert answer.rule == "deny entry 10.9.0.0/16 (deny entries win)"
    backend_lines = [text for layer, text in answer.lines if layer == "backend"]
    assert backend_lines[0].startswith("config cloud (Cube) cannot enforce deny entry 10.9.0.0/16")
    assert "refused (409)" in backend_lines[0]
    assert backend_lines[1] == "config local (Docker) honours this policy (applied live to running sessions)"


def test_unsupported_switches_follow_the_capabilities_only() -> None:
    policy = NetworkSpec.parse(
        allow_internet_access=True,
        allow_public_traffic=True,
        allow_out=("a.example",),
        deny_out=("bad.example", "198.51.100.0/24"),
        allow_private=("10.1.0.0/16",),
        l7_rules=("allow a.example",),
    )
    assert unsupported_policy_switches(policy, FULL) == []
    on_off_only = unsupported_policy_switches(policy, NetworkCapabilities())
    assert on_off_only == [
        "CIDR deny entries (198.51.100.0/24)",
        "domain deny entries (bad.example)",
        "domain allow entries (a.example)",
        "private addresses also allowed (10.1.0.0/16)",
        "1 HTTP (L7) rule(s)",
        "public inbound traffic",
    ]
    # A deny CIDR beside allowed CIDRs (not inside one) is fine where allow entries win...
    assert (
        unsupported_policy_switches(spec(allow_out=("203.0.113.0/24",), deny_out=("198.51.100.0/24",)), E2B_LIKE) == []
    )
    # ...but not beside allowed names: a name's addresses would get through whatever denyOut says.
    beside = unsupported_policy_switches(spec(allow_out=("a.example",), deny_out=("198.51.100.0/24",)), E2B_LIKE)
    assert beside == [
        "deny entry 198.51.100.0/24 beside allowed domains (a.example): on this backend an allowed name's"
        " addresses are let through whatever the deny list says"
    ]


def test_a_backend_that_never_opens_private_addresses_names_what_would_need_it() -> None:
    policy = spec(allow_out=("10.5.0.0/16", "203.0.113.0/24", "0.0.0.0/0"), allow_private=("192.168.7.0/24",))
    assert unsupported_policy_switches(policy, E2B_LIKE) == [
        "private addresses also allowed (192.168.7.0/24)",
        "allow entries inside a private range (10.5.0.0/16)",
    ]
    assert unsupported_policy_switches(policy, CUBE_LIKE) == []


def test_the_fingerprint_changes_with_the_spec_only() -> None:
    one = spec(allow_out=("a.example",))
    assert spec_fingerprint(one) == spec_fingerprint(spec(allow_out=("A.example.",)))
    assert spec_fingerprint(one) != spec_fingerprint(spec(allow_out=("b.example",)))
    assert spec_fingerprint(one) != spec_fingerprint(spec(allow_out=("*.a.example",)))
    assert len(spec_fingerprint(one)) == 16


# Computed by the string-typed spec's spec_fingerprint (main at 5029526) for these policies: a
# sandbox's stored fingerprint stays current across the change to typed entries, so no running
# session is listed as "keeping older rules" (nor re-applied) after an upgrade.
EARLIER_FINGERPRINTS = [
    ({"allow_internet_access": False, "allow_public_traffic": False}, "c632cea2094e65c8"),
    ({"allow_internet_access": True, "allow_public_traffic": True}, "5f3a2cb0f0198b29"),
    (
        {
            **ON,
            "allow_out": ("pypi.org", "*.npmjs.org", "203.0.113.0/24", "2001:db8::/32"),
            "deny_out": ("evil.npmjs.org", "203.0.113.128/25"),
            "allow_private": ("10.20.0.0/16",),
        },
        "471839d6e9afe2b1",
    ),
    (
        {
            **ON,
            "allow_out": ("api.github.com",),
            "l7_rules": (
                {"domain": "api.github.com", "methods": ["GET", "POST"], "path_prefix": "/repos/", "action": "allow"},
                {"domain": "*.pypi.org", "methods": [], "path_prefix": "/", "action": "deny"},
            ),
        },
        "65aed1ccb42234eb",
    ),
]


@pytest.mark.parametrize(("fields", "earlier"), EARLIER_FINGERPRINTS)
def test_the_fingerprint_of_an_existing_policy_is_unchanged(fields: dict[str, Any], earlier: str) -> None:
    assert spec_fingerprint(NetworkSpec.parse(**fields)) == earlier


@pytest.mark.django_db
def test_a_stored_private_exception_holding_a_never_reachable_address_still_reads(world: Any) -> None:
    # Saved by an earlier console (which checked link-local ranges only): 100.64.0.0/10 holds
    # the 100.100.100.200 metadata address, fd00::/8 fd00:ec2::254. The space keeps working,
    # and the metadata addresses stay refused.
    from console.models import NetworkPolicy
    from sandboxes.catalog.network import network_spec_for

    NetworkPolicy.objects.filter(space=world.space_a).update(
        allow_internet_access=True, allow_private=["100.64.0.0/10", "fd00::/8"]
    )
    policy = network_spec_for(world.space_a)
    assert [str(e) for e in policy.allow_private] == ["100.64.0.0/10", "fd00::/8"]
    assert explain(parse_target("100.64.1.2"), policy).allowed
    assert not explain(parse_target("100.100.100.200"), policy).allowed
    assert not explain(parse_target("[fd00:ec2::254]:80"), policy).allowed


# --- explain: what it answers vs what is enforced --------------------------------------------


@pytest.mark.parametrize(
    ("allow", "destination"),
    [
        (("0.0.0.0/0",), "10.1.2.3"),  # wider than the private range: does not open it
        (("::/0",), "[fd00::5]:80"),
        ((), "127.0.0.1"),  # the host itself
        ((), "::ffff:10.0.0.1"),  # a private address in IPv4-mapped form
        ((), "::ffff:169.254.169.254"),  # the metadata address in IPv4-mapped form
        (("::ffff:0:0/96",), "::ffff:169.254.169.254"),
    ],
)
def test_explain_refuses_what_the_filter_refuses(allow: tuple[str, ...], destination: str) -> None:
    # Was: explain answered "allowed" for each of these; Docker's chain refuses them.
    assert decide(NetworkSpec.parse(**ON, allow_out=allow), parse_target(destination)).allowed is False
    assert decide(NetworkSpec.parse(**ON, allow_out=("10.1.0.0/16",)), parse_target("10.1.2.3")).allowed is True
