"""The explain evaluator and the policy-vs-backend check: pure, no resolver, no network.

Every case states the console's semantics (issue 13): outbound off = nothing; no allow list =
everything but the always-denied set and the deny list; an allow list = only those; deny
entries win; private ranges need a CIDR allow entry or a private exception; link-local never.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.backends.base import L7Rule, NetworkCapabilities, NetworkSpec
from sandboxes.catalog.network import spec_fingerprint, unsupported_policy_switches
from sandboxes.egress.explain import BackendView, decide, explain, parse_target

ON: dict[str, Any] = {"allow_internet_access": True, "allow_public_traffic": False}
E2B_LIKE = NetworkCapabilities(
    allow_out_cidr=True,
    allow_out_domain=True,
    deny_out_cidr=True,
    inbound_toggle=True,
    deny_wins=False,
    allow_private=True,
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


@pytest.mark.parametrize(
    ("spec", "destination", "allowed", "rule"),
    [
        (
            NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            "example.com",
            False,
            "outbound access is off",
        ),
        (NetworkSpec(**ON), "203.0.113.9", True, "no allow list"),
        (NetworkSpec(**ON), "example.com:443", True, "no allow list"),
        (NetworkSpec(**ON), "10.1.2.3", False, "private range 10.0.0.0/8 is always denied"),
        (NetworkSpec(**ON), "[fd00::5]:80", False, "private range fc00::/7"),
        (NetworkSpec(**ON, allow_private=("10.1.0.0/16",)), "10.1.2.3", True, "private address also allowed"),
        (NetworkSpec(**ON, allow_out=("0.0.0.0/0",)), "169.254.169.254", False, "link-local"),
        (NetworkSpec(**ON, deny_out=("203.0.113.0/24",)), "203.0.113.9", False, "deny entry 203.0.113.0/24"),
        (NetworkSpec(**ON, allow_out=("*.example.com",)), "api.example.com", True, "allow entry *.example.com"),
        (NetworkSpec(**ON, allow_out=("*.example.com",)), "example.com", False, "not in the allow list"),
        (NetworkSpec(**ON, allow_out=("*.example.com",)), "other.test", False, "not in the allow list"),
        # Deny wins over allow, whichever comes first in the lists.
        (
            NetworkSpec(**ON, allow_out=("*.example.com",), deny_out=("admin.example.com",)),
            "https://admin.example.com/x",
            False,
            "deny entry admin.example.com",
        ),
        # A CIDR allow entry covering a private range opens it (allow-only mode).
        (NetworkSpec(**ON, allow_out=("10.5.0.0/16",)), "10.5.0.1", True, "allow entry 10.5.0.0/16"),
    ],
)
def test_decide(spec: NetworkSpec, destination: str, allowed: bool, rule: str) -> None:
    decision = decide(spec, parse_target(destination))
    assert (decision.allowed, rule in decision.rule) == (allowed, True), decision


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "give one destination"),
        ("a b", "give one destination"),
        ("ftp://example.com/", "only http:// and https://"),
        ("*.example.com", "not a wildcard"),
        ("host:port", "the port must be a number"),
        ("not_a_name", "not a domain name"),
    ],
)
def test_bad_destinations_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_target(text)


def test_a_name_is_matched_never_resolved_and_the_answer_says_so() -> None:
    answer = explain(parse_target("pypi.org"), NetworkSpec(**ON, allow_out=("pypi.org",)))
    assert answer.allowed
    assert answer.rule == "allow entry pypi.org"
    assert any("after resolution" in text for _, text in answer.lines)


def test_session_grants_and_http_rules_are_layers_of_the_answer() -> None:
    space = NetworkSpec(
        **ON, allow_out=("pypi.org",), l7_rules=(L7Rule("files.example", path_prefix="/admin", action="deny"),)
    )
    session = NetworkSpec(**ON, allow_out=("pypi.org", "files.example"), l7_rules=space.l7_rules)
    granted = explain(parse_target("http://files.example/data"), space, session_spec=session, grants=("files.example",))
    assert granted.allowed
    assert ("space policy", "refused: not in the allow list (only listed destinations are reachable)") in granted.lines
    assert ("session grants", "allowed by this session's grant: allow entry files.example") in granted.lines
    admin = explain(
        parse_target("http://files.example/admin/x"), space, session_spec=session, grants=("files.example",)
    )
    assert not admin.allowed
    assert admin.rule.startswith("HTTP rule 1")


def test_the_backend_layer_names_what_a_config_cannot_enforce() -> None:
    spec = NetworkSpec(**ON, allow_out=("10.0.0.0/8",), deny_out=("10.9.0.0/16",))
    problems = tuple(unsupported_policy_switches(spec, E2B_LIKE))
    assert problems == ("deny entry 10.9.0.0/16 inside allow entry 10.0.0.0/8 (on this backend allow entries win)",)
    answer = explain(
        parse_target("10.9.1.1"),
        spec,
        backends=(BackendView("cloud", "E2B", E2B_LIKE, problems), BackendView("local", "Docker", FULL)),
    )
    assert not answer.allowed
    assert answer.rule == "deny entry 10.9.0.0/16 (deny entries win)"
    backend_lines = [text for layer, text in answer.lines if layer == "backend"]
    assert backend_lines[0].startswith("config cloud (E2B) cannot enforce deny entry 10.9.0.0/16")
    assert "refused (409)" in backend_lines[0]
    assert backend_lines[1] == "config local (Docker) honours this policy (applied live to running sessions)"


def test_unsupported_switches_follow_the_capabilities_only() -> None:
    spec = NetworkSpec(
        allow_internet_access=True,
        allow_public_traffic=True,
        allow_out=("a.example",),
        deny_out=("bad.example", "198.51.100.0/24"),
        allow_private=("10.1.0.0/16",),
        l7_rules=(L7Rule("a.example"),),
    )
    assert unsupported_policy_switches(spec, FULL) == []
    on_off_only = unsupported_policy_switches(spec, NetworkCapabilities())
    assert on_off_only == [
        "CIDR deny entries (198.51.100.0/24)",
        "domain deny entries (bad.example)",
        "domain allow entries (a.example)",
        "private addresses also allowed (10.1.0.0/16)",
        "1 HTTP (L7) rule(s)",
        "public inbound traffic",
    ]
    # A deny entry beside (not inside) the allowed ones is fine where allow entries win.
    assert (
        unsupported_policy_switches(
            NetworkSpec(**ON, allow_out=("203.0.113.0/24",), deny_out=("198.51.100.0/24",)), E2B_LIKE
        )
        == []
    )


def test_the_fingerprint_changes_with_the_spec_only() -> None:
    one = NetworkSpec(**ON, allow_out=("a.example",))
    assert spec_fingerprint(one) == spec_fingerprint(NetworkSpec(**ON, allow_out=("a.example",)))
    assert spec_fingerprint(one) != spec_fingerprint(NetworkSpec(**ON, allow_out=("b.example",)))
    assert len(spec_fingerprint(one)) == 16
