"""Cube's L7 egress rules as the real proxy reads them: what the fake Cube accepts and how it
decides a request. Written from the vendor's source (TencentCloud/CubeSandbox), not from its
documentation:

- `CubeAPI/src/models/mod.rs` (EgressRule, EgressRuleMatch, EgressRuleAction): `name`,
  `match` and `action.allow` required; every match field optional, "empty match matches any
  request"; `CubeAPI/src/services/sandboxes.rs`: `match.scheme` is `http` or `https`;
- `CubeEgress/lua/policy.lua` (validate_policy): rule ids (the names) unique, at most 256
  rules, `action.audit` one of full|metadata|none;
- `CubeEgress/lua/access_phase.lua` (rule_matches, domain_match, path_match, decide): rules
  in order, first match wins, no match refused; `sni`/`host` exact or a leading `*.` for the
  names below only (never the name itself), without case, the Host header's port stripped;
  `sni` is absent on plain HTTP (an `sni` rule never matches there); `method` any-of;
  `path` exact, or a prefix when it ends with `*`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_RULES = 256  # CubeEgress/lua/policy.lua MAX_RULES_PER_POLICY


def rules_error(rules: Sequence[Any]) -> str:
    """What CubeAPI or CubeEgress answers 400 for in a `rules` list ("" when accepted)."""
    if len(rules) > MAX_RULES:
        return f"policy.rules has {len(rules)} rules, max {MAX_RULES}"
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str) or not rule["name"]:
            return f"network.rules[{i}].name required"
        if rule["name"] in seen:
            return f"rules[{i + 1}].id duplicates earlier rule '{rule['name']}'"
        seen.add(rule["name"])
        match, action = rule.get("match"), rule.get("action")
        if not isinstance(match, dict):
            return f"network.rules[{i}].match required (object; empty {{}} allowed)"
        if not isinstance(action, dict) or not isinstance(action.get("allow"), bool):
            return f"network.rules[{i}].action.allow required (boolean)"
        scheme = match.get("scheme")
        if scheme is not None and str(scheme).lower() not in ("http", "https"):
            return f"network.rules[{i}].match.scheme must be 'http' or 'https', got {scheme!r}"
        if action.get("audit") not in (None, "full", "metadata", "none"):
            return f"rules[{i + 1}].action.audit must be full|metadata|none"
    return ""


def _domain_match(pattern: Any, value: str | None) -> bool:
    if not isinstance(pattern, str) or value is None:
        return False
    pattern, value = pattern.lower(), value.lower()
    if pattern.startswith("*.") and len(pattern) > 2:
        return value.endswith(pattern[1:])
    return pattern == value


def _path_match(pattern: Any, value: str | None) -> bool:
    if not isinstance(pattern, str) or value is None:
        return False
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return pattern == value


def _host_without_port(host: str | None) -> str | None:
    if host is None or host.startswith("["):
        return host
    return host.split(":", 1)[0]


def rule_matches(
    match: Any, *, scheme: str, sni: str | None, host: str | None, method: str | None, path: str | None
) -> bool:
    """access_phase.lua rule_matches: every field present must hold."""
    if not isinstance(match, Mapping):
        return False
    if match.get("sni") is not None and not _domain_match(match["sni"], sni):
        return False
    if match.get("host") is not None and not _domain_match(match["host"], _host_without_port(host)):
        return False
    if match.get("method") is not None:
        methods = match["method"]
        if not isinstance(methods, list) or method is None or method not in [str(m).upper() for m in methods]:
            return False
    if match.get("path") is not None and not _path_match(match["path"], path):
        return False
    return not (match.get("scheme") is not None and str(match["scheme"]).lower() != scheme)


def egress_allows(
    rules: Sequence[Mapping[str, Any]],
    *,
    scheme: str,
    sni: str | None = None,
    host: str | None = None,
    method: str | None = None,
    path: str | None = None,
) -> bool:
    """access_phase.lua decide: the first rule matching decides; none matches: refused (403).
    `sni` is None for plain HTTP (the proxy's :8080 server has no TLS)."""
    for rule in rules:
        if rule_matches(rule.get("match"), scheme=scheme, sni=sni, host=host, method=method, path=path):
            return bool((rule.get("action") or {}).get("allow") is True)
    return False
