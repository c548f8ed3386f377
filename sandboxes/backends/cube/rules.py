"""The console's HTTP rules as Cube's L7 `rules` list, meaning what the console means.

How Cube's egress proxy (CubeEgress, an OpenResty transparent proxy that terminates TLS with
its own CA) decides a request, by its source (`CubeEgress/lua/access_phase.lua`, rule
validation in `CubeEgress/lua/policy.lua`, the API shape in `CubeAPI/src/models/mod.rs`):

- the rules are walked in order, the first whose `match` holds decides; none holds: refused;
- every `match` field is optional and an absent one holds for any request, so `{}` or a
  `scheme` alone matches everything (of that scheme);
- `host` (the HTTP Host header, port stripped) and `sni` (the TLS server name; none on plain
  HTTP, so an `sni` rule never matches port 80) compare without case, exactly, except that a
  leading `*.` matches the names below only, never the name itself; a trailing dot is kept;
- `method` is any-of (upper case); `path` is exact, or a prefix when it ends with `*`;
- rule names become the proxy's rule ids: they must be unique, and a policy holds at most
  256 rules.

The console's meaning (netpolicy.decide.http_decision): for HTTP, the first rule matching
host, method and path decides; for TLS, the first rule naming the SNI that can be judged by
the SNI alone (an allow, or a deny of every method and path) decides; a host some rule names
that no rule decides is refused; a host no rule names follows the allow/deny lists. So each
console rule is sent per scheme (`host` for http, `sni` for https), a plain domain as the
name and `*.name` (and, for the Host header, both with a trailing dot), then the names the
rules named are refused, then a catch-all per scheme lets the rest through (the lists, which
Cube enforces below the proxy, already bound it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from netpolicy.entries import Domain, L7Rule

# CubeEgress/lua/policy.lua MAX_RULES_PER_POLICY.
CUBE_MAX_RULES = 256
# What one console rule can cost at most: 4 Host patterns and 2 SNI patterns for the rule
# itself, as many again to refuse the names it named; the 2 catch-alls are extra.
_WORST_PER_RULE = 12
MAX_CONSOLE_RULES = (CUBE_MAX_RULES - 2) // _WORST_PER_RULE


def host_patterns(domain: Domain) -> list[str]:
    """The Host header patterns meaning `domain` (clients may send a trailing dot)."""
    names = [f"*.{domain.name}"] if domain.wildcard else [domain.name, f"*.{domain.name}"]
    return [*names, *(f"{n}." for n in names)]


def sni_patterns(domain: Domain) -> list[str]:
    """The TLS server name patterns meaning `domain` (a server name never ends in a dot)."""
    return [f"*.{domain.name}"] if domain.wildcard else [domain.name, f"*.{domain.name}"]


def cube_rules(rules: Sequence[L7Rule]) -> list[dict[str, Any]]:
    """Cube's `rules` list for the console's HTTP rules (empty when there are none)."""
    if not rules:
        return []
    out: list[dict[str, Any]] = []
    # (scheme, field, pattern) already matched whatever the method and path: a later rule
    # on it is never reached.
    settled: set[tuple[str, str, str]] = set()

    def add(name: str, scheme: str, field: str, pattern: str, allow: bool, extra: dict[str, Any]) -> None:
        if (scheme, field, pattern) in settled:
            return
        if not extra:
            settled.add((scheme, field, pattern))
        match = {"scheme": scheme, field: pattern, **extra}
        out.append({"name": name, "match": match, "action": {"allow": allow}})

    for position, rule in enumerate(rules, start=1):
        extra: dict[str, Any] = {}
        if rule.methods:
            extra["method"] = [m.upper() for m in rule.methods]
        if rule.path_prefix and rule.path_prefix != "/":
            extra["path"] = f"{rule.path_prefix}*"
        allow = rule.action == "allow"
        for n, pattern in enumerate(host_patterns(rule.domain), start=1):
            add(f"rule-{position}-http-{n}", "http", "host", pattern, allow, extra)
        if rule.decides_tls:
            for n, pattern in enumerate(sni_patterns(rule.domain), start=1):
                add(f"rule-{position}-tls-{n}", "https", "sni", pattern, allow, {})
    for position, rule in enumerate(rules, start=1):
        # A host a rule names that no rule decided: refused, as the console refuses it.
        for n, pattern in enumerate(host_patterns(rule.domain), start=1):
            add(f"named-{position}-http-{n}", "http", "host", pattern, False, {})
        for n, pattern in enumerate(sni_patterns(rule.domain), start=1):
            add(f"named-{position}-tls-{n}", "https", "sni", pattern, False, {})
    # A host no rule names: the allow/deny lists (enforced below the proxy) decide.
    out.append({"name": "unnamed-http", "match": {"scheme": "http"}, "action": {"allow": True}})
    out.append({"name": "unnamed-tls", "match": {"scheme": "https"}, "action": {"allow": True}})
    return out


def rules_problem(rules: Sequence[L7Rule]) -> str:
    """Why Cube cannot take these rules, in words ("" when it can)."""
    if len(rules) > MAX_CONSOLE_RULES:
        return (
            f"{len(rules)} HTTP (L7) rules: Cube's egress proxy holds at most {CUBE_MAX_RULES} rules per "
            f"sandbox and each of the console's takes up to {_WORST_PER_RULE} (its name and the names below, "
            f"for HTTP and TLS), so at most {MAX_CONSOLE_RULES} are accepted"
        )
    return ""
