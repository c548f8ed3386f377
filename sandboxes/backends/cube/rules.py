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
  256 rules;
- every name a rule's `host` or `sni` carries becomes an L7 target
  (network-agent `extractL7AllowOutTargetsFromRules`): its DNS answers are learnt and
  connections to those addresses on 80/443 go to the proxy, checked before the deny list
  (CubeNet `classify_egress_flow`: allow_out_v3 first). Flows to other addresses never reach
  the proxy; the lists decide them.

The console's meaning (netpolicy.decide.http_decision): for HTTP, the first rule matching
host, method and path decides; for TLS, the first rule naming the SNI that can be judged by
the SNI alone (an allow, or a deny of every method and path) decides; a host some rule names
that no rule decides is refused; a host no rule names follows the allow/deny lists. So each
console rule is sent per scheme (`host` for http, `sni` for https), a plain domain as the
name and `*.name` (and, for the Host header, both with a trailing dot), then the names the
rules named are refused, then a catch-all per scheme lets the rest through. Since a named host
skips the lists on its way to the proxy, each rule is cut down to what the allow list lets
out, and deny CIDRs beside rules are refused (`rules_problem`): the proxy cannot see them.
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


def _within(rule: Domain, allowed: Domain) -> Domain | None:
    """The names both entries match, as one entry (domain trees nest), or None."""
    if rule.name == allowed.name:
        return Domain(rule.name, rule.wildcard or allowed.wildcard)
    if rule.name.endswith("." + allowed.name):
        return rule
    if allowed.name.endswith("." + rule.name):
        return allowed
    return None


def _domains(domain: Domain, allowed: Sequence[Domain] | None) -> list[Domain]:
    """The part of `domain` the allow list lets out (all of it without an allow list)."""
    if allowed is None:
        return [domain]
    parts = (_within(domain, a) for a in allowed)
    return list(dict.fromkeys(p for p in parts if p is not None))


def cube_rules(rules: Sequence[L7Rule], allowed: Sequence[Domain] | None = None) -> list[dict[str, Any]]:
    """Cube's `rules` list for the console's HTTP rules (empty when there is nothing to send).

    `allowed`: with an allow list, its domain entries. Cube makes every name a rule's `host`
    or `sni` carries an L7 target that its packet filter lets through to the proxy before it
    looks at the lists (network-agent extractL7AllowOutTargetsFromRules, CubeNet
    classify_egress_flow), so a rule may only name what the allow list lets out: each rule
    is cut down to its part inside the allow list (a name outside it stays refused by the
    lists, as the console refuses it)."""
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
        for part, domain in enumerate(_domains(rule.domain, allowed), start=1):
            tag = f"rule-{position}" if part == 1 else f"rule-{position}.{part}"
            for n, pattern in enumerate(host_patterns(domain), start=1):
                add(f"{tag}-http-{n}", "http", "host", pattern, allow, extra)
            if rule.decides_tls:
                for n, pattern in enumerate(sni_patterns(domain), start=1):
                    add(f"{tag}-tls-{n}", "https", "sni", pattern, allow, {})
    for position, rule in enumerate(rules, start=1):
        # A host a rule names that no rule decided: refused, as the console refuses it.
        for part, domain in enumerate(_domains(rule.domain, allowed), start=1):
            tag = f"named-{position}" if part == 1 else f"named-{position}.{part}"
            for n, pattern in enumerate(host_patterns(domain), start=1):
                add(f"{tag}-http-{n}", "http", "host", pattern, False, {})
            for n, pattern in enumerate(sni_patterns(domain), start=1):
                add(f"{tag}-tls-{n}", "https", "sni", pattern, False, {})
    if not out:
        return []  # no rule names anything the lists let out: nothing reaches the proxy
    # A host no rule names (reaching the proxy only at an address it shares with a named
    # one): the allow/deny lists decide, which let that address out.
    out.append({"name": "unnamed-http", "match": {"scheme": "http"}, "action": {"allow": True}})
    out.append({"name": "unnamed-tls", "match": {"scheme": "https"}, "action": {"allow": True}})
    return out


def rules_problem(
    rules: Sequence[L7Rule], *, allowed: Sequence[Domain] | None = None, deny_cidrs: Sequence[object] = ()
) -> str:
    """Why Cube cannot take these rules, in words ("" when it can)."""
    if len(rules) > MAX_CONSOLE_RULES:
        return (
            f"{len(rules)} HTTP (L7) rules: Cube's egress proxy holds at most {CUBE_MAX_RULES} rules per "
            f"sandbox and each of the console's takes up to {_WORST_PER_RULE} (its name and the names below, "
            f"for HTTP and TLS), so at most {MAX_CONSOLE_RULES} are accepted"
        )
    sent = len(cube_rules(rules, allowed))
    if sent > CUBE_MAX_RULES:
        return (
            f"these HTTP (L7) rules: cut to the allow list's domains they become {sent} of Cube's, and its "
            f"egress proxy holds at most {CUBE_MAX_RULES} per sandbox"
        )
    if rules and deny_cidrs:
        return f"deny entries ({', '.join(str(c) for c in deny_cidrs)}) beside HTTP (L7) rules: {L7_PAST_DENY}"
    return ""


L7_PAST_DENY = (
    "Cube sends a host an HTTP rule names to its egress proxy on ports 80 and 443 before it checks "
    "the deny list, so that host's addresses would be reached whatever the deny list says"
)
