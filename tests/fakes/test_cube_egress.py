"""The fake Cube's L7 rules: accepted and decided as Cube's own source does
(`CubeEgress/lua/access_phase.lua`, `CubeEgress/lua/policy.lua`, `CubeAPI/src/models/mod.rs`),
so a translation tested against the fake means on Cube what it means here."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes.cube_egress import MAX_RULES, egress_allows, rules_error
from tests.fakes.fixtures import FakeHandle


def rule(name: str, allow: bool, **match: Any) -> dict[str, Any]:
    return {"name": name, "match": match, "action": {"allow": allow}}


def test_a_wildcard_host_matches_the_names_below_only_and_no_match_is_refused() -> None:
    rules = [rule("sub", True, host="*.example.test")]
    assert egress_allows(rules, scheme="http", host="api.example.test")
    assert egress_allows(rules, scheme="http", host="A.B.Example.Test:8080")  # no case, port stripped
    assert not egress_allows(rules, scheme="http", host="example.test")  # never the name itself
    assert not egress_allows(rules, scheme="http", host="notexample.test")
    assert not egress_allows([rule("exact", True, host="example.test")], scheme="http", host="api.example.test")


def test_an_sni_rule_holds_for_tls_only_and_an_empty_match_for_everything() -> None:
    rules = [rule("tls", False, sni="example.test"), rule("rest", True)]
    assert not egress_allows(rules, scheme="https", sni="example.test", host="example.test")
    assert egress_allows(rules, scheme="http", host="example.test")  # plain HTTP has no SNI
    assert egress_allows([rule("http-only", True, scheme="http")], scheme="http", host="x.test")
    assert not egress_allows([rule("http-only", True, scheme="http")], scheme="https", sni="x.test", host="x.test")


def test_a_path_is_exact_unless_it_ends_in_a_star_and_methods_are_any_of() -> None:
    exact = [rule("p", True, path="/v1/")]
    assert egress_allows(exact, scheme="http", host="x.test", path="/v1/")
    assert not egress_allows(exact, scheme="http", host="x.test", path="/v1/x")
    prefix = [rule("p", True, path="/v1/*", method=["get", "POST"])]
    assert egress_allows(prefix, scheme="http", host="x.test", method="GET", path="/v1/x")
    assert not egress_allows(prefix, scheme="http", host="x.test", method="PUT", path="/v1/x")


def test_rules_are_validated_as_cube_validates_them() -> None:
    assert rules_error([rule("a", True), rule("b", False)]) == ""
    assert "duplicates" in rules_error([rule("a", True), rule("a", False)])
    assert "max 256" in rules_error([rule(f"r{n}", True) for n in range(MAX_RULES + 1)])
    assert "scheme" in rules_error([rule("a", True, scheme="ftp")])
    assert "match required" in rules_error([{"name": "a", "action": {"allow": True}}])


@pytest.mark.e2b
def test_the_fake_cube_answers_400_for_rules_cube_refuses(fake_cube: FakeHandle) -> None:
    body = {
        "templateID": "base",
        "network": {"rules": [rule("a", True, host="x.test"), rule("a", False)]},
    }
    with fake_cube.http() as http:
        answer = http.post("/sandboxes", json=body)
    assert answer.status_code == 400
    assert "duplicates earlier rule 'a'" in answer.json()["message"]
