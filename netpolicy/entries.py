"""The entries of a network policy as typed values: a `Cidr`, a `Domain` (plain or wildcard)
and an HTTP rule (`L7Rule`), each parsed from the admin's text by one parser with the
admin-facing error messages, and each knowing what it matches and what it covers.

A plain domain and its subdomains are one destination: `example.com` matches
`example.com`, `api.example.com` and `a.b.example.com`; `*.example.com` matches the names
below `example.com` only, never `example.com` itself. Names are compared without case and
without a trailing dot. Every layer follows this (the policy form says it too).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
L7_ACTIONS = ("allow", "deny")
MAX_NAME = 253

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class PolicyError(ValueError):
    """An entry or a rule the admin wrote that is not one (the message is for the admin)."""


def normalise_name(name: str) -> str:
    """A host name as policies compare it: lower case, without the trailing dot."""
    return name.strip().rstrip(".").lower()


@dataclass(frozen=True)
class Cidr:
    """An address range of an allow or deny list (a bare address is its /32 or /128)."""

    network: IPNetwork

    def __str__(self) -> str:
        return str(self.network)

    @property
    def version(self) -> int:
        return self.network.version

    def matches_address(self, address: IPAddress) -> bool:
        return address.version == self.network.version and address in self.network

    def covers(self, other: Entry) -> bool:
        """Every address `other` matches is matched by this range (a name covers nothing)."""
        return (
            isinstance(other, Cidr) and other.version == self.version and other.network.subnet_of(self.network)  # type: ignore[arg-type]
        )

    def overlaps(self, other: Cidr) -> bool:
        return other.version == self.version and self.network.overlaps(other.network)


@dataclass(frozen=True)
class Domain:
    """A domain entry: `name` and the names below it, or (`wildcard`) the names below only."""

    name: str  # normalised, without the "*."
    wildcard: bool = False

    def __str__(self) -> str:
        return f"*.{self.name}" if self.wildcard else self.name

    def matches_name(self, name: str) -> bool:
        name = normalise_name(name)
        below = name.endswith("." + self.name)
        return below if self.wildcard else below or name == self.name

    def covers(self, other: Entry) -> bool:
        """Every name `other` matches is matched by this entry (an address range: never)."""
        if not isinstance(other, Domain):
            return False
        if other.name == self.name:
            # x.test covers *.x.test and itself; *.x.test covers only *.x.test.
            return not self.wildcard or other.wildcard
        return other.name.endswith("." + self.name)

    @property
    def parent(self) -> str:
        """The name that every name this entry matches ends with."""
        return self.name


Entry = Cidr | Domain


def parse_domain(text: str) -> Domain:
    """`example.com` or `*.example.com`; PolicyError with a message for the admin otherwise."""
    raw = text.strip()
    wildcard = raw.startswith("*.")
    name = raw[2:] if wildcard else raw
    if "*" in name:
        raise PolicyError(f"{text!r}: a wildcard is only allowed as a leading '*.' (e.g. *.example.com)")
    name = normalise_name(name)
    if len(name) > MAX_NAME:
        raise PolicyError(f"{text!r}: a domain name has at most {MAX_NAME} characters")
    labels = name.split(".")
    if len(labels) < 2:
        raise PolicyError(f"{text!r}: not a domain name (expected something like example.com)")
    for label in labels:
        if not _LABEL.match(label):
            raise PolicyError(f"{text!r}: {label!r} is not a valid domain label")
    if labels[-1].isdigit():
        raise PolicyError(f"{text!r}: looks like a malformed IP address")
    return Domain(name, wildcard)


def parse_entry(text: str) -> Entry:
    """One line of an allow or deny list: a CIDR (or one address), or a domain."""
    entry = text.strip()
    if not entry:
        raise PolicyError("empty entry")
    if any(ch.isspace() for ch in entry):
        raise PolicyError(f"{entry!r}: entries cannot contain spaces (one entry per line)")
    if "/" in entry or ":" in entry or entry.replace(".", "").isdigit():
        if "%" in entry:
            # ipaddress keeps a zone index in the network's text: nftables cannot load it.
            raise PolicyError(f"{entry!r}: an address with a zone index (%...) names no destination; drop it")
        try:
            return Cidr(ipaddress.ip_network(entry, strict=True))
        except ValueError as exc:
            try:
                loose = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise PolicyError(f"{entry!r}: not a valid IP address or CIDR ({exc})") from None
            raise PolicyError(f"{entry!r}: host bits are set; did you mean {loose}?") from None
    return parse_domain(entry)


def entry_for(address: IPAddress) -> Cidr:
    """The entry that names exactly one address (its /32 or /128)."""
    return Cidr(ipaddress.ip_network(address))


@dataclass(frozen=True)
class L7Rule:
    """An HTTP rule: for requests to `domain` (plain or wildcard, as list entries), with one
    of `methods` (empty: any) and a path starting with `path_prefix`, `action` decides."""

    domain: Domain
    methods: tuple[str, ...] = ()
    path_prefix: str = "/"
    action: Literal["allow", "deny"] = "allow"

    def as_json(self) -> dict[str, object]:
        return {
            "domain": str(self.domain),
            "methods": list(self.methods),
            "path_prefix": self.path_prefix,
            "action": self.action,
        }

    def as_line(self) -> str:
        return f"{self.action} {self.domain} {','.join(self.methods) or '*'} {self.path_prefix}"

    def describe(self, position: int) -> str:
        """ "HTTP rule 2 (deny GET example.test/admin)": the words refusals carry."""
        methods = ",".join(self.methods) or "any method"
        path = "" if self.path_prefix == "/" else self.path_prefix
        return f"HTTP rule {position} ({self.action} {methods} {self.domain}{path})"

    def matches(self, name: str, method: str | None = None, path: str | None = None) -> bool:
        """Whether a request to `name` (with `method` and `path` when known) is this rule's."""
        if not self.domain.matches_name(name):
            return False
        if method is not None and self.methods and method.upper() not in self.methods:
            return False
        return path is None or path.startswith(self.path_prefix)

    @property
    def decides_tls(self) -> bool:
        """Whether the rule decides a TLS connection by its SNI alone: an allow (whatever its
        methods and path), or a deny of every method and path. A narrower deny cannot be
        checked without decryption and is skipped for TLS."""
        return self.action == "allow" or (not self.methods and self.path_prefix == "/")


def parse_l7_rule(raw: object) -> L7Rule:
    """One rule given as a dict (API, stored) or as a line "allow DOMAIN [METHODS] [PATH]" (form)."""
    if isinstance(raw, L7Rule):
        return raw
    if isinstance(raw, str):
        parts = raw.split()
        if len(parts) not in (2, 3, 4):
            raise PolicyError(
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
        if not isinstance(raw_methods, list | tuple) or not all(isinstance(m, str) for m in raw_methods):
            raise PolicyError("methods must be a list of HTTP method names")
        methods = list(raw_methods)
        if not isinstance(action, str) or not isinstance(domain, str) or not isinstance(path, str):
            raise PolicyError("action, domain and path_prefix must be strings")
    else:
        raise PolicyError("a rule must be an object with domain, methods, path_prefix and action")
    action = action.lower()
    if action not in L7_ACTIONS:
        raise PolicyError(f"action {action!r} must be 'allow' or 'deny'")
    parsed_domain = parse_domain(domain)
    normalised: list[str] = []
    for method in methods:
        upper = method.strip().upper()
        if upper not in HTTP_METHODS:
            raise PolicyError(f"{method!r} is not an HTTP method ({', '.join(HTTP_METHODS)})")
        if upper in normalised:
            raise PolicyError(f"method {upper} is listed twice")
        normalised.append(upper)
    if not path.startswith("/") or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        raise PolicyError(f"path prefix {path!r} must start with '/' and contain no spaces or control characters")
    return L7Rule(parsed_domain, tuple(normalised), path, "allow" if action == "allow" else "deny")
