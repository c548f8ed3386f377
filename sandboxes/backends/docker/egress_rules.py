"""What one Docker sandbox may reach, as nftables rules (pure: a `NetworkSpec` in, `nft -f`
text out). The fixed part of the table is `firewall`; this renders each sandbox's own chain
`s_<12 hex of its id>` and the transaction that swaps it in.

Order of the chain, first match wins (docs/network.md, "How a packet is judged"):

1. deny entries (CIDRs; domains through the addresses the deny filler resolved them to, but
   an address an allowed domain of the same list resolved to as well on the sandbox's own
   network, `network_sets`): deny wins;
2. always denied: link-local and metadata addresses, any sandbox bridge (other spaces'
   sandboxes, and the own network's too: no inter-container traffic);
3. CIDR allow entries that lie inside a private range open exactly that part of it;
4. always denied: the private ranges (`PRIVATE_V4`, `PRIVATE_V6`); domain entries never open
   them, nor does an allow entry wider than a private range (0.0.0.0/0);
5. allow entries (CIDRs; domains through their resolved addresses), then: with an allow list
   "not in the allow list", without one everything else is accepted.

Every refusal is logged with the rule in words (the `log prefix`, read back by `egress`).
Imports nothing of the project but the contract.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from ..base import ErrorKind, NetworkSpec, RemoteError
from .firewall import (
    BRIDGE_PREFIX,
    MAP_V4,
    MAP_V6,
    ONLINE_V4,
    ONLINE_V6,
    TABLE,
    log_and_reject,
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Always denied unless a CIDR allow entry inside one of them opens that part (RFC 6890 and
# friends). The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
# 2001:db8::/32) are not in the list: they are never routed on the internet anyway.
PRIVATE_V4 = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",
    "172.16.0.0/12",
    "192.0.0.0/24",  # IETF protocol assignments
    "192.168.0.0/16",
    "198.18.0.0/15",  # benchmarking
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and the broadcast address
)
PRIVATE_V6 = (
    "::/128",
    "::1/128",
    "::ffff:0:0/96",  # IPv4-mapped: never an IPv4 private address in disguise
    "64:ff9b::/96",  # NAT64: the same
    "64:ff9b:1::/48",
    "fc00::/7",  # unique local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
)
# Always denied, whatever the lists say.
LINK_LOCAL_V4 = ("169.254.0.0/16",)
LINK_LOCAL_V6 = ("fe80::/10", "fd00:ec2::254/128")  # link-local, and a cloud's IPv6 metadata

_DOMAIN = re.compile(r"^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9-]{1,63}$")
_SANDBOX_ID = re.compile(r"^[0-9a-f]{12,64}$")


@dataclass(frozen=True)
class Entries:
    """One list of a policy, split: networks by family, and domain patterns."""

    v4: tuple[ipaddress.IPv4Network, ...] = ()
    v6: tuple[ipaddress.IPv6Network, ...] = ()
    domains: tuple[str, ...] = ()  # "example.com" or "*.example.com", lower case

    @property
    def empty(self) -> bool:
        return not (self.v4 or self.v6 or self.domains)


def parse_entries(entries: Iterable[str], what: str) -> Entries:
    """CIDRs (or bare addresses) and domain names; anything else is invalid (never rendered)."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    domains: list[str] = []
    for raw in entries:
        text = raw.strip().lower().rstrip(".")
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            if len(text) > 253 or not _DOMAIN.match(text):
                raise RemoteError(ErrorKind.INVALID, f"{what}: {raw!r} is neither a CIDR nor a domain name") from None
            domains.append(text)
            continue
        (v4 if isinstance(network, ipaddress.IPv4Network) else v6).append(network)  # type: ignore[arg-type]
    return Entries(tuple(dict.fromkeys(v4)), tuple(dict.fromkeys(v6)), tuple(dict.fromkeys(domains)))


def covers(deny: str, allow: str) -> bool:
    """Whether a deny pattern covers every name an allow pattern admits (as dnsmasq matches:
    `x.test` is the name and its subdomains, `*.x.test` the subdomains only)."""
    base = allow.removeprefix("*.")
    if deny.startswith("*."):
        return base.endswith(deny[1:]) or (allow.startswith("*.") and base == deny[2:])
    return base == deny or base.endswith("." + deny)


def domain_sets(pattern: str) -> tuple[str, str]:
    """The two named sets (IPv4, IPv6) holding the addresses the resolver gave for a domain
    pattern; shared by every sandbox whose lists name it."""
    digest = hashlib.sha256(pattern.encode()).hexdigest()[:16]
    return f"d4_{digest}", f"d6_{digest}"


def network_sets(pattern: str, bridge: str) -> tuple[str, str]:
    """The per-network copy (IPv4, IPv6) of an allowed pattern's sets: filled by the resolver
    of the network on `bridge` alone, read by the deny rule's exemption of that network's
    sandboxes, so another space's lookups never exempt an address from a deny entry. Named
    within nft's set name limit (31 characters here); `network_sets_of` finds a bridge's."""
    digest = hashlib.sha256(pattern.encode()).hexdigest()[:16]
    return f"n4_{digest}_{_bridge_tag(bridge)}", f"n6_{digest}_{_bridge_tag(bridge)}"


def _bridge_tag(bridge: str) -> str:
    return hashlib.sha256(bridge.encode()).hexdigest()[:11]


def network_sets_of(bridge: str, names: Iterable[str]) -> list[str]:
    """Which of the table's set names are per-network sets of `bridge` (to prune them)."""
    tag = _bridge_tag(bridge)
    return [n for n in names if re.fullmatch(rf"n[46]_[0-9a-f]{{16}}_{tag}", n)]


def chain_name(sandbox_id: str) -> str:
    if not _SANDBOX_ID.match(sandbox_id):
        raise RemoteError(ErrorKind.INVALID, f"malformed sandbox id {sandbox_id!r}")
    return f"s_{sandbox_id[:12]}"


def _inside_private(network: IPNetwork) -> bool:
    private = PRIVATE_V4 if network.version == 4 else PRIVATE_V6
    return any(network.subnet_of(ipaddress.ip_network(p)) for p in private)  # type: ignore[arg-type]


def _addresses(networks: Sequence[IPNetwork]) -> str:
    text = ", ".join(str(n) for n in networks)
    return f"{{ {text} }}" if len(networks) > 1 else text


def _accept_all(networks: Sequence[IPNetwork]) -> list[str]:
    """One rule per family: an anonymous interval set is one lookup however long the list."""
    rules = []
    for family, ip in ((4, "ip"), (6, "ip6")):
        chosen = [n for n in networks if n.version == family]
        if chosen:
            rules.append(f"{ip} daddr {_addresses(_merged(chosen))} accept")
    return rules


def _merged(networks: Sequence[IPNetwork]) -> list[IPNetwork]:
    """Overlapping entries collapsed (nft refuses overlapping intervals in one set)."""
    return list(ipaddress.collapse_addresses(networks))  # type: ignore[type-var]


def private_exceptions(network: NetworkSpec) -> tuple[str, ...]:
    """NetworkSpec.allow_private when the contract carries it (issue 13's console side)."""
    return tuple(getattr(network, "allow_private", ()) or ())


def chain_rules(network: NetworkSpec, bridge: str | None = None) -> list[str]:
    """The rules (bodies only) of a sandbox chain for this policy, in order. `bridge`: the
    sandbox's network, whose resolver's addresses exempt from a deny entry (none without)."""
    allow = parse_entries(network.allow_out, "allow_out")
    deny = parse_entries(network.deny_out, "deny_out")
    rules: list[str] = []
    for v4 in deny.v4:
        rules.append(f"ip daddr {v4} " + log_and_reject(f"deny entry {v4}"))
    for v6 in deny.v6:
        rules.append(f"ip6 daddr {v6} " + log_and_reject(f"deny entry {v6}"))
    # A denied name's addresses (the deny filler's), but those an allowed name of this list
    # resolved to as well: at the packet filter the two are one destination (wildcard DNS, a
    # CDN), the resolver has told them apart by name, and refusing it would refuse the allowed
    # name. An allow entry a deny entry covers makes no exception. Only the own network's
    # resolver's answers count (`network_sets`): the shared sets hold every space's lookups.
    exempt = [network_sets(p, bridge) for p in allow.domains if bridge and not any(covers(d, p) for d in deny.domains)]
    for pattern in deny.domains:
        set4, set6 = domain_sets(pattern)
        unless4 = "".join(f"ip daddr != @{allowed4} " for allowed4, _ in exempt)
        unless6 = "".join(f"ip6 daddr != @{allowed6} " for _, allowed6 in exempt)
        rules.append(f"ip daddr @{set4} {unless4}" + log_and_reject(f"deny entry {pattern}"))
        rules.append(f"ip6 daddr @{set6} {unless6}" + log_and_reject(f"deny entry {pattern}"))
    link_local = "always denied: link-local/metadata"
    rules.append(
        f"ip daddr {_addresses([ipaddress.IPv4Network(n) for n in LINK_LOCAL_V4])} " + log_and_reject(link_local)
    )
    rules.append(
        f"ip6 daddr {_addresses([ipaddress.IPv6Network(n) for n in LINK_LOCAL_V6])} " + log_and_reject(link_local)
    )
    rules.append(f'oifname "{BRIDGE_PREFIX}*" ' + log_and_reject("other sandbox"))
    allowed: list[IPNetwork] = [*allow.v4, *allow.v6]
    # Private CIDRs allowed besides the list (NetworkSpec.allow_private, where the contract
    # has it): they open that part of a private range without making the list allow-only.
    extra = parse_entries(private_exceptions(network), "allow_private")
    opened = [n for n in (*allowed, *extra.v4, *extra.v6) if _inside_private(n)]
    rules += _accept_all(opened)
    private = "always denied: private range"
    rules.append(f"ip daddr {_addresses([ipaddress.IPv4Network(n) for n in PRIVATE_V4])} " + log_and_reject(private))
    rules.append(f"ip6 daddr {_addresses([ipaddress.IPv6Network(n) for n in PRIVATE_V6])} " + log_and_reject(private))
    rules += _accept_all([n for n in allowed if n not in opened])
    for pattern in allow.domains:
        set4, set6 = domain_sets(pattern)
        rules.append(f"ip daddr @{set4} accept")
        rules.append(f"ip6 daddr @{set6} accept")
    rules.append(log_and_reject("not in the allow list") if not allow.empty else "accept")
    return rules


@dataclass(frozen=True)
class Binding:
    """Where a sandbox's packets come from: its bridge and its addresses there."""

    bridge: str
    v4: tuple[str, ...] = ()
    v6: tuple[str, ...] = ()


def map_keys(binding: Binding) -> list[tuple[str, str]]:
    """(map or set family suffix, key) of a binding: "4"/"6" and `"bridge" . address`."""
    return [("4", f'"{binding.bridge}" . {a}') for a in binding.v4] + [
        ("6", f'"{binding.bridge}" . {a}') for a in binding.v6
    ]


def _unbind(binding: Binding | None, present: Collection[tuple[str, str]]) -> list[str]:
    """Remove a binding's elements that are loaded (`present`: keys found in the maps; a
    delete of a missing element would fail the whole transaction)."""
    if binding is None:
        return []
    lines = []
    for family, key in map_keys(binding):
        online = ONLINE_V4 if family == "4" else ONLINE_V6
        lines.append(f"add element {TABLE} {online} {{ {key} }}")
        lines.append(f"delete element {TABLE} {online} {{ {key} }}")
        if (family, key) in present:
            lines.append(f"delete element {TABLE} {MAP_V4 if family == '4' else MAP_V6} {{ {key} }}")
    return lines


def render_update(
    sandbox_id: str,
    network: NetworkSpec,
    old: Binding | None,
    new: Binding | None,
    present: Collection[tuple[str, str]] = (),
) -> str:
    """One transaction: the sandbox's chain for this policy (with the domain sets it names),
    the old binding's elements removed and the new one's added. `new=None`: outbound off.
    `present`: the map keys loaded now (`map_keys` form). The allowed patterns' per-network
    sets (`network_sets`) are declared for the new binding's bridge."""
    chain = chain_name(sandbox_id)
    lines = []
    if network.allow_internet_access:
        allowed = parse_entries(network.allow_out, "allow_out").domains
        sets = [domain_sets(p) for p in dict.fromkeys([*parse_entries(network.deny_out, "deny_out").domains, *allowed])]
        sets += [network_sets(p, new.bridge) for p in allowed] if new is not None else []
        for set4, set6 in sets:
            lines.append(f"add set {TABLE} {set4} {{ type ipv4_addr; }}")
            lines.append(f"add set {TABLE} {set6} {{ type ipv6_addr; }}")
        rules = chain_rules(network, new.bridge if new is not None else None)
    else:
        rules = [log_and_reject("outbound off")]
    lines += [f"add chain {TABLE} {chain}", f"flush chain {TABLE} {chain}"]
    lines += [f"add rule {TABLE} {chain} {rule}" for rule in rules]
    lines += _unbind(old, present)
    if new is not None and network.allow_internet_access:
        removed = set(map_keys(old)) if old is not None else set()
        # An address another sandbox held before: its element goes first.
        lines += _unbind(Binding(new.bridge, new.v4, new.v6), set(present) - removed)
        for family, key in map_keys(new):
            lines.append(f"add element {TABLE} {MAP_V4 if family == '4' else MAP_V6} {{ {key} : jump {chain} }}")
            lines.append(f"add element {TABLE} {ONLINE_V4 if family == '4' else ONLINE_V6} {{ {key} }}")
    return "\n".join(lines) + "\n"


def render_removal(sandbox_id: str, old: Binding | None, present: Collection[tuple[str, str]] = ()) -> str:
    """One transaction: the sandbox's elements and chain gone (each step safe when absent)."""
    chain = chain_name(sandbox_id)
    lines = _unbind(old, present)
    lines += [f"add chain {TABLE} {chain}", f"delete chain {TABLE} {chain}"]
    return "\n".join(lines) + "\n"


def render_network(bridge: str, gateways_v4: Sequence[str], gateways_v6: Sequence[str], *, remove: bool = False) -> str:
    """A space network the console manages: its bridge fails closed, its gateway is known.
    `remove`: the network is gone (each element added first, so a missing one cannot fail)."""
    elements = [f'managed {{ "{bridge}" }}']
    elements += [f'gateways_v4 {{ "{bridge}" . {a} }}' for a in gateways_v4]
    elements += [f'gateways_v6 {{ "{bridge}" . {a} }}' for a in gateways_v6]
    lines = [f"add element {TABLE} {e}" for e in elements]
    if remove:
        lines += [f"delete element {TABLE} {e}" for e in elements]
    return "\n".join(lines) + "\n"
