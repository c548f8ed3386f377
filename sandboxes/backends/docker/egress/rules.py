"""What one Docker sandbox may reach, as nftables rules (pure: a `NetworkSpec` in, `nft -f`
text out). The fixed part of the table is `firewall`; this renders each sandbox's own chain
`s_<12 hex of its id>` and the transaction that swaps it in.

The meaning is `netpolicy`'s: the entries come typed in the spec, the special address classes
from `netpolicy.ADDRESS_CLASSES`; this module holds no range list and parses no entry. Order
of the chain, first match wins (the packet layer of `netpolicy.decide`; docs/network.md):

1. deny entries (CIDRs; domains through the addresses the deny filler resolved them to, but
   an address an allowed domain of the same list resolved to as well on the sandbox's own
   network, `network_sets`): deny wins. The denied names' rules sit in a sub-chain
   (`deny_rules`) whose exemptions return first, one rule each;
2. always denied: the NEVER classes (link-local and metadata, loopback, ...) and any sandbox
   bridge (other spaces' sandboxes, and the own network's too: no inter-container traffic);
3. CIDR allow entries that lie inside a private range, and private exceptions, open exactly
   that part of it;
4. always denied: the OPENABLE classes (the private ranges); domain entries never open them,
   nor does an allow entry wider than a private range (0.0.0.0/0);
5. allow entries (CIDRs; domains through their resolved addresses), then: with an allow list
   "not in the allow list", without one everything else is accepted.

Every refusal is logged with the rule in words (`netpolicy.Decision.words`, the `log prefix`,
read back by `refusals`). Imports nothing of the project but the contract and `netpolicy`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from netpolicy import ADDRESS_CLASSES, Domain, IPNetwork, Kind, Treatment, opened_range

from ...base import ErrorKind, NetworkSpec, RemoteError
from .firewall import (
    BRIDGE_PREFIX,
    MAP_V4,
    MAP_V6,
    ONLINE_V4,
    ONLINE_V6,
    TABLE,
    log_and_reject,
)

_SANDBOX_ID = re.compile(r"^[0-9a-f]{12,64}$")


def domain_sets(pattern: Domain | str) -> tuple[str, str]:
    """The two named sets (IPv4, IPv6) holding the addresses the resolver gave for a domain
    entry; shared by every sandbox whose lists name it."""
    digest = hashlib.sha256(str(pattern).encode()).hexdigest()[:16]
    return f"d4_{digest}", f"d6_{digest}"


def is_domain_set(name: str) -> bool:
    """Whether a set name of the table is a shared domain set (`domain_sets`)."""
    return re.fullmatch(r"d[46]_[0-9a-f]{16}", name) is not None


def network_sets(pattern: Domain | str, bridge: str) -> tuple[str, str]:
    """The per-network copy (IPv4, IPv6) of an allowed pattern's sets: filled by the resolver
    of the network on `bridge` alone, read by the deny rule's exemption of that network's
    sandboxes, so another space's lookups never exempt an address from a deny entry. Named
    within nft's set name limit (31 characters here); `network_sets_of` finds a bridge's."""
    digest = hashlib.sha256(str(pattern).encode()).hexdigest()[:16]
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


def _addresses(networks: Sequence[IPNetwork]) -> str:
    text = ", ".join(str(n) for n in networks)
    return f"{{ {text} }}" if len(networks) > 1 else text


def _family(version: int) -> str:
    return "ip" if version == 4 else "ip6"


def _accept_all(networks: Sequence[IPNetwork]) -> list[str]:
    """One rule per family: an anonymous interval set is one lookup however long the list."""
    rules = []
    for version in (4, 6):
        chosen = [n for n in networks if n.version == version]
        if chosen:
            rules.append(f"{_family(version)} daddr {_addresses(_merged(chosen))} accept")
    return rules


def _merged(networks: Sequence[IPNetwork]) -> list[IPNetwork]:
    """Overlapping entries collapsed (nft refuses overlapping intervals in one set)."""
    return list(ipaddress.collapse_addresses(networks))  # type: ignore[type-var]


def _reject_classes(treatment: Treatment) -> list[str]:
    """One rule per (kind, family) of netpolicy's classes with this sandbox treatment, logged
    with the words `netpolicy.always_denied` gives them."""
    rules = []
    kinds = dict.fromkeys(c.kind for c in ADDRESS_CLASSES if c.sandbox == treatment)
    for kind in kinds:
        for version in (4, 6):
            found = [c.network for c in ADDRESS_CLASSES if c.sandbox == treatment and c.kind == kind]
            chosen = _merged([n for n in found if n.version == version])
            if chosen:
                words = f"always denied: {kind.value}"
                rules.append(f"{_family(version)} daddr {_addresses(chosen)} " + log_and_reject(words))
    return rules


def deny_chain_name(chain: str) -> str:
    """The sub-chain of a sandbox chain holding its denied names' rules (`deny_rules`)."""
    return f"{chain}_d"


def _exemptions(network: NetworkSpec, bridge: str | None) -> list[tuple[str, str]]:
    """The per-network sets whose addresses a denied name's rules spare (see `deny_rules`)."""
    denied_domains = network.domains("deny_out")
    if not bridge or not denied_domains:
        return []
    return [
        network_sets(p, bridge) for p in network.domains("allow_out") if not any(d.covers(p) for d in denied_domains)
    ]


def deny_rules(network: NetworkSpec, bridge: str | None = None) -> list[str]:
    """The denied names' rules, in order: an address an allowed name of this list resolved to
    as well returns first (see `chain_rules`), then each denied name's addresses are refused.
    With exemptions they form the sub-chain `deny_chain_name` (one lookup per rule: a rule
    holding every exemption would pass nft's limit of expressions per rule at ~60 allowed
    names), else they are inlined in the sandbox chain."""
    rules = [
        f"{family} daddr @{name} return"
        for allowed4, allowed6 in _exemptions(network, bridge)
        for family, name in (("ip", allowed4), ("ip6", allowed6))
    ]
    for pattern in network.domains("deny_out"):
        set4, set6 = domain_sets(pattern)
        rules.append(f"ip daddr @{set4} " + log_and_reject(f"deny entry {pattern}"))
        rules.append(f"ip6 daddr @{set6} " + log_and_reject(f"deny entry {pattern}"))
    return rules


def chain_rules(network: NetworkSpec, bridge: str | None = None, deny_chain: str = "s_d") -> list[str]:
    """The rules (bodies only) of a sandbox chain for this policy, in order. `bridge`: the
    sandbox's network, whose resolver's addresses exempt from a deny entry (none without);
    `deny_chain`: the sub-chain jumped to for the denied names when there are exemptions."""
    allowed_domains = network.domains("allow_out")
    rules: list[str] = []
    for cidr in network.cidrs("deny_out"):
        rules.append(f"{_family(cidr.version)} daddr {cidr} " + log_and_reject(f"deny entry {cidr}"))
    # A denied name's addresses (the deny filler's), but those an allowed name of this list
    # resolved to as well: at the packet filter the two are one destination (wildcard DNS, a
    # CDN), the resolver has told them apart by name, and refusing it would refuse the allowed
    # name. An allow entry a deny entry covers makes no exception. Only the own network's
    # resolver's answers count (`network_sets`): the shared sets hold every space's lookups.
    rules += [f"jump {deny_chain}"] if _exemptions(network, bridge) else deny_rules(network, bridge)
    rules += _reject_classes(Treatment.NEVER)
    rules.append(f'oifname "{BRIDGE_PREFIX}*" ' + log_and_reject(f"always denied: {Kind.SANDBOX.value}"))
    allowed = [c.network for c in network.cidrs("allow_out")]
    # Allow entries inside a private range and private exceptions open that part of it (the
    # exceptions never make the list allow-only).
    opened = [c.network for c in network.cidrs("allow_out") if opened_range(c) is not None]
    opened += [c.network for c in network.allow_private if c.network not in opened]
    rules += _accept_all(opened)
    rules += _reject_classes(Treatment.OPENABLE)
    rules += _accept_all([n for n in allowed if n not in opened])
    for pattern in allowed_domains:
        set4, set6 = domain_sets(pattern)
        rules.append(f"ip daddr @{set4} accept")
        rules.append(f"ip6 daddr @{set6} accept")
    rules.append(log_and_reject("not in the allow list") if network.allow_only else "accept")
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
        allowed = network.domains("allow_out")
        sets = [domain_sets(p) for p in dict.fromkeys([*network.domains("deny_out"), *allowed])]
        sets += [network_sets(p, new.bridge) for p in allowed] if new is not None else []
        for set4, set6 in sets:
            lines.append(f"add set {TABLE} {set4} {{ type ipv4_addr; }}")
            lines.append(f"add set {TABLE} {set6} {{ type ipv6_addr; }}")
        bridge = new.bridge if new is not None else None
        rules = chain_rules(network, bridge, deny_chain_name(chain))
        sub = deny_rules(network, bridge) if _exemptions(network, bridge) else []
    else:
        rules, sub = [log_and_reject("outbound off")], []
    # The chain first (its jump to the sub-chain goes), then the sub-chain refilled.
    lines += [f"add chain {TABLE} {chain}", f"flush chain {TABLE} {chain}"]
    lines += [f"add chain {TABLE} {deny_chain_name(chain)}", f"flush chain {TABLE} {deny_chain_name(chain)}"]
    lines += [f"add rule {TABLE} {deny_chain_name(chain)} {rule}" for rule in sub]
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
    lines += [f"add chain {TABLE} {deny_chain_name(chain)}", f"delete chain {TABLE} {deny_chain_name(chain)}"]
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
