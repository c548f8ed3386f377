"""What an E2B or Cube control plane does with the network body an adapter sent, as its
documentation states it (shared reference "e2b-cube-protocol", 3.4 and the Cube table):

- `allow_internet_access: false`, or no network at all: nothing goes out;
- `allowOut[]`: CIDRs, addresses and domains (`*.example.com` wildcards); an allowOut entry
  beats a denyOut entry;
- `denyOut[]`: CIDRs and addresses only (`0.0.0.0/0` is "everything");
- a domain entry is matched against the HTTP Host / TLS SNI (ports 80 and 443 only): `x.test`
  is that host exactly, `*.x.test` the hosts below it (never `x.test` itself);
- anything else is judged by its address: allowed by an allowOut CIDR, else refused by a
  denyOut CIDR, else allowed;
- Cube's L7 `rules` (a list, first match wins, default deny: an HTTP request or TLS
  connection no rule matches is refused): `match.host` as a domain entry, `match.method`,
  `match.path` a prefix.

Pure: the body in, a verdict out. IPv4-mapped addresses are judged as the IPv4 address inside.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False
    return True


def _host_matches(pattern: str, host: str) -> bool:
    pattern, host = pattern.lower().rstrip("."), host.lower().rstrip(".")
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def _holds(entries: Sequence[str], address: IPAddress) -> bool:
    for entry in entries:
        if not _is_network(entry):
            continue
        network = ipaddress.ip_network(entry, strict=False)
        if network.version == address.version and address in network:
            return True
    return False


def remote_verdict(
    body: Mapping[str, Any],
    *,
    name: str | None,
    address: IPAddress,
    web: bool,
    http: bool = False,
    method: str | None = None,
    path: str | None = None,
) -> bool:
    """Whether the control plane lets a connection out: to `address` (the name's, when a name
    was asked), on a port where hosts are matched when `web`; `http`: an HTTP request or a TLS
    handshake the L7 rules see (with the request's method and path when known)."""
    network = body.get("network") or {}
    if body.get("allow_internet_access") is False:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    allow = [str(e) for e in network.get("allowOut") or []]
    deny = [str(e) for e in network.get("denyOut") or []]
    host_allowed = web and name is not None and any(_host_matches(e, name) for e in allow if not _is_network(e))
    verdict = True if host_allowed or _holds(allow, address) else not _holds(deny, address)
    rules = network.get("rules")
    if verdict and http and name is not None and isinstance(rules, list) and rules:
        for rule in rules:
            match = rule.get("match") or {}
            if not _host_matches(str(match.get("host") or match.get("sni") or ""), name):
                continue
            methods = [m.upper() for m in match.get("method") or []]
            if method is not None and methods and method.upper() not in methods:
                continue
            if path is not None and not path.startswith(match.get("path") or "/"):
                continue
            if method is None and path is None and methods:
                continue  # TLS: a method-bound rule cannot be checked by SNI
            return bool((rule.get("action") or {}).get("allow"))
        return False  # default deny
    return verdict
