"""An interpreter of an nftables table as `nft -j list ruleset` prints it: which verdict a
packet meets in the table's base chains of one hook, and the words of the last `log prefix`
on its way.

Only what a packet's header and interfaces decide is modelled: `meta iifname/oifname/
l4proto/nfproto`, `ip`/`ip6` saddr and daddr, `tcp`/`udp`/`th` dport, `ct state` (a packet is
`new`), concatenations, named and anonymous sets (values, prefixes, ranges, interval
concatenations), verdict maps, `jump`/`goto`/`return`, `accept`/`drop`/`reject`, and `log`
and `counter` (no effect). Anything else raises `Unmodelled`, so an expression the renderer
starts using is never read as "no match". Set elements can be added (`with_elements`): what a
resolver would put there when it answers a name.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Unmodelled(ValueError):
    """An expression or statement this interpreter does not know."""


@dataclass(frozen=True)
class Packet:
    iifname: str
    oifname: str
    saddr: IPAddress
    daddr: IPAddress
    l4proto: str = "tcp"
    dport: int = 80

    @property
    def family(self) -> str:
        return "ip" if self.daddr.version == 4 else "ip6"


@dataclass(frozen=True)
class Verdict:
    verdict: str  # "accept" | "drop" | "reject"
    words: str = ""  # the last log prefix on the way
    chain: str = ""

    @property
    def allowed(self) -> bool:
        return self.verdict == "accept"


@dataclass
class Chain:
    name: str
    rules: list[list[dict[str, Any]]] = field(default_factory=list)
    hook: str | None = None
    priority: int = 0
    policy: str = "accept"


class Table:
    def __init__(self, document: Mapping[str, Any], family: str, name: str) -> None:
        self.family, self.name = family, name
        self.chains: dict[str, Chain] = {}
        self.sets: dict[str, list[Any]] = {}
        self.maps: dict[str, list[Any]] = {}
        for item in document.get("nftables", []):
            kind, body = next(iter(item.items()))
            if not isinstance(body, dict) or body.get("family") != family or body.get("table") != name:
                continue
            if kind == "chain":
                self.chains[body["name"]] = Chain(
                    body["name"],
                    hook=body.get("hook"),
                    priority=int(body.get("prio", 0)),
                    policy=body.get("policy", "accept"),
                )
            elif kind == "set":
                self.sets[body["name"]] = list(body.get("elem", []))
            elif kind == "map":
                self.maps[body["name"]] = list(body.get("elem", []))
        for item in document.get("nftables", []):
            rule = item.get("rule")
            if rule and rule.get("family") == family and rule.get("table") == name:
                self.chains[rule["chain"]].rules.append(rule["expr"])

    @classmethod
    def read(cls, family: str, name: str, netns: str | None = None) -> Table:
        """The table as loaded now (on this host, or inside a network namespace)."""
        argv = ["nft", "-j", "list", "table", family, name]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]
        listed = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30)
        return cls(json.loads(listed.stdout), family, name)

    def with_elements(self, additions: Mapping[str, Sequence[str]]) -> Table:
        """A copy with more elements in named sets (a set not declared is ignored, as nft
        would refuse to add to it)."""
        copy = Table({"nftables": []}, self.family, self.name)
        copy.chains, copy.maps = self.chains, self.maps
        copy.sets = {n: list(e) for n, e in self.sets.items()}
        for set_name, elements in additions.items():
            if set_name in copy.sets:
                copy.sets[set_name].extend(elements)
        return copy

    # --- the walk ----------------------------------------------------------------------------

    def judge(self, packet: Packet, hook: str) -> Verdict:
        """The verdict of the table's base chains on `hook`, in priority order (a drop or a
        reject in any is final)."""
        bases = sorted((c for c in self.chains.values() if c.hook == hook), key=lambda c: c.priority)
        words = ""
        for chain in bases:
            result, words = self._chain(chain.name, packet, words, depth=0)
            if result is None:
                result = Verdict(chain.policy, words, chain.name)
            if not result.allowed:
                return result
        return Verdict("accept", words)

    def chain_verdict(self, chain: str, packet: Packet) -> Verdict | None:
        """One (regular) chain's verdict, None when the packet returns from it."""
        return self._chain(chain, packet, "", depth=0)[0]

    def _chain(self, name: str, packet: Packet, words: str, depth: int) -> tuple[Verdict | None, str]:
        if depth > 16:
            raise Unmodelled("jumps nested too deep")
        for rule in self.chains[name].rules:
            result, words, stop = self._rule(rule, packet, words, depth, name)
            if stop:
                return result, words
        return None, words

    def _rule(
        self, rule: list[dict[str, Any]], packet: Packet, words: str, depth: int, chain: str
    ) -> tuple[Verdict | None, str, bool]:
        """(verdict, words, whether the chain stops here)."""
        for expression in rule:
            kind, body = next(iter(expression.items()))
            if kind == "match":
                if not self._match(body, packet):
                    return None, words, False
            elif kind in ("counter", "limit"):
                continue
            elif kind == "log":
                words = str(body.get("prefix", ""))
            elif kind in ("accept", "drop"):
                return Verdict(kind, words, chain), words, True
            elif kind == "reject":
                return Verdict("reject", words, chain), words, True
            elif kind == "return":
                return None, words, True
            elif kind in ("jump", "goto"):
                result, words = self._chain(body["target"], packet, words, depth + 1)
                if result is not None or kind == "goto":
                    return result, words, True
                return None, words, False
            elif kind == "vmap":
                key = self._value(body["key"], packet)
                if key is None:
                    return None, words, False
                entries = self._named(body["data"], self.maps)
                for element in entries:
                    if not isinstance(element, list):
                        raise Unmodelled(f"map element {element}")
                    element_key, target = element
                    if self._element(element_key, key):
                        verdict_kind, verdict_body = next(iter(target.items()))
                        return self._rule([{verdict_kind: verdict_body}], packet, words, depth, chain)
                return None, words, False
            else:
                raise Unmodelled(f"statement {kind}: {body}")
        return None, words, False

    # --- values and matches --------------------------------------------------------------------

    def _value(self, expression: Any, packet: Packet) -> Any:
        if isinstance(expression, dict):
            kind, body = next(iter(expression.items()))
            if kind == "meta":
                key = body["key"]
                if key in ("iifname", "oifname"):
                    return getattr(packet, key)
                if key == "l4proto":
                    return packet.l4proto
                if key == "nfproto":
                    return "ipv4" if packet.family == "ip" else "ipv6"
                raise Unmodelled(f"meta {key}")
            if kind == "payload":
                protocol, name = body.get("protocol"), body.get("field")
                if protocol in ("ip", "ip6") and name in ("saddr", "daddr"):
                    return getattr(packet, name) if packet.family == protocol else None
                if name == "dport" and protocol in ("tcp", "udp", "th"):
                    return packet.dport if protocol in ("th", packet.l4proto) else None
                if protocol in ("icmp", "icmpv6"):
                    return None  # the packets asked about are TCP
                raise Unmodelled(f"payload {protocol} {name}")
            if kind == "ct" and body.get("key") == "state":
                return "new"
            if kind == "concat":
                parts = [self._value(part, packet) for part in body]
                return None if any(p is None for p in parts) else tuple(parts)
        raise Unmodelled(f"value {expression}")

    def _match(self, body: Mapping[str, Any], packet: Packet) -> bool:
        value = self._value(body["left"], packet)
        if value is None:
            return False  # the implicit protocol check fails (an IPv6 packet at `ip daddr`)
        op, right = body.get("op", "=="), body["right"]
        if isinstance(right, str) and right.startswith("@"):
            found = any(self._element(e, value) for e in self._named(right, self.sets))
        elif op == "in" and isinstance(right, list):
            found = any(self._element(e, value) for e in right)
        else:
            found = self._element(right, value)
        if op in ("==", "in"):
            return found
        if op == "!=":
            return not found
        raise Unmodelled(f"operator {op}")

    def _named(self, reference: str, where: Mapping[str, list[Any]]) -> list[Any]:
        name = reference.removeprefix("@")
        if name not in where:
            raise Unmodelled(f"no set or map {name}")
        return where[name]

    def _element(self, element: Any, value: Any) -> bool:
        """Whether `value` is (in) a set element or equals a literal."""
        if isinstance(element, dict):
            kind, body = next(iter(element.items()))
            if kind == "elem":
                return self._element(body["val"], value)
            if kind == "set":
                return any(self._element(e, value) for e in body)
            if kind == "prefix":
                address = _address(value)
                network = ipaddress.ip_network(f"{body['addr']}/{body['len']}", strict=False)
                return address is not None and address.version == network.version and address in network
            if kind == "range":
                low, high = body
                if isinstance(value, int):
                    return int(low) <= value <= int(high)
                address, first, last = _address(value), _address(low), _address(high)
                return (
                    address is not None
                    and first is not None
                    and last is not None
                    and address.version == first.version == last.version
                    and int(first) <= int(address) <= int(last)
                )
            if kind == "concat":
                return (
                    isinstance(value, tuple)
                    and len(value) == len(body)
                    and all(self._element(e, v) for e, v in zip(body, value, strict=True))
                )
            raise Unmodelled(f"element {element}")
        if isinstance(element, list):
            return any(self._element(e, value) for e in element)
        if isinstance(value, str):
            text = str(element)
            return value.startswith(text[:-1]) if text.endswith("*") and not text.endswith("\\*") else value == text
        if isinstance(value, int):
            return isinstance(element, int) and element == value
        address = _address(value)
        literal = _address(element)
        return address is not None and literal is not None and address == literal


def _address(value: Any) -> IPAddress | None:
    if isinstance(value, ipaddress.IPv4Address | ipaddress.IPv6Address):
        return value
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None
