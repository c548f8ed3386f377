"""Would a destination be reached, and which rule decides? `decide` follows a connection
through the layers that enforce a policy, in their order:

1. the resolver (a name): a deny entry covering the name refuses it; with an allow list, a
   name no domain entry covers is refused (NXDOMAIN);
2. the packet filter (each address the name resolved to, or the address asked about): the
   host's own addresses; deny CIDRs; the never-reachable classes (link-local and metadata,
   loopback, other sandboxes); CIDR allow entries inside a private range and private
   exceptions; the private ranges; CIDR allow entries; the addresses of an allowed name;
   then "not in the allow list" with an allow list, else allowed;
3. HTTP rules, for HTTP (port 80) and TLS (port 443, by SNI) to a name, when the policy
   has them: the first rule matching host, method and path decides (TLS: host only); a host
   some rule names that no rule lets through is refused; other hosts follow the lists.

The words a refusal carries (`Decision.words`) are the ones every enforcing layer logs, so a
refusal read back from a log names its rule the same way (`parse_words`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from urllib.parse import urlsplit

from .addresses import AddressClass, Kind, Treatment, sandbox_class, unmapped
from .entries import Cidr, Domain, Entry, IPAddress, L7Rule, PolicyError, entry_for, normalise_name, parse_domain
from .policy import Policy, opened_range

HTTP_PORT, TLS_PORT = 80, 443


class Rule(StrEnum):
    """What decided. The values are the words refusals start with."""

    OUTBOUND_OFF = "outbound off"
    DENY_ENTRY = "deny entry"
    ALWAYS_DENIED = "always denied"
    NOT_ALLOWED = "not in the allow list"
    HTTP_RULE = "HTTP rule"
    HTTP_UNMATCHED = "no HTTP rule matches this request (its host is named by rules)"
    TLS_UNMATCHED = "no HTTP rule allows this host (TLS is checked by SNI only)"
    NO_UPSTREAM = "no upstream resolver set"
    HOST_MISMATCH = "the name sent does not resolve to the address connected to"
    # Allowed:
    ALLOW_ENTRY = "allow entry"
    PRIVATE_EXCEPTION = "private exception"
    NO_LIST = "no allow list"
    UNKNOWN = "unknown rule"


class Layer(StrEnum):
    POLICY = "policy"
    DNS = "dns"
    PACKET = "packet"
    HTTP = "http"
    TLS = "tls"


@dataclass(frozen=True)
class Decision:
    allowed: bool
    layer: Layer
    rule: Rule
    detail: str = ""  # the entry, the class ("private range"), the HTTP rule's description
    reason: str = ""  # the class's own words ("a private range", "the Docker host")

    @property
    def words(self) -> str:
        """The words every enforcing layer logs for this rule."""
        if self.rule in (Rule.DENY_ENTRY, Rule.ALLOW_ENTRY, Rule.PRIVATE_EXCEPTION, Rule.ALWAYS_DENIED):
            return f"{self.rule.value}{':' if self.rule == Rule.ALWAYS_DENIED else ''} {self.detail}".strip()
        if self.rule == Rule.HTTP_RULE:
            return self.detail
        return self.rule.value

    @property
    def sentence(self) -> str:
        """The decision in a sentence for an admin (explain)."""
        return {
            Rule.OUTBOUND_OFF: "outbound access is off",
            Rule.DENY_ENTRY: f"deny entry {self.detail} (deny entries win)",
            Rule.ALWAYS_DENIED: f"always denied: {self.reason or self.detail}",
            Rule.NOT_ALLOWED: "not in the allow list (only listed destinations are reachable)",
            Rule.ALLOW_ENTRY: f"allow entry {self.detail}",
            Rule.PRIVATE_EXCEPTION: f"private address also allowed: {self.detail}",
            Rule.NO_LIST: "no allow list: every destination but the always-denied ones",
        }.get(self.rule, self.words)


def always_denied(found: AddressClass) -> Decision:
    return Decision(False, Layer.PACKET, Rule.ALWAYS_DENIED, found.kind.value, found.reason)


# --- What is asked about ------------------------------------------------------------------------


@dataclass(frozen=True)
class Destination:
    """A name and/or addresses (what the name resolved to, or the address asked about), with
    the port, HTTP method and path when known."""

    text: str
    name: str | None = None
    addresses: tuple[IPAddress, ...] = ()
    port: int | None = None
    scheme: str | None = None  # "http" | "https" when a URL was given
    method: str | None = None
    path: str | None = None

    @property
    def entry(self) -> Entry:
        """The allow-list entry that names exactly this destination (the name, else a /32 or /128)."""
        if self.name is not None:
            return Domain(self.name)
        return entry_for(self.addresses[0])

    def resolved(self, *addresses: str | IPAddress) -> Destination:
        """The same destination with the addresses its name resolved to."""
        return replace(self, addresses=tuple(ipaddress.ip_address(a) for a in addresses))

    @property
    def web_port(self) -> int | None:
        """80 or 443 when the connection is HTTP or TLS (where HTTP rules apply), else None."""
        if self.port in (HTTP_PORT, TLS_PORT):
            return self.port
        if self.port is None and self.scheme is not None:
            return TLS_PORT if self.scheme == "https" else HTTP_PORT
        return None


def parse_destination(text: str) -> Destination:
    """`host`, `host:port`, `[v6]:port`, an address, or an http(s) URL; PolicyError otherwise."""
    raw = text.strip()
    if not raw or len(raw) > 500 or any(ch.isspace() for ch in raw):
        raise PolicyError("give one destination: a domain, an address, host:port or a URL")
    host, port, scheme, path = raw, None, None, None
    if "://" in raw:
        try:
            parts = urlsplit(raw)
            port = parts.port
        except ValueError:
            raise PolicyError(f"{raw!r}: not a URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{raw!r}: only http:// and https:// URLs")
        host, scheme, path = parts.hostname, parts.scheme, parts.path or "/"
    elif raw.startswith("["):
        host, _, rest = raw[1:].partition("]")
        if rest:
            port = _port(raw, rest.removeprefix(":"))
    elif raw.count(":") == 1:
        host, _, port_text = raw.partition(":")
        port = _port(raw, port_text)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
            raise PolicyError(f"{raw!r}: an address with a zone index (%...) names no destination; drop it")
        return Destination(raw, addresses=(address,), port=port, scheme=scheme, path=path)
    domain = parse_domain(host)
    if domain.wildcard:
        raise PolicyError(f"{raw!r}: ask about one name, not a wildcard")
    return Destination(raw, name=domain.name, port=port, scheme=scheme, path=path)


def _port(raw: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise PolicyError(f"{raw!r}: the port must be a number from 1 to 65535")
    return int(text)


# --- The decision ---------------------------------------------------------------------------------


def decide(policy: Policy, destination: Destination, *, reserved: Sequence[AddressClass] = ()) -> Decision:
    """The decision of every layer for one destination (see the module docstring). `reserved`:
    the backend's never-reachable ranges (its host's addresses, other sandboxes' networks)."""
    if not policy.allow_internet_access:
        return Decision(False, Layer.POLICY, Rule.OUTBOUND_OFF)
    name = normalise_name(destination.name) if destination.name is not None else None
    allowed_by: Domain | None = None
    if name is not None:
        denied = next((e for e in policy.domains("deny_out") if e.matches_name(name)), None)
        if denied is not None:
            return Decision(False, Layer.DNS, Rule.DENY_ENTRY, str(denied))
        allowed_by = next((e for e in policy.domains("allow_out") if e.matches_name(name)), None)
        if policy.allow_only and allowed_by is None:
            return Decision(False, Layer.DNS, Rule.NOT_ALLOWED)
    decision: Decision | None = None
    for address in destination.addresses:
        decision = _packet(policy, unmapped(address), allowed_by, tuple(reserved))
        if not decision.allowed:
            return decision
    if decision is None:  # a name not resolved: its addresses are checked when it is
        decision = (
            Decision(True, Layer.DNS, Rule.ALLOW_ENTRY, str(allowed_by))
            if allowed_by is not None
            else Decision(True, Layer.DNS, Rule.NO_LIST)
        )
    port = destination.web_port
    if policy.l7_rules and port is not None and name is not None:
        http = http_decision(
            policy.l7_rules, name, tls=port == TLS_PORT, method=destination.method, path=destination.path
        )
        if http is not None:
            return http
    return decision


def _packet(
    policy: Policy, address: IPAddress, allowed_by: Domain | None, reserved: tuple[AddressClass, ...]
) -> Decision:
    """The packet filter's decision for one address, in the order its rules are checked."""
    host = next((c for c in reserved if c.kind == Kind.HOST and c.holds(address)), None)
    if host is not None:  # the input hook: the host itself, whatever the lists say
        return always_denied(host)
    denied = next((e for e in policy.cidrs("deny_out") if e.matches_address(address)), None)
    if denied is not None:
        return Decision(False, Layer.PACKET, Rule.DENY_ENTRY, str(denied))
    found = sandbox_class(address, reserved)
    if found is not None and found.sandbox == Treatment.NEVER:
        return always_denied(found)
    if found is not None:  # a private range: opened only by an entry inside it
        opening = next(
            (e for e in policy.cidrs("allow_out") if e.matches_address(address) and opened_range(e) is not None), None
        )
        if opening is not None:
            return Decision(True, Layer.PACKET, Rule.ALLOW_ENTRY, str(opening))
        exception = next((e for e in policy.allow_private if e.matches_address(address)), None)
        if exception is not None:
            return Decision(True, Layer.PACKET, Rule.PRIVATE_EXCEPTION, str(exception))
        return always_denied(found)
    allowed = next((e for e in policy.cidrs("allow_out") if e.matches_address(address)), None)
    if allowed is not None:
        return Decision(True, Layer.PACKET, Rule.ALLOW_ENTRY, str(allowed))
    if allowed_by is not None:
        return Decision(True, Layer.PACKET, Rule.ALLOW_ENTRY, str(allowed_by))
    if policy.allow_only:
        return Decision(False, Layer.PACKET, Rule.NOT_ALLOWED)
    return Decision(True, Layer.PACKET, Rule.NO_LIST)


def http_decision(
    rules: Sequence[L7Rule], name: str, *, tls: bool, method: str | None = None, path: str | None = None
) -> Decision | None:
    """What the HTTP rules say about a request to `name` (TLS: its SNI only), or None when no
    rule names the host (the lists decide)."""
    layer = Layer.TLS if tls else Layer.HTTP
    named = False
    for position, rule in enumerate(rules, start=1):
        if not rule.domain.matches_name(name):
            continue
        named = True
        if tls:
            if rule.decides_tls:
                return Decision(rule.action == "allow", layer, Rule.HTTP_RULE, rule.describe(position))
            continue
        if rule.matches(name, method, path):
            return Decision(rule.action == "allow", layer, Rule.HTTP_RULE, rule.describe(position))
    if not named:
        return None
    return Decision(False, layer, Rule.TLS_UNMATCHED if tls else Rule.HTTP_UNMATCHED)


# --- Refusals read back -----------------------------------------------------------------------------

# Words of older consoles' refusals still in the log.
_LEGACY = {
    "other sandbox": (Rule.ALWAYS_DENIED, Kind.SANDBOX.value),
    "always-denied destination (loopback, link-local/metadata)": (Rule.ALWAYS_DENIED, Kind.LINK_LOCAL.value),
    "always-denied destination (the host itself or a sandbox network)": (Rule.ALWAYS_DENIED, Kind.HOST.value),
    "private range not allowed by a CIDR entry": (Rule.ALWAYS_DENIED, Kind.PRIVATE.value),
    "in the space's deny list": (Rule.DENY_ENTRY, ""),
    "not in the space's allow list": (Rule.NOT_ALLOWED, ""),
}


def parse_words(words: str) -> tuple[Rule, str]:
    """(rule, detail) of a refusal's words as a log recorded them."""
    text = words.strip()
    if text in _LEGACY:
        return _LEGACY[text]
    if text.startswith("the name sent"):
        return Rule.HOST_MISMATCH, ""
    for rule in Rule:
        if rule == Rule.UNKNOWN:
            continue
        if text == rule.value or text.startswith(rule.value + " ") or text.startswith(rule.value + ":"):
            detail = text[len(rule.value) :].lstrip(":").strip()
            if rule == Rule.HTTP_RULE:
                detail = text
            return rule, detail
    return Rule.UNKNOWN, text


def never_reachable(words: str) -> bool:
    """Whether a refusal with these words names a class no entry can open (the host, other
    sandboxes, link-local and metadata, loopback)."""
    rule, detail = parse_words(words)
    return rule == Rule.ALWAYS_DENIED and detail in (k.value for k in Kind if k != Kind.PRIVATE)


def cidr_of(address: str | IPAddress) -> Cidr:
    return entry_for(ipaddress.ip_address(address))
