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
- Cube's L7 `rules` (a list): every name a rule's `host` or `sni` carries is an L7 target
  (network-agent extractL7AllowOutTargetsFromRules: lower case, no trailing dot or port;
  `*.x` the names below `x`); HTTP (80) and TLS (443) to such a name go to Cube's egress
  proxy before the lists are looked at (CubeNet classify_egress_flow), which decides them as
  its source does (tests/fakes/cube_egress.py, after CubeEgress/lua/access_phase.lua): first
  match wins, no match refused; `host` against the Host header, `sni` against the TLS server
  name (none on plain HTTP), exact or `*.x`; `method` any-of; `path` exact or `*`-ended
  prefix. Everything else is judged by the lists alone (a name sharing an address with a
  target is not modelled: it depends on what was resolved before).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from tests.fakes.cube_egress import egress_allows

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
    tls: bool = False,
    method: str | None = None,
    path: str | None = None,
) -> bool:
    """Whether the control plane lets a connection out: to `address` (the name's, when a name
    was asked), on a port where hosts are matched when `web`; `http`: an HTTP request or (`tls`)
    a TLS connection the L7 rules see (with the request's method and path when known)."""
    network = body.get("network") or {}
    rules = network.get("rules")
    if http and name is not None and isinstance(rules, list) and rules and _l7_target(rules, name):
        return egress_allows(
            rules,
            scheme="https" if tls else "http",
            sni=name if tls else None,
            host=name,
            method=method.upper() if method else None,
            path=path,
        )
    if body.get("allow_internet_access") is False:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    allow = [str(e) for e in network.get("allowOut") or []]
    deny = [str(e) for e in network.get("denyOut") or []]
    host_allowed = web and name is not None and any(_host_matches(e, name) for e in allow if not _is_network(e))
    return True if host_allowed or _holds(allow, address) else not _holds(deny, address)


def _l7_target(rules: Sequence[Mapping[str, Any]], name: str) -> bool:
    """Whether `name` is one of the L7 targets Cube takes from the rules' `host`/`sni`."""
    for rule in rules:
        match = rule.get("match") or {}
        for field in ("host", "sni"):
            value = match.get(field)
            if isinstance(value, str):
                target = value.strip().lower().rstrip(".")
                if not target.startswith("["):
                    target = target.split(":", 1)[0]
                if _host_matches(target, name):
                    return True
    return False
