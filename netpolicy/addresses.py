"""The special address classes, written once, with the reason for each and how two consumers
treat them:

- `sandbox`: what a sandbox's outbound policy does with the class. NEVER: refused whatever
  the lists say (link-local and metadata, loopback, unspecified); OPENABLE: refused unless a
  CIDR allow entry *inside* it or a private exception opens that part (the private ranges);
  PUBLIC: an ordinary destination the lists decide.
- `endpoint`: what the guard does with a tenant-controlled URL that resolves there (a backend
  endpoint). NEVER: refused; OPENABLE: only with the config's private-endpoints opt-in.

Both the console (validation, explain, approvals) and the backends (the Docker packet filter
and proxy, the E2B/Cube deny lists, the guarded transport) read this table; none holds a
range list of its own. The Docker host's own addresses and other sandboxes' networks are no
fixed range: a backend that knows them hands them to `decide` as `reserved` classes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from .entries import IPAddress, IPNetwork


class Treatment(StrEnum):
    NEVER = "never"
    OPENABLE = "openable"
    PUBLIC = "public"


class Kind(StrEnum):
    """Why a class is special, in the words refusals use."""

    LINK_LOCAL = "link-local/metadata"
    LOOPBACK = "loopback/unspecified"
    PRIVATE = "private range"
    HOST = "the Docker host"
    SANDBOX = "other sandbox"
    SPECIAL = "special-purpose range"


@dataclass(frozen=True)
class AddressClass:
    network: IPNetwork
    reason: str  # "a private range", "link-local (cloud metadata lives here)", ...
    kind: Kind
    sandbox: Treatment
    endpoint: Treatment

    def holds(self, address: IPAddress) -> bool:
        return address.version == self.network.version and address in self.network


def _c(cidr: str, reason: str, kind: Kind, sandbox: Treatment, endpoint: Treatment) -> AddressClass:
    return AddressClass(ipaddress.ip_network(cidr), reason, kind, sandbox, endpoint)


_N, _O, _P = Treatment.NEVER, Treatment.OPENABLE, Treatment.PUBLIC
# Most specific first where classes nest (a metadata address inside a private range).
ADDRESS_CLASSES: tuple[AddressClass, ...] = (
    _c("169.254.0.0/16", "link-local (cloud metadata lives here)", Kind.LINK_LOCAL, _N, _N),
    _c("fe80::/10", "link-local", Kind.LINK_LOCAL, _N, _N),
    _c("100.100.100.200/32", "a cloud metadata address", Kind.LINK_LOCAL, _N, _N),
    _c("168.63.129.16/32", "a cloud metadata address", Kind.LINK_LOCAL, _N, _N),
    _c("fd00:ec2::254/128", "a cloud metadata address", Kind.LINK_LOCAL, _N, _N),
    _c("0.0.0.0/8", "unspecified", Kind.LOOPBACK, _N, _N),
    _c("::/128", "unspecified", Kind.LOOPBACK, _N, _N),
    _c("127.0.0.0/8", "loopback", Kind.LOOPBACK, _N, _O),
    _c("::1/128", "loopback", Kind.LOOPBACK, _N, _O),
    # NAT64 (64:ff9b::/96) forms of the never-reachable IPv4 classes: a host with a NAT64
    # gateway sends them to the IPv4 address inside (64:ff9b::a9fe:a9fe is the metadata).
    _c("64:ff9b::a9fe:0/112", "link-local through NAT64 (cloud metadata lives here)", Kind.LINK_LOCAL, _N, _N),
    _c("64:ff9b::6464:64c8/128", "a cloud metadata address through NAT64", Kind.LINK_LOCAL, _N, _N),
    _c("64:ff9b::a83f:8110/128", "a cloud metadata address through NAT64", Kind.LINK_LOCAL, _N, _N),
    _c("64:ff9b::/104", "unspecified through NAT64", Kind.LOOPBACK, _N, _N),
    _c("64:ff9b::7f00:0/104", "loopback through NAT64", Kind.LOOPBACK, _N, _N),
    # IPv4-mapped: a socket sends these as IPv4 to the address inside, judged as that.
    _c("::ffff:0:0/96", "IPv4-mapped", Kind.SPECIAL, _N, _P),
    _c("255.255.255.255/32", "broadcast", Kind.PRIVATE, _O, _N),
    _c("224.0.0.0/4", "multicast", Kind.PRIVATE, _O, _N),
    _c("ff00::/8", "multicast", Kind.PRIVATE, _O, _N),
    _c("10.0.0.0/8", "a private range", Kind.PRIVATE, _O, _O),
    _c("172.16.0.0/12", "a private range", Kind.PRIVATE, _O, _O),
    _c("192.168.0.0/16", "a private range", Kind.PRIVATE, _O, _O),
    _c("fc00::/7", "a private range", Kind.PRIVATE, _O, _O),
    _c("fec0::/10", "a private range (site-local)", Kind.PRIVATE, _O, _O),
    _c("100.64.0.0/10", "shared address space (100.64.0.0/10)", Kind.PRIVATE, _O, _O),
    _c("64:ff9b::/96", "the NAT64 prefix (64:ff9b::/96)", Kind.PRIVATE, _O, _P),
    _c("64:ff9b:1::/48", "a local-use NAT64 prefix (64:ff9b:1::/48)", Kind.PRIVATE, _O, _O),
    _c("192.0.0.0/24", "an IETF protocol assignment (192.0.0.0/24)", Kind.PRIVATE, _O, _O),
    _c("198.18.0.0/15", "the benchmarking range (198.18.0.0/15)", Kind.PRIVATE, _O, _O),
    _c("240.0.0.0/4", "reserved (240.0.0.0/4)", Kind.PRIVATE, _O, _O),
    # Not routed on the internet, but ordinary destinations for a sandbox (tests and labs use
    # them); not public enough for a backend endpoint without the opt-in.
    _c("192.0.2.0/24", "a documentation range", Kind.SPECIAL, _P, _O),
    _c("198.51.100.0/24", "a documentation range", Kind.SPECIAL, _P, _O),
    _c("203.0.113.0/24", "a documentation range", Kind.SPECIAL, _P, _O),
    _c("192.88.99.0/24", "the deprecated 6to4 relay range", Kind.SPECIAL, _P, _O),
    _c("100::/64", "a discard-only range", Kind.SPECIAL, _P, _O),
    _c("2001:2::/48", "the benchmarking range (2001:2::/48)", Kind.SPECIAL, _P, _O),
    _c("2001:db8::/32", "a documentation range", Kind.SPECIAL, _P, _O),
    _c("3fff::/20", "a documentation range", Kind.SPECIAL, _P, _O),
    _c("2001::/23", "an IETF protocol assignment (2001::/23)", Kind.SPECIAL, _P, _O),
    _c("5f00::/16", "a segment-routing range", Kind.SPECIAL, _P, _O),
)
del _N, _O, _P


def classes(*, sandbox: Treatment | None = None, endpoint: Treatment | None = None) -> tuple[AddressClass, ...]:
    """The classes with that treatment (both given: both must hold)."""
    return tuple(
        c
        for c in ADDRESS_CLASSES
        if (sandbox is None or c.sandbox == sandbox) and (endpoint is None or c.endpoint == endpoint)
    )


def networks(found: tuple[AddressClass, ...], version: int | None = None) -> tuple[IPNetwork, ...]:
    """The classes' networks (of one IP version), in table order, without repeats."""
    return tuple(dict.fromkeys(c.network for c in found if version is None or c.network.version == version))


def sandbox_class(address: IPAddress, reserved: tuple[AddressClass, ...] = ()) -> AddressClass | None:
    """The class that decides `address` for a sandbox's outbound policy (NEVER before OPENABLE;
    `reserved`: the backend's own, the host and other sandboxes, which are NEVER), or None for
    an ordinary destination."""
    address = unmapped(address)
    for treatment in (Treatment.NEVER, Treatment.OPENABLE):
        for found in (*reserved, *ADDRESS_CLASSES):
            if found.sandbox == treatment and found.holds(address):
                return found
    return None


def unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it carries (what the socket sends)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def reserved_class(network: IPNetwork, kind: Kind, reason: str) -> AddressClass:
    """A backend's own never-reachable range (the host's addresses, other sandboxes)."""
    return AddressClass(network, reason, kind, Treatment.NEVER, Treatment.NEVER)


# --- IPv6 forms that carry an IPv4 address (the guard judges the address inside) -------------

_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # SIIT (RFC 2765)
_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible ::a.b.c.d
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215, any RFC 6052 layout
_SIXTOFOUR = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")


def _rfc6052_ipv4(value: int, prefix_len: int) -> ipaddress.IPv4Address:
    """The IPv4 address at the RFC 6052 position for a NAT64 prefix of this length."""
    if prefix_len == 96:
        return ipaddress.IPv4Address(value & 0xFFFFFFFF)
    # Bits 64-71 (the "u" octet) hold no address bits: drop them, then read the 32 bits
    # that follow the prefix (prefixes of 32 to 64 bits end before the u octet).
    without_u = ((value >> 64) << 56) | (value & ((1 << 56) - 1))
    return ipaddress.IPv4Address((without_u >> (120 - prefix_len - 32)) & 0xFFFFFFFF)


def embedded_ipv4(ip: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address embeds (mapped, compatible, NAT64, 6to4, Teredo)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return []
    value = int(ip)
    if ip in _MAPPED or ip in _TRANSLATED or ip in NAT64:
        return [ipaddress.IPv4Address(value & 0xFFFFFFFF)]
    if ip in _COMPATIBLE:
        # :: and ::1 are the IPv6 unspecified and loopback addresses, judged as themselves.
        return [ipaddress.IPv4Address(value)] if value > 1 else []
    if ip in NAT64_LOCAL:
        # The prefix length in use is not known: judge the address at each RFC 6052 position
        # (zero bits read as 0.0.0.0 at unused positions mean nothing), and the prefix too.
        candidates = {_rfc6052_ipv4(value, length) for length in (48, 56, 64, 96)}
        return sorted(c for c in candidates if c not in _THIS_NETWORK)
    if ip in _SIXTOFOUR:
        return [ipaddress.IPv4Address((value >> 80) & 0xFFFFFFFF)]
    if ip in _TEREDO and ip.teredo is not None:
        server, client = ip.teredo
        return [server, client]
    return []
