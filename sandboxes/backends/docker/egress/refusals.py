"""Refusals read back, a pure read: the packet filter's (ulogd2's JSON lines), the resolvers'
(dnsmasq's query logs) and squid's (its access log), each mapped from its source address to
the sandbox that held it (the state files, gone sandboxes' included), with the rule in the
words the enforcing layer logged (`netpolicy.Decision.words`). Nothing is pruned, refreshed
or restarted here: that is housekeeping's.

Imports nothing of the project but the contract and the component's parts.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ...base import ErrorKind, RemoteError
from ...capabilities import EgressRefusal
from . import dns
from .firewall import LOG_PREFIX
from .logs import REFUSALS, read_packets
from .state import EgressState, SandboxState

# A name the lists allow, refused because the resolver has no upstream (the option dns_upstream).
NO_UPSTREAM_RULE = "no upstream resolver set (EGRESS_DNS_UPSTREAM)"
ProxyReader = Callable[[str, Callable[[str], str]], tuple[list[EgressRefusal], str]]


def read(
    state: EgressState, cursor: str, *, upstream: str, proxy: ProxyReader | None
) -> tuple[list[EgressRefusal], str]:
    """Refusals logged after `cursor`, and the next cursor (see `EgressCapability.refusals`)."""
    positions = decode_cursor(cursor)
    by_address: dict[tuple[str, str], SandboxState] = {}
    for sandbox in state.all(include_gone=True):
        for address in (*sandbox.v4, *sandbox.v6):
            previous = by_address.get((sandbox.bridge, address))
            if previous is None or sandbox.online:
                by_address[(sandbox.bridge, address)] = sandbox
    found: list[EgressRefusal] = []
    packets, positions["p"] = read_packets(state.path(REFUSALS), positions.get("p", 0))
    for record in packets:
        prefix = str(record.get("oob.prefix", ""))
        source = by_address.get((str(record.get("oob.in", "")), str(record.get("src_ip", ""))))
        if not prefix.startswith(LOG_PREFIX) or source is None:
            continue
        destination = str(record.get("dest_ip", ""))
        if record.get("dest_port") is not None:
            port = record["dest_port"]
            destination = f"[{destination}]:{port}" if ":" in destination else f"{destination}:{port}"
        at = datetime.fromtimestamp(int(record.get("oob.time.sec", 0)), UTC)
        protocol = {6: "tcp", 17: "udp", 1: "icmp", 58: "icmpv6"}.get(int(record.get("ip.protocol", 0) or 0), "")
        found.append(EgressRefusal(at, source.sandbox_id, "packet", destination, prefix[len(LOG_PREFIX) :], protocol))
    dns_positions = positions.setdefault("d", {})
    folder = state.path("dns")
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".log"):
                continue
            bridge = name[: -len(".log")]
            refused, dns_positions[bridge] = dns.read_refusals(os.path.join(folder, name), dns_positions.get(bridge, 0))
            last: tuple[str, str, datetime] | None = None
            for item in refused:
                source = by_address.get((bridge, item.client))
                if source is None or last == (source.sandbox_id, item.name, item.at):
                    continue  # unknown client, or the AAAA twin of the A query just seen
                last = (source.sandbox_id, item.name, item.at)
                found.append(
                    EgressRefusal(item.at, source.sandbox_id, "dns", item.name, dns_rule(source, item.name, upstream))
                )
    if proxy is not None:
        # Requests squid refused (HTTP rules, TLS by SNI): its log names the client address.
        by_client = {address: sandbox.sandbox_id for (_, address), sandbox in by_address.items()}
        refused_http, positions["h"] = proxy(str(positions.get("h", "")), lambda address: by_client.get(address, ""))
        found += [refusal for refusal in refused_http if refusal.sandbox_id]
    found.sort(key=lambda r: r.at)
    return found, json.dumps(positions, separators=(",", ":"), sort_keys=True)


def dns_rule(sandbox: SandboxState, name: str, upstream: str) -> str:
    """The words for a name the network's resolver refused, re-derived from the sandbox's lists
    (`netpolicy.Domain.matches_name`). A name the lists let through was refused because no
    upstream resolver is set (the resolver then answers nothing): saying "not in the allow
    list" would send the admin to approve it."""
    spec = sandbox.spec
    for pattern in spec.domains("deny_out"):
        if pattern.matches_name(name):
            return f"deny entry {pattern}"
    if not sandbox.online:
        return "outbound off"
    if not upstream and (not spec.allow_only or any(p.matches_name(name) for p in spec.domains("allow_out"))):
        return NO_UPSTREAM_RULE
    return "not in the allow list"


def decode_cursor(cursor: str) -> dict[str, Any]:
    if not cursor:
        return {"p": 0, "d": {}}
    try:
        data = json.loads(cursor)
    except ValueError:
        raise RemoteError(ErrorKind.INVALID, "malformed egress cursor") from None
    if not isinstance(data, dict):
        raise RemoteError(ErrorKind.INVALID, "malformed egress cursor")
    return data
