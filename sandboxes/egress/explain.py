"""Would a destination be allowed, and by which rule? A pure evaluator of the console's
network semantics (console/network.py) over a space's spec, a session's grants and what the
config's backend can honour. Names are matched as names, never resolved: the address checks
(deny CIDRs, the always-denied ranges) apply to what a name resolves to, which is said.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from console.network import (
    LINK_LOCAL_RANGES,
    PRIVATE_RANGES,
    Destination,
    parse_destination,
    parse_domain,
    private_range_of,
)

from ..backends.base import NetworkCapabilities, NetworkSpec

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# The host's own loopback and the unspecified addresses: always denied (no entry opens them).
HOST_RANGES = tuple(ipaddress.ip_network(text) for text in ("127.0.0.0/8", "0.0.0.0/8", "::1/128", "::/128"))


def _as_checked(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address is judged as the IPv4 address it carries (never a
    private or link-local address in disguise)."""
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


@dataclass(frozen=True)
class Target:
    """What is asked about: an address or a name, with the HTTP path when a URL was given."""

    text: str
    address: IPAddress | None = None
    name: str | None = None
    path: str | None = None

    @property
    def entry(self) -> str:
        """The allow-list entry that names exactly this target (a /32 or /128, or the name)."""
        if self.address is not None:
            return str(ipaddress.ip_network(self.address))
        return self.name or ""


def parse_target(text: str) -> Target:
    """`host`, `host:port`, `[v6]:port`, an address or an http(s) URL. ValueError otherwise."""
    raw = text.strip()
    if not raw or len(raw) > 500 or any(ch.isspace() for ch in raw):
        raise ValueError("give one destination: a domain, an address, host:port or a URL")
    path = None
    host = raw
    if "://" in raw:
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{raw!r}: only http:// and https:// URLs")
        host, path = parts.hostname, parts.path or "/"
    elif raw.startswith("["):
        host = raw[1:].partition("]")[0]
    elif raw.count(":") == 1:
        host, _, port = raw.partition(":")
        if not port.isdigit():
            raise ValueError(f"{raw!r}: the port must be a number")
    try:
        return Target(raw, address=ipaddress.ip_address(host), path=path)
    except ValueError:
        pass
    name, wildcard = parse_domain(host)
    if wildcard:
        raise ValueError(f"{raw!r}: ask about one name, not a wildcard")
    return Target(raw, name=name, path=path)


def matches(entry: Destination, target: Target) -> bool:
    if target.address is not None:
        return entry.network is not None and target.address in entry.network
    if entry.domain is None or target.name is None:
        return False
    if entry.wildcard:
        return target.name.endswith("." + entry.domain)
    return target.name == entry.domain


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str


def decide(spec: NetworkSpec, target: Target) -> Decision:
    """The console's semantics for one target under one spec (space policy, grants merged)."""
    if not spec.allow_internet_access:
        return Decision(False, "outbound access is off")
    address = _as_checked(target.address) if target.address is not None else None
    if address is not None and any(address in r for r in LINK_LOCAL_RANGES):
        return Decision(False, "link-local and metadata addresses are always denied")
    if address is not None and any(address in r for r in HOST_RANGES):
        return Decision(False, "loopback and unspecified addresses (the host itself) are always denied")
    for text in spec.deny_out:
        if matches(parse_destination(text), target):
            return Decision(False, f"deny entry {text} (deny entries win)")
    private = next((r for r in PRIVATE_RANGES if address is not None and address in r), None)
    for text in spec.allow_private:
        if matches(parse_destination(text), target):
            return Decision(True, f"private address also allowed: {text}")
    if spec.allow_out:
        for text in spec.allow_out:
            entry = parse_destination(text)
            if not matches(entry, target):
                continue
            # A private address is opened only by an entry inside a private range, never
            # by a wider one (0.0.0.0/0): docs/network.md, "What a policy means".
            if private is not None and (entry.network is None or private_range_of(entry.network) is None):
                continue
            return Decision(True, f"allow entry {text}")
        return Decision(False, "not in the allow list (only listed destinations are reachable)")
    if private is not None:
        return Decision(False, f"private range {private} is always denied (no private exception covers it)")
    return Decision(True, "no allow list: every destination but the always-denied ones")


def l7_decision(spec: NetworkSpec, target: Target) -> Decision | None:
    """The first HTTP rule matching the target's host (and path, when a URL was given)."""
    if target.name is None:
        return None
    for index, rule in enumerate(spec.l7_rules, start=1):
        if not matches(parse_destination(rule.domain), target):
            continue
        if target.path is not None and not target.path.startswith(rule.path_prefix):
            continue
        methods = ",".join(rule.methods) or "any method"
        return Decision(rule.action == "allow", f"HTTP rule {index} ({rule.action} {methods} {rule.path_prefix})")
    return None


@dataclass(frozen=True)
class BackendView:
    """One config of the space as the explain answer shows it."""

    config: str
    label: str
    capabilities: NetworkCapabilities | None  # None: the backend did not answer
    problems: tuple[str, ...] = ()


@dataclass
class Explanation:
    target: Target
    allowed: bool
    rule: str
    lines: list[tuple[str, str]] = field(default_factory=list)  # (layer, text)

    def as_json(self) -> dict[str, object]:
        return {
            "destination": self.target.text,
            "allowed": self.allowed,
            "rule": self.rule,
            "layers": [{"layer": layer, "text": text} for layer, text in self.lines],
        }


def explain(
    target: Target,
    space_spec: NetworkSpec,
    *,
    session_spec: NetworkSpec | None = None,
    grants: tuple[str, ...] = (),
    backends: tuple[BackendView, ...] = (),
) -> Explanation:
    """The answer through every layer: space policy, session grants, the backends."""
    space = decide(space_spec, target)
    final_spec = session_spec or space_spec
    final = decide(final_spec, target) if session_spec is not None else space
    answer = Explanation(target, final.allowed, final.rule)
    verdict = "allowed" if space.allowed else "refused"
    answer.lines.append(("space policy", f"{verdict}: {space.rule}"))
    if target.name is not None and final.allowed:
        answer.lines.append(
            (
                "space policy",
                "matched by name: after resolution, the addresses it resolves to are checked too (deny CIDR"
                " entries, link-local and private ranges unless a CIDR entry allows them)",
            )
        )
    if session_spec is not None:
        if not grants:
            answer.lines.append(("session grants", "none"))
        elif final.allowed != space.allowed:
            answer.lines.append(("session grants", f"allowed by this session's grant: {final.rule}"))
        else:
            answer.lines.append(("session grants", f"{', '.join(grants)}: no change for this destination"))
    l7 = l7_decision(final_spec, target) if final.allowed else None
    if l7 is not None:
        answer.lines.append(("http rules", f"{'allowed' if l7.allowed else 'refused'}: {l7.rule}"))
        if not l7.allowed:
            answer.allowed, answer.rule = False, l7.rule
    for view in backends:
        if view.capabilities is None:
            answer.lines.append(("backend", f"config {view.config} ({view.label}): did not answer; not checked"))
        elif view.problems:
            answer.lines.append(
                (
                    "backend",
                    f"config {view.config} ({view.label}) cannot enforce {'; '.join(view.problems)}:"
                    " its sessions are refused (409) until the policy or the config changes",
                )
            )
        else:
            live = "applied live to running sessions" if view.capabilities.live_update else "fixed at create"
            answer.lines.append(("backend", f"config {view.config} ({view.label}) honours this policy ({live})"))
    return answer
