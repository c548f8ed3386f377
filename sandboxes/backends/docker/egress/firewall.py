"""The Docker host's packet filter for sandbox networks: an nftables table of our own.

Every space's sandboxes sit on a bridge network of their own whose Linux bridge is named
`sbx-<11 hex>` (see `bridge_name`). The table `inet sandbox_console` rendered here holds the
fixed part for all of them at once, by that name prefix; what each sandbox may reach is a
chain of its own (`egress_rules`), jumped to from a verdict map keyed by the sandbox's
bridge and address, so a policy change is one small transaction that touches one chain:

- input hook: nothing from a sandbox bridge reaches the host itself (every address of the
  host: the bridge gateways, docker0, the uplink's addresses, link-local ones on dummy
  interfaces), except answers to connections the host opened, IPv6 neighbour discovery, and
  for sandboxes with outbound on their own gateway's resolver (udp/tcp 53) and the
  transparent proxy's intercept ports (tcp 3129/3130);
- forward hook: a packet from a bridge the console manages goes to its sandbox's chain
  (`sandboxes_v4` / `sandboxes_v6`); an address no sandbox holds is dropped (fail closed).
  Bridges of an older console (not in `managed`) keep the old rules: no link-local /
  metadata, no other sandbox bridge.

nftables evaluates every base chain on a hook and a drop in any of them is final, so these
drops hold whatever Docker's own iptables(-nft) rules accept. `render_ruleset` is idempotent
and keeps live state: it adds the table, sets and maps when missing and replaces only the
fixed chains' rules, in one transaction, so applying it again never drops the addresses the
resolver added to domain sets nor any sandbox's chain. Refusals are logged with a `log
prefix` naming the rule in words to NFLOG group `NFLOG_GROUP`, which ulogd2 writes as JSON
(`egress`).

Imports nothing of the project. `python -m sandboxes.backends.docker.firewall --print`
prints the ruleset (for an operator applying it on a remote engine's host); without
`--print` it applies it here (and `--start-log-reader` also starts ulogd2 for refusals).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

TABLE_FAMILY = "inet"
TABLE_NAME = "sandbox_console"
TABLE = f"{TABLE_FAMILY} {TABLE_NAME}"
BRIDGE_PREFIX = "sbx-"
# Linux interface names have at most 15 characters.
_BRIDGE_HASH_LEN = 15 - len(BRIDGE_PREFIX)
LINK_LOCAL_V4 = "169.254.0.0/16"
LINK_LOCAL_V6 = "fe80::/10"
NFT_TIMEOUT_S = 20
# The console-managed resolver on each space network's gateway, and the transparent HTTP/TLS
# proxy's intercept ports (traffic redirected there arrives addressed to the gateway).
DNS_PORT = 53
PROXY_HTTP_PORT = 3129
PROXY_TLS_PORT = 3130
# The netlink group refusals are logged to (ulogd2 reads it).
NFLOG_GROUP = 51
LOG_PREFIX = "egress: "
# Named sets and maps of the table (the dynamic state the fixed chains look up).
MAP_V4 = "sandboxes_v4"  # bridge . sandbox address : jump s_<id>
MAP_V6 = "sandboxes_v6"
MANAGED = "managed"  # bridges of networks this console manages
ONLINE_V4 = "online_v4"  # bridge . address of sandboxes with outbound on
ONLINE_V6 = "online_v6"
GATEWAYS_V4 = "gateways_v4"  # bridge . its gateway address
GATEWAYS_V6 = "gateways_v6"
_SETS = (
    (MAP_V4, "type ifname . ipv4_addr : verdict;"),
    (MAP_V6, "type ifname . ipv6_addr : verdict;"),
    (MANAGED, "type ifname;"),
    (ONLINE_V4, "type ifname . ipv4_addr;"),
    (ONLINE_V6, "type ifname . ipv6_addr;"),
    (GATEWAYS_V4, "type ifname . ipv4_addr;"),
    (GATEWAYS_V6, "type ifname . ipv6_addr;"),
)


def bridge_name(network_name: str) -> str:
    """The Linux bridge of a console sandbox network: the prefix the ruleset matches on."""
    return BRIDGE_PREFIX + hashlib.sha256(network_name.encode()).hexdigest()[:_BRIDGE_HASH_LEN]


def log_and_reject(rule: str) -> str:
    """The statement that refuses a packet and logs which rule did, in words (≤ 127 chars)."""
    prefix = (LOG_PREFIX + rule)[:127].replace('"', "")
    return f'log prefix "{prefix}" group {NFLOG_GROUP} reject with icmpx admin-prohibited'


@dataclass(frozen=True)
class HostService:
    """A port on the host that sandboxes may reach besides the resolver and the proxy."""

    protocol: str  # "tcp" | "udp"
    port: int


def render_ruleset(host_services: Iterable[HostService] = ()) -> str:
    """The fixed part of the `inet sandbox_console` table as an `nft -f` file (deterministic,
    idempotent, and keeping every set element and sandbox chain already loaded)."""
    sandbox_in = f'iifname "{BRIDGE_PREFIX}*"'
    allowed = [
        f"add rule {TABLE} sandbox_to_host {service.protocol} dport {int(service.port)} accept"
        for service in sorted(set(host_services), key=lambda s: (s.protocol, s.port))
        if service.protocol in ("tcp", "udp")
    ]
    proxy_ports = f"{{ {PROXY_HTTP_PORT}, {PROXY_TLS_PORT} }}"
    to_gateway = []
    for ip, online, gateways in (("ip", ONLINE_V4, GATEWAYS_V4), ("ip6", ONLINE_V6, GATEWAYS_V6)):
        match = f"iifname . {ip} saddr @{online} iifname . {ip} daddr @{gateways}"
        to_gateway += [
            f"add rule {TABLE} sandbox_to_host {match} meta l4proto {{ tcp, udp }} th dport {DNS_PORT} accept",
            f"add rule {TABLE} sandbox_to_host {match} tcp dport {proxy_ports} accept",
        ]
    lines = [
        "# Rendered by sandboxes/backends/docker/egress/firewall.py and applied with `nft -f`; edits are lost.",
        f"add table {TABLE}",
        *(f"add {'map' if ': verdict' in kind else 'set'} {TABLE} {name} {{ {kind} }}" for name, kind in _SETS),
        f"add chain {TABLE} input {{ type filter hook input priority filter; policy accept; }}",
        f"add chain {TABLE} forward {{ type filter hook forward priority filter; policy accept; }}",
        *(f"add chain {TABLE} {chain}" for chain in ("sandbox_to_host", "sandbox_forward")),
        *(f"flush chain {TABLE} {chain}" for chain in ("input", "sandbox_to_host", "forward", "sandbox_forward")),
        f"add rule {TABLE} input {sandbox_in} jump sandbox_to_host",
        "",
        "# Sandboxes never reach the host's own addresses, whichever interface holds them, but",
        "# for their gateway's resolver and proxy ports while outbound is on.",
        f"add rule {TABLE} sandbox_to_host ct state established,related accept",
        f"add rule {TABLE} sandbox_to_host icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, "
        "nd-router-solicit } accept",
        *to_gateway,
        *allowed,
        f"add rule {TABLE} sandbox_to_host iifname @{MANAGED} counter "
        + log_and_reject("always denied: the Docker host"),
        f"add rule {TABLE} sandbox_to_host counter drop",
        "",
        f"add rule {TABLE} forward {sandbox_in} jump sandbox_forward",
        "",
        "# Each sandbox's own chain (egress_rules); an address no sandbox holds goes nowhere.",
        f"add rule {TABLE} sandbox_forward iifname . ip saddr vmap @{MAP_V4}",
        f"add rule {TABLE} sandbox_forward iifname . ip6 saddr vmap @{MAP_V6}",
        f"add rule {TABLE} sandbox_forward iifname @{MANAGED} counter drop",
        "# Networks of an older console: not link-local / metadata, no other sandbox network.",
        f"add rule {TABLE} sandbox_forward ip daddr {LINK_LOCAL_V4} counter drop",
        f"add rule {TABLE} sandbox_forward ip6 daddr {LINK_LOCAL_V6} counter drop",
        f'add rule {TABLE} sandbox_forward oifname "{BRIDGE_PREFIX}*" counter drop',
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class FirewallResult:
    applied: bool
    detail: str


def run_nft(args: list[str], stdin: str | None = None) -> FirewallResult:
    nft = shutil.which("nft") or next((p for p in ("/usr/sbin/nft", "/sbin/nft") if os.path.exists(p)), None)
    if nft is None:
        return FirewallResult(False, "nft (Debian package nftables) is not installed on the console's host")
    try:
        done = subprocess.run(
            [nft, *args], input=stdin, capture_output=True, text=True, timeout=NFT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return FirewallResult(False, f"nft could not run: {exc}")
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip()[-500:]
        if os.geteuid() != 0:
            reason = f"the console does not run as root (uid {os.geteuid()}): {reason}"
        return FirewallResult(False, reason)
    if args[:1] in (["-j"], ["list"]):
        return FirewallResult(True, done.stdout)  # what was listed
    return FirewallResult(True, f"nftables table {TABLE_FAMILY} {TABLE_NAME} in force")


def present_keys() -> set[tuple[str, str]]:
    """The keys loaded in both sandbox maps now (`rules.map_keys` form)."""
    keys: set[tuple[str, str]] = set()
    for family, name in (("4", MAP_V4), ("6", MAP_V6)):
        done = run_nft(["-j", "list", "map", TABLE_FAMILY, TABLE_NAME, name])
        if not done.applied:
            continue
        for item in json.loads(done.detail).get("nftables", []):
            for element in (item.get("map") or {}).get("elem", []):
                key = element[0]["concat"] if isinstance(element, list) else None
                if key and len(key) == 2:
                    keys.add((family, f'"{key[0]}" . {key[1]}'))
    return keys


def gateways_of(bridge: str) -> tuple[list[str], list[str]]:
    """The gateway addresses (IPv4, IPv6) the table holds for a bridge (`gateways_v4/v6`)."""
    found: tuple[list[str], list[str]] = ([], [])
    for index, name in enumerate((GATEWAYS_V4, GATEWAYS_V6)):
        done = run_nft(["-j", "list", "set", TABLE_FAMILY, TABLE_NAME, name])
        if not done.applied:
            continue
        for item in json.loads(done.detail).get("nftables", []):
            for element in (item.get("set") or {}).get("elem", []):
                key = (element.get("concat") if isinstance(element, dict) else None) or []
                if len(key) == 2 and key[0] == bridge:
                    found[index].append(str(key[1]))
    return found


def table_set_names() -> list[str]:
    """The names of the table's sets now (terse: without their elements)."""
    done = run_nft(["-j", "-t", "list", "sets", TABLE_FAMILY])
    if not done.applied:
        return []
    items = (item.get("set") or {} for item in json.loads(done.detail).get("nftables", []))
    return [item["name"] for item in items if item.get("table") == TABLE_NAME and "name" in item]


def table_lines() -> list[str]:
    """The table as `nft list` prints it, one line each (empty when it is not loaded)."""
    done = run_nft(["list", "table", TABLE_FAMILY, TABLE_NAME])
    return done.detail.splitlines() if done.applied else []


def apply_ruleset(ruleset: str) -> FirewallResult:
    """Load the ruleset with `nft -f -`. Never raises: the caller decides what a failure means."""
    result = run_nft(["-f", "-"], ruleset)
    return result if result.applied else FirewallResult(False, f"nft refused the ruleset: {result.detail}")


def table_present() -> FirewallResult:
    """Whether the table is loaded now (read-only: a status check never changes the host).

    Only its presence is checked: the same table will hold live elements (addresses the
    resolver adds to sets) that re-applying the rendered file would drop.
    """
    result = run_nft(["list", "table", TABLE_FAMILY, TABLE_NAME])
    if result.applied:
        return FirewallResult(True, f"nftables table {TABLE_FAMILY} {TABLE_NAME} in force")
    if "No such file" in result.detail:
        return FirewallResult(False, f"the table {TABLE_FAMILY} {TABLE_NAME} is not loaded")
    return FirewallResult(False, result.detail)


def table_current() -> bool:
    """Whether the loaded table is this version's (it has the sandbox maps), read-only."""
    return run_nft(["list", "map", TABLE_FAMILY, TABLE_NAME, MAP_V4]).applied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render or apply the sandbox console's host packet filter.")
    parser.add_argument("--print", action="store_true", help="print the ruleset instead of applying it")
    args = parser.parse_args(argv)
    ruleset = render_ruleset()
    if args.print:
        sys.stdout.write(ruleset)
        return 0
    result = apply_ruleset(ruleset)
    print(result.detail, file=sys.stdout if result.applied else sys.stderr)
    return 0 if result.applied else 1


if __name__ == "__main__":
    sys.exit(main())
