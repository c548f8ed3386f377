"""What the Docker host enforces for one sandbox, read back from the host itself and judged
with the interpreters (`nft_reader`, `dnsmasq_reader`, `squid_reader`):

- the table `inet sandbox_console` as `nft -j` lists it;
- the configuration file of the dnsmasq serving the sandbox's network (found as a running
  dnsmasq whose configuration listens on the network's gateway);
- squid's configuration, when the backend runs one for HTTP rules.

A name is asked of the resolver first (NXDOMAIN refuses it; the answer's address joins the
sets its `nftset=` line names), then its address goes through the packet filter: the input
hook for an address of this host, else the forward hook, out of the interface the host
routes it to (`ip route get`, which sends nothing). HTTP and TLS to a name, when squid serves
the network, are squid's to decide. Nothing here sends a packet.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import netpolicy
from netpolicy.decide import TLS_PORT
from tests.support import dnsmasq_reader, squid_reader
from tests.support.nft_reader import Packet, Table

TABLE = ("inet", "sandbox_console")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def resolver_config(gateway: str) -> str:
    """The configuration text of the running dnsmasq that listens on `gateway`."""
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"dnsmasq"):
            continue
        for arg in argv[1:]:
            if arg.startswith(b"--conf-file="):
                path = arg.split(b"=", 1)[1].decode()
                try:
                    text = Path(path).read_text()
                except OSError:
                    continue
                if f"listen-address={gateway}" in text.splitlines():
                    return text
    raise AssertionError(f"no running dnsmasq listens on {gateway}")


def _route(address: IPAddress) -> tuple[str, str]:
    done = subprocess.run(
        ["ip", "-j", "route", "get", str(address)], capture_output=True, text=True, check=False, timeout=10
    )
    if done.returncode != 0:
        return "unreachable", ""
    route = json.loads(done.stdout)[0]
    return str(route.get("type", "unicast")), str(route.get("dev", ""))


@dataclass
class Enforced:
    """One sandbox's enforcement as read back."""

    bridge: str  # "" when the sandbox has no network (outbound off)
    source_v4: str
    source_v6: str
    table: Table
    resolver: dnsmasq_reader.Config | None
    squid: squid_reader.Config | None

    @classmethod
    def read(cls, bridge: str, source_v4: str, source_v6: str, gateway: str, squid_conf: Path | None) -> Enforced:
        table = Table.read(*TABLE)
        resolver = dnsmasq_reader.Config.parse(resolver_config(gateway)) if bridge else None
        squid = None
        if squid_conf is not None and squid_conf.exists():
            text = squid_conf.read_text()
            if any(
                line.split()[1].startswith(f"{gateway}:") for line in text.splitlines() if line.startswith("http_port")
            ):
                squid = squid_reader.Config.parse(text)
        return cls(bridge, source_v4, source_v6, table, resolver, squid)

    def judge(self, destination: netpolicy.Destination, asked_name: str | None) -> tuple[bool, str]:
        """(allowed, the layer and words that decided) for a destination whose name (as the
        sandbox spells it: `asked_name`) resolves to `destination.addresses[0]`."""
        if not self.bridge:
            return False, "off: the sandbox has no network"
        table = self.table
        address = netpolicy.unmapped(destination.addresses[0])
        if destination.name is not None:
            assert self.resolver is not None
            assert asked_name is not None
            answer = self.resolver.query(asked_name)
            if not answer.forwarded and answer.fixed is None:
                return False, "dns: NXDOMAIN"
            sets = dnsmasq_reader.set_names(answer.sets, address.version, TABLE)
            table = table.with_elements({name: [str(address)] for name in sets})
        source = self.source_v4 if address.version == 4 else self.source_v6
        if not source:
            return False, f"no IPv{address.version} address on the sandbox's network"
        port = destination.port or destination.web_port or 8080
        if self.squid is not None and destination.name is not None and destination.web_port is not None:
            # Redirected to squid on the gateway (the input hook lets it in); squid decides.
            outcome = self.squid.judge(
                squid_reader.Request(
                    ipaddress.ip_address(source),
                    address,
                    asked_name or destination.name,
                    destination.method or "GET",
                    destination.path or "/",
                    tls=destination.web_port == TLS_PORT,
                )
            )
            return outcome.allowed, f"squid: {outcome.note or outcome.line}"
        kind, device = _route(address)
        hook = "input" if kind == "local" else "forward"
        verdict = table.judge(Packet(self.bridge, device, ipaddress.ip_address(source), address, dport=port), hook)
        return verdict.allowed, f"nft {hook}: {verdict.verdict} {verdict.words}".strip()
