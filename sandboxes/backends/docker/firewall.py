"""The Docker host's packet filter for sandbox networks: an nftables table of our own.

Every space's sandboxes sit on a bridge network of their own whose Linux bridge is named
`sbx-<11 hex>` (see `bridge_name`). The table `inet sandbox_console` rendered here holds for
all of them at once, by that name prefix, so a network created a moment ago is covered before
anything is re-rendered:

- input hook: nothing from a sandbox bridge reaches the host itself (every address of the
  host: the bridge gateways, docker0, the uplink's addresses, link-local ones on dummy
  interfaces), except answers to connections the host opened;
- forward hook: nothing from a sandbox bridge goes to link-local / metadata addresses
  (169.254.0.0/16, fe80::/10) or into any sandbox bridge (another space's network, and the
  own one too: inter-container traffic is off, which the bridge's enable_icc=false also says).

nftables evaluates every base chain on a hook and a drop in any of them is final, so these
drops hold whatever Docker's own iptables(-nft) rules accept. The file replaces the table in
one transaction (`table …` / `delete table …` / the definition), so applying is idempotent
and never leaves a moment without the rules. The issue "network switches enforced on Docker"
adds per-space allow/deny sets and the resolver/proxy exceptions to this same table and
renderer (`host_services` is the place for the latter).

Imports nothing of the project. `python -m sandboxes.backends.docker.firewall --print`
prints the ruleset (for an operator applying it on a remote engine's host); without
`--print` it applies it here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass

TABLE_FAMILY = "inet"
TABLE_NAME = "sandbox_console"
BRIDGE_PREFIX = "sbx-"
# Linux interface names have at most 15 characters.
_BRIDGE_HASH_LEN = 15 - len(BRIDGE_PREFIX)
LINK_LOCAL_V4 = "169.254.0.0/16"
LINK_LOCAL_V6 = "fe80::/10"
NFT_TIMEOUT_S = 20


def bridge_name(network_name: str) -> str:
    """The Linux bridge of a console sandbox network: the prefix the ruleset matches on."""
    return BRIDGE_PREFIX + hashlib.sha256(network_name.encode()).hexdigest()[:_BRIDGE_HASH_LEN]


@dataclass(frozen=True)
class HostService:
    """A port on the host that sandboxes may reach (e.g. the console-managed resolver)."""

    protocol: str  # "tcp" | "udp"
    port: int


def render_ruleset(host_services: Iterable[HostService] = ()) -> str:
    """The whole `inet sandbox_console` table as an `nft -f` file (deterministic)."""
    sandbox_in = f'iifname "{BRIDGE_PREFIX}*"'
    allowed = [
        f"\t\t{service.protocol} dport {int(service.port)} accept"
        for service in sorted(set(host_services), key=lambda s: (s.protocol, s.port))
        if service.protocol in ("tcp", "udp")
    ]
    lines = [
        "# Rendered by sandboxes/backends/docker/firewall.py and applied with `nft -f`; edits are lost.",
        f"table {TABLE_FAMILY} {TABLE_NAME}",
        f"delete table {TABLE_FAMILY} {TABLE_NAME}",
        f"table {TABLE_FAMILY} {TABLE_NAME} {{",
        "\tchain input {",
        "\t\ttype filter hook input priority filter; policy accept;",
        f"\t\t{sandbox_in} jump sandbox_to_host",
        "\t}",
        "",
        "\t# Sandboxes never reach the host's own addresses, whichever interface holds them.",
        "\tchain sandbox_to_host {",
        "\t\tct state established,related accept",
        *allowed,
        "\t\tcounter drop",
        "\t}",
        "",
        "\tchain forward {",
        "\t\ttype filter hook forward priority filter; policy accept;",
        f"\t\t{sandbox_in} jump sandbox_forward",
        "\t}",
        "",
        "\t# Not link-local / metadata, not another sandbox network, not the own bridge (no ICC).",
        "\tchain sandbox_forward {",
        f"\t\tip daddr {LINK_LOCAL_V4} counter drop",
        f"\t\tip6 daddr {LINK_LOCAL_V6} counter drop",
        f'\t\toifname "{BRIDGE_PREFIX}*" counter drop',
        "\t}",
        "}",
        "",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class FirewallResult:
    applied: bool
    detail: str


def _nft(args: list[str], stdin: str | None = None) -> FirewallResult:
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
    return FirewallResult(True, f"nftables table {TABLE_FAMILY} {TABLE_NAME} in force")


def apply_ruleset(ruleset: str) -> FirewallResult:
    """Load the ruleset with `nft -f -`. Never raises: the caller decides what a failure means."""
    result = _nft(["-f", "-"], ruleset)
    return result if result.applied else FirewallResult(False, f"nft refused the ruleset: {result.detail}")


def table_present() -> FirewallResult:
    """Whether the table is loaded now (read-only: a status check never changes the host).

    Only its presence is checked: the same table will hold live elements (addresses the
    resolver adds to sets) that re-applying the rendered file would drop.
    """
    result = _nft(["list", "table", TABLE_FAMILY, TABLE_NAME])
    if result.applied:
        return result
    if "No such file" in result.detail:
        return FirewallResult(False, f"the table {TABLE_FAMILY} {TABLE_NAME} is not loaded")
    return FirewallResult(False, result.detail)


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
