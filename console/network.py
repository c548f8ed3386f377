"""Parsing and validation of a space's network policy (pure functions, no ORM).

Semantics, shared by every backend that can honour them (and documented on the form):
- outbound off: no network at all; lists and rules must then be empty;
- outbound on, empty `allow_out`: every destination but the always-denied set and `deny_out`;
- outbound on, non-empty `allow_out`: ONLY those CIDRs and domains (`*.example.com`);
- `deny_out` entries win over `allow_out` entries (and over session grants);
- always denied: the host's own addresses, link-local and metadata addresses, other
  sandboxes, and the private ranges unless a CIDR allow entry covers them or `allow_private`
  (private CIDRs also allowed, which never switches a space to allow-only) names them;
- L7 rules are checked in order, first match wins.
A backend that cannot honour part of this says so in its `NetworkCapabilities`
(`sandboxes.catalog.network.unsupported_policy_switches` names it).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
L7_ACTIONS = ("allow", "deny")
MAX_LIST_ENTRIES = 500
MAX_L7_RULES = 200

# Always denied (unless noted): private ranges may be opened by a CIDR allow entry or an
# `allow_private` exception; link-local (cloud metadata lives there) never.
PRIVATE_RANGES = tuple(
    ipaddress.ip_network(text)
    for text in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
LINK_LOCAL_RANGES = tuple(ipaddress.ip_network(text) for text in ("169.254.0.0/16", "fe80::/10"))
ALL_ADDRESSES = tuple(ipaddress.ip_network(text) for text in ("0.0.0.0/0", "::/0"))

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Destination:
    """One entry of an allow or deny list: a network, or a domain (optionally a wildcard)."""

    text: str
    network: IPNetwork | None = None
    domain: str | None = None
    wildcard: bool = False

    def covers(self, other: Destination) -> bool:
        """True when every address or name `other` matches is also matched by self."""
        if self.network is not None and other.network is not None:
            return self.network.version == other.network.version and other.network.subnet_of(self.network)  # type: ignore[arg-type]
        if self.domain is not None and other.domain is not None:
            if not self.wildcard:
                return not other.wildcard and other.domain == self.domain
            return other.domain.endswith("." + self.domain)
        return False


def overlaps(a: IPNetwork, b: IPNetwork) -> bool:
    return a.version == b.version and a.overlaps(b)


def private_range_of(network: IPNetwork) -> IPNetwork | None:
    """The private range that holds all of `network`, if one does."""
    return next((r for r in PRIVATE_RANGES if r.version == network.version and network.subnet_of(r)), None)  # type: ignore[arg-type]


def parse_domain(text: str) -> tuple[str, bool]:
    """Return (domain, is_wildcard) or raise ValueError with a message for the admin."""
    wildcard = text.startswith("*.")
    name = text[2:] if wildcard else text
    if "*" in name:
        raise ValueError(f"{text!r}: a wildcard is only allowed as a leading '*.' (e.g. *.example.com)")
    name = name.rstrip(".").lower()
    if len(name) > 253:
        raise ValueError(f"{text!r}: a domain name has at most 253 characters")
    labels = name.split(".")
    if len(labels) < 2:
        raise ValueError(f"{text!r}: not a domain name (expected something like example.com)")
    for label in labels:
        if not _LABEL.match(label):
            raise ValueError(f"{text!r}: {label!r} is not a valid domain label")
    if labels[-1].isdigit():
        raise ValueError(f"{text!r}: looks like a malformed IP address")
    return name, wildcard


def parse_destination(text: str) -> Destination:
    entry = text.strip()
    if not entry:
        raise ValueError("empty entry")
    if any(ch.isspace() for ch in entry):
        raise ValueError(f"{entry!r}: entries cannot contain spaces (one entry per line)")
    if "/" in entry or ":" in entry or entry.replace(".", "").isdigit():
        try:
            network = ipaddress.ip_network(entry, strict=True)
        except ValueError as exc:
            try:
                loose = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r}: not a valid IP address or CIDR ({exc})") from None
            raise ValueError(f"{entry!r}: host bits are set; did you mean {loose}?") from None
        return Destination(text=str(network), network=network)
    domain, wildcard = parse_domain(entry)
    return Destination(text=("*." if wildcard else "") + domain, domain=domain, wildcard=wildcard)


@dataclass(frozen=True)
class L7RuleData:
    domain: str
    methods: tuple[str, ...]
    path_prefix: str
    action: str

    def as_json(self) -> dict[str, object]:
        return {
            "domain": self.domain,
            "methods": list(self.methods),
            "path_prefix": self.path_prefix,
            "action": self.action,
        }

    def as_line(self) -> str:
        return f"{self.action} {self.domain} {','.join(self.methods) or '*'} {self.path_prefix}"


def parse_l7_rule(raw: object) -> L7RuleData:
    """Parse one rule given as a dict (API) or as a line "allow DOMAIN METHODS PATH" (form)."""
    if isinstance(raw, str):
        parts = raw.split()
        if len(parts) not in (2, 3, 4):
            raise ValueError(
                f"{raw.strip()!r}: expected 'allow|deny DOMAIN [METHODS] [PATH]',"
                " e.g. 'allow api.example.com GET,POST /v1/'"
            )
        action, domain = parts[0], parts[1]
        methods_text = parts[2] if len(parts) > 2 else "*"
        path = parts[3] if len(parts) > 3 else "/"
        methods: list[str] = [] if methods_text == "*" else methods_text.split(",")
    elif isinstance(raw, dict):
        action = raw.get("action", "")
        domain = raw.get("domain", "")
        path = raw.get("path_prefix", "/") or "/"
        raw_methods = raw.get("methods") or []
        if not isinstance(raw_methods, list) or not all(isinstance(m, str) for m in raw_methods):
            raise ValueError("methods must be a list of HTTP method names")
        methods = raw_methods
        if not isinstance(action, str) or not isinstance(domain, str) or not isinstance(path, str):
            raise ValueError("action, domain and path_prefix must be strings")
    else:
        raise ValueError("a rule must be an object with domain, methods, path_prefix and action")
    action = action.lower()
    if action not in L7_ACTIONS:
        raise ValueError(f"action {action!r} must be 'allow' or 'deny'")
    name, wildcard = parse_domain(domain)
    normalised = []
    for method in methods:
        upper = method.strip().upper()
        if upper not in HTTP_METHODS:
            raise ValueError(f"{method!r} is not an HTTP method ({', '.join(HTTP_METHODS)})")
        if upper in normalised:
            raise ValueError(f"method {upper} is listed twice")
        normalised.append(upper)
    if not path.startswith("/") or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise ValueError(f"path prefix {path!r} must start with '/' and contain no spaces or control characters")
    return L7RuleData(("*." if wildcard else "") + name, tuple(normalised), path, action)


@dataclass
class PolicyValidation:
    """Cleaned values plus field errors (block saving) and warnings (shown, saved anyway)."""

    allow_out: list[str] = field(default_factory=list)
    deny_out: list[str] = field(default_factory=list)
    allow_private: list[str] = field(default_factory=list)
    l7_rules: list[dict[str, object]] = field(default_factory=list)
    errors: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def error(self, field_name: str, message: str) -> None:
        self.errors.setdefault(field_name, []).append(message)


def _parse_list(name: str, entries: list[str], result: PolicyValidation) -> list[Destination]:
    parsed: list[Destination] = []
    seen: dict[str, int] = {}
    if len(entries) > MAX_LIST_ENTRIES:
        result.error(name, f"at most {MAX_LIST_ENTRIES} entries")
        return parsed
    for position, entry in enumerate(entries, start=1):
        try:
            destination = parse_destination(entry)
        except ValueError as exc:
            result.error(name, f"entry {position}: {exc}")
            continue
        if destination.text in seen:
            result.error(
                name,
                f"entry {position}: {destination.text} duplicates entry {seen[destination.text]}",
            )
            continue
        seen[destination.text] = position
        parsed.append(destination)
    return parsed


def validate_policy(
    *,
    allow_internet_access: bool,
    allow_out: list[str],
    deny_out: list[str],
    l7_rules: list[object],
    allow_private: list[str] | None = None,
) -> PolicyValidation:
    result = PolicyValidation()
    allow_private = allow_private or []
    if not allow_internet_access:
        off = (
            "Outbound access is off, so sandboxes have no network at all and this would have no effect:"
            " clear it or turn outbound on."
        )
        for name, given in (
            ("allow_out", allow_out),
            ("deny_out", deny_out),
            ("allow_private", allow_private),
            ("l7_rules", l7_rules),
        ):
            if given:
                result.error(name, off)
        return result

    allowed = _parse_list("allow_out", allow_out, result)
    denied = _parse_list("deny_out", deny_out, result)
    exceptions = _parse_private(allow_private, result)
    result.allow_out = [d.text for d in allowed]
    result.deny_out = [d.text for d in denied]
    result.allow_private = [d.text for d in exceptions]
    result.warnings.extend(list_warnings(allowed, denied, exceptions))

    if len(l7_rules) > MAX_L7_RULES:
        result.error("l7_rules", f"at most {MAX_L7_RULES} rules")
        return result
    seen_rules: dict[tuple[str, tuple[str, ...], str], int] = {}
    for position, raw in enumerate(l7_rules, start=1):
        try:
            rule = parse_l7_rule(raw)
        except ValueError as exc:
            result.error("l7_rules", f"rule {position}: {exc}")
            continue
        key = (rule.domain, tuple(sorted(rule.methods)), rule.path_prefix)
        if key in seen_rules:
            result.error("l7_rules", f"rule {position}: repeats the match of rule {seen_rules[key]}")
            continue
        seen_rules[key] = position
        result.l7_rules.append(rule.as_json())
    return result


def _parse_private(entries: list[str], result: PolicyValidation) -> list[Destination]:
    """Private CIDRs also allowed: each must be a CIDR inside one private range."""
    parsed = []
    for position, destination in enumerate(_parse_list("allow_private", entries, result), start=1):
        if destination.network is None:
            result.error(
                "allow_private", f"entry {position}: {destination.text} is not a CIDR (names go in the allow list)"
            )
        elif any(overlaps(destination.network, r) for r in LINK_LOCAL_RANGES):
            result.error("allow_private", f"entry {position}: link-local and metadata addresses are always denied")
        elif private_range_of(destination.network) is None:
            ranges = ", ".join(str(r) for r in PRIVATE_RANGES)
            result.error(
                "allow_private", f"entry {position}: {destination.text} is not inside a private range ({ranges})"
            )
        else:
            parsed.append(destination)
    return parsed


def list_warnings(allowed: list[Destination], denied: list[Destination], exceptions: list[Destination]) -> list[str]:
    """Entries that do nothing or more than they seem to, under the semantics above."""
    warnings: list[str] = []
    for allow in allowed:
        deny = next((d for d in denied if d.covers(allow)), None)
        if deny is not None:
            warnings.append(
                f"Allow entry {allow.text} has no effect: deny entry {deny.text} covers it and deny entries win."
            )
    for deny in denied:
        if deny.network is not None and deny.network in ALL_ADDRESSES and allowed:
            warnings.append(
                f"Deny entry {deny.text} refuses every IPv{deny.network.version} destination, the allowed ones too"
                " (deny entries win). The allow list alone already lets out only the listed destinations."
            )
    if allowed:
        same_kind_only = all(a.network is not None for a in allowed) or all(a.domain is not None for a in allowed)
        for deny in denied:
            inside = any(_overlap(allow, deny) for allow in allowed)
            if not inside and same_kind_only and (deny.network is not None) == (allowed[0].network is not None):
                warnings.append(
                    f"Deny entry {deny.text} has no effect: with an allow list only the listed destinations are"
                    " reachable, and it is inside none of them."
                )
    for allow in allowed:
        if allow.network is None:
            continue
        if any(overlaps(allow.network, r) for r in LINK_LOCAL_RANGES):
            warnings.append(f"Allow entry {allow.text}: link-local and metadata addresses inside it stay denied.")
        opened = [str(r) for r in PRIVATE_RANGES if overlaps(allow.network, r)]
        if opened and private_range_of(allow.network) is None:
            warnings.append(
                f"Allow entry {allow.text} also opens private addresses ({', '.join(opened)})."
                " To allow everything but the always-denied set, leave the allow list empty."
            )
    for exception in exceptions:
        if allowed and any(a.covers(exception) for a in allowed):
            warnings.append(f"Private exception {exception.text} repeats an allow entry that covers it already.")
    return warnings


def _overlap(a: Destination, b: Destination) -> bool:
    if a.network is not None and b.network is not None:
        return overlaps(a.network, b.network)
    return a.covers(b) or b.covers(a)
