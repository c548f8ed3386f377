"""An interpreter of a dnsmasq configuration file for the lines a resolver's policy is made of:
what it does with a query for a name, and which nftables sets its answer is added to.

- `server=/d1/d2/.../UPSTREAM` forwards the names of those domains, `address=/d/` (no address)
  and `local=/d/` answer NXDOMAIN, `address=/d/ADDR` answers ADDR; a domain `/d/` is `d` and
  every name below it, `/*d/` every name ending in `d` (dnsmasq's leading-star form), `/#/`
  every name; the most specific domain decides (the longest, an exact form before a star);
- `server=UPSTREAM` (no domain) forwards the names no domain line takes;
- `nftset=/d/.../4#family#table#set,6#...` adds the answer's addresses to those sets: the
  longest matching domain's line only.

Names are compared without case and trailing dot. Other lines (listen-address, log-*, ...) are
ignored; a line of a kind that could change a query's fate (`rebind-domain-ok`, `alias`,
`cname`, `host-record`, `conf-file`, ...) raises `Unmodelled`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

IGNORED = {
    "listen-address", "bind-interfaces", "except-interface", "interface", "port", "no-resolv", "no-hosts",
    "no-poll", "cache-size", "log-queries", "log-facility", "pid-file", "user", "group", "log-async",
    "dns-forward-max", "keep-in-foreground", "bind-dynamic", "no-negcache", "local-ttl", "neg-ttl",
    "max-cache-ttl", "min-cache-ttl", "strict-order", "all-servers", "domain-needed", "bogus-priv",
    "log-dhcp", "quiet-dhcp", "edns-packet-max", "query-port", "min-port", "max-port", "auth-ttl",
}  # fmt: skip


class Unmodelled(ValueError):
    """A configuration line this interpreter does not know."""


@dataclass(frozen=True)
class Answer:
    forwarded: bool  # the name goes to the upstream (else NXDOMAIN or a fixed answer)
    fixed: str | None = None  # address=/d/ADDR's ADDR
    sets: tuple[str, ...] = ()  # "4#inet#table#set" targets the answer's addresses go to


@dataclass
class Config:
    # (domain, star, action, value): action "server" | "nxdomain" | "address"
    domain_lines: list[tuple[str, bool, str, str]] = field(default_factory=list)
    default_upstream: bool = False
    nftsets: list[tuple[str, bool, tuple[str, ...]]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Config:
        config = cls()
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            if key in IGNORED:
                continue
            if key in ("server", "address", "local"):
                if not value.startswith("/"):
                    if key != "server":
                        raise Unmodelled(line)
                    config.default_upstream = config.default_upstream or bool(value)
                    continue
                *domains, target = value[1:].split("/")
                action = (
                    "server"
                    if key == "server" and target
                    else ("address" if key == "address" and target else "nxdomain")
                )
                for domain in domains:
                    name, star = _pattern(domain)
                    config.domain_lines.append((name, star, action, target))
            elif key == "nftset":
                *domains, targets = value[1:].split("/")
                for domain in domains:
                    name, star = _pattern(domain)
                    config.nftsets.append((name, star, tuple(t for t in targets.split(",") if t)))
            else:
                raise Unmodelled(line)
        return config

    def query(self, name: str) -> Answer:
        name = name.strip().rstrip(".").lower()
        line = _best(((d, s, (a, v)) for d, s, a, v in self.domain_lines), name)
        if line is None:
            forwarded, fixed = self.default_upstream, None
        else:
            action, value = line
            forwarded, fixed = action == "server", value if action == "address" else None
        sets = _best(((d, s, t) for d, s, t in self.nftsets), name) if forwarded or fixed else None
        return Answer(forwarded, fixed, tuple(sets or ()))


def _pattern(domain: str) -> tuple[str, bool]:
    domain = domain.lower().rstrip(".")
    if domain == "#":
        return "", True
    if domain.startswith("*"):
        return domain[1:], True
    return domain, False


def _matches(domain: str, star: bool, name: str) -> bool:
    if star:
        return name.endswith(domain)
    return name == domain or name.endswith("." + domain)


def _best(lines: Iterable[tuple[str, bool, T]], name: str) -> T | None:
    """The value of the most specific matching line (longest domain; exact before star)."""
    found = [(len(d), not s, value) for d, s, value in lines if _matches(d, s, name)]
    if not found:
        return None
    found.sort(key=lambda f: (f[0], f[1]))
    return found[-1][2]


def set_names(targets: Iterable[str], family: int, table: tuple[str, str]) -> list[str]:
    """The names of the sets of `table` (family, name) among nftset targets, for IPv4 or IPv6."""
    names = []
    for target in targets:
        parts = target.split("#")
        if len(parts) == 4 and parts[0] == str(family) and (parts[1], parts[2]) == table:
            names.append(parts[3])
    return names
