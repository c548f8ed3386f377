"""The network policy's meaning as a table: (policy, destination, verdict), each verdict written
by hand from the semantics the policy form and docs/network.md state (netpolicy/policy.py):

- a plain domain `example.test` is the name and every name below it; `*.wild.test` the names
  below only, never `wild.test`; names compare without case and without a trailing dot;
- an allow list lets out ONLY its entries (a name no domain entry covers is refused, even
  when its address is inside an allowed CIDR); no allow list: everything but the rest below;
- deny entries win over allow entries and private exceptions;
- always denied: link-local and metadata, loopback and unspecified, the Docker host, other
  sandboxes; the private ranges (multicast, NAT64, shared space, reserved ones included)
  unless a CIDR allow entry inside one or a private exception opens that part;
- an IPv4-mapped address is the IPv4 address it carries;
- HTTP rules (port 80, and 443 by SNI only) decide in order within what the lists let out.

Addresses written `$NAME` are places the test knows only when it runs: `$A1`..`$A5` and
`$B1`, `$B2` are a target namespace's IPv4 and IPv6 addresses (documentation ranges, ordinary
destinations), `$GW` the sandbox network's gateway (the Docker host), `$DOCKER0` the host's
docker0 address, `$OTHER` a sandbox of another space. `NAMES` says what each name resolves
to (the test's upstream resolver answers exactly that). No case asks about the bare address
of a name its policy allows or denies: a resolver-based layer opens (or refuses) the addresses
the name resolved to, so the answer depends on what was resolved before, which is no part of
the meaning. Private ranges used here (10.20/16, 10.77/16, 10.1/16 ...) must not be Docker
networks of the host the test runs on (Docker's pools are in 172.16/12 and 192.168/16).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What each name (and every name below it, unless a longer one is listed) resolves to.
NAMES: dict[str, str] = {
    "example.test": "$A1",
    "api.example.test": "$A2",
    "other.test": "$A3",
    "notexample.test": "$A3",
    "notwild.test": "$A3",
    "x.wild.test": "$A4",
    "wild.test": "$A3",
    # Alone on its address: a layer that refuses a denied name's addresses (sets shared by
    # every network naming the pattern) refuses whatever else resolves there too.
    "bad.wild.test": "$A5",
    "v6.test": "$B1",
}
# The value of each `$NAME` when no real place stands behind it (decide, explain, E2B).
PLACEHOLDERS: dict[str, str] = {
    "$A1": "203.0.113.2",
    "$A2": "203.0.113.3",
    "$A3": "203.0.113.4",
    "$A4": "203.0.113.5",
    "$A5": "203.0.113.6",
    "$B1": "2001:db8:51ab:1::2",
    "$B2": "2001:db8:51ab:1::3",
    "$GW": "172.30.0.1",
    "$GW_NET": "172.30.0.0/24",
    "$DOCKER0": "172.17.0.1",
    "$OTHER": "172.31.0.2",
    "$OTHER_NET": "172.31.0.0/24",
}


@dataclass(frozen=True)
class Spec:
    """A policy as the admin writes it (texts; `$NAME`s replaced when the test runs)."""

    allow_out: tuple[str, ...] = ()
    deny_out: tuple[str, ...] = ()
    allow_private: tuple[str, ...] = ()
    l7_rules: tuple[str, ...] = ()  # "allow|deny DOMAIN [METHODS] [PATH]", the form's lines
    outbound: bool = True


@dataclass(frozen=True)
class Case:
    policy: str
    destination: str  # a name, an address, host:port or an http(s) URL
    allowed: bool
    method: str | None = None
    note: str = ""

    @property
    def label(self) -> str:
        method = f"{self.method} " if self.method else ""
        return f"{self.policy}: {method}{self.destination}"

    @property
    def docker_only(self) -> bool:
        """The Docker host's and other sandboxes' addresses mean something on Docker only."""
        return any(token in self.destination for token in ("$GW", "$DOCKER0", "$OTHER"))


POLICIES: dict[str, Spec] = {
    "off": Spec(outbound=False),
    "open": Spec(),
    "allow-plain": Spec(allow_out=("example.test",)),
    "allow-wildcard": Spec(allow_out=("*.wild.test",)),
    "deny-plain": Spec(deny_out=("example.test",)),
    "deny-wildcard": Spec(deny_out=("*.wild.test",)),
    "allow-plain-deny-sub": Spec(allow_out=("example.test",), deny_out=("api.example.test",)),
    "allow-wildcard-deny-sub": Spec(allow_out=("*.wild.test",), deny_out=("bad.wild.test",)),
    "allow-cidr-only": Spec(allow_out=("$A1/32",)),
    "allow-name-deny-its-address": Spec(allow_out=("example.test",), deny_out=("$A1/32",)),
    "deny-doc-range": Spec(deny_out=("203.0.113.0/24",)),
    "allow-private-cidr": Spec(allow_out=("10.0.0.0/8",), deny_out=("10.9.0.0/16",)),
    "allow-everything-cidr": Spec(allow_out=("0.0.0.0/0", "::/0")),
    "private-exception": Spec(allow_private=("10.20.0.0/16",)),
    "private-exception-deny": Spec(allow_private=("10.77.5.0/24",), deny_out=("10.77.5.7/32",)),
    "allow-name-private-exception": Spec(allow_out=("example.test",), allow_private=("10.20.0.0/16",)),
    "deny-v6-range": Spec(deny_out=("2001:db8::/32",)),
    "allow-v6-address": Spec(allow_out=("$B1/128",)),
    "allow-ula-and-name": Spec(allow_out=("fd12:3456::/32", "example.test")),
    "deny-all-v4": Spec(deny_out=("0.0.0.0/0",)),
    "allow-odd-spelling": Spec(allow_out=("Example.TEST.",)),
    "allow-wildcard-deny-parent": Spec(allow_out=("*.example.test",), deny_out=("example.test",)),
    "allow-parent-deny-wildcard": Spec(allow_out=("example.test",), deny_out=("*.example.test",)),
    "allow-host-and-sandboxes": Spec(allow_out=("$GW/32", "$DOCKER0/32", "$OTHER/32", "$A1/32")),
    "deny-name-allow-its-address": Spec(allow_out=("$A1/32", "example.test"), deny_out=("api.example.test",)),
    "http-rules-allow-list": Spec(
        allow_out=("example.test",),
        l7_rules=("allow example.test GET /v1/", "deny api.example.test * /"),
    ),
    "http-rules-open": Spec(l7_rules=("deny *.wild.test * /", "allow other.test GET /public/")),
}


def _cases(policy: str, *rows: tuple[str, bool] | tuple[str, bool, str]) -> list[Case]:
    out = []
    for row in rows:
        destination, allowed = row[0], row[1]
        method = row[2] if len(row) > 2 else None
        out.append(Case(policy, destination, allowed, method))
    return out


ALWAYS_DENIED_ADDRESSES = (
    "169.254.169.254",  # link-local: cloud metadata
    "169.254.170.2",
    "fe80::1",
    "fd00:ec2::254",  # a cloud's IPv6 metadata (inside fc00::/7 too)
    "100.100.100.200",  # a cloud metadata address inside the shared space
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "0.0.0.0",
    "::",
    "$GW",
    "$DOCKER0",
    "$OTHER",
)
PRIVATE_ADDRESSES = (
    "10.1.2.3",
    "172.16.5.4",
    "192.168.1.1",
    "100.64.0.1",  # shared address space
    "192.0.0.8",
    "198.18.0.1",  # benchmarking
    "224.0.0.1",  # multicast
    "255.255.255.255",
    "240.0.0.1",
    "fd12::1",
    "fc00::1",
    "fec0::1",
    "ff02::1",
    "::ffff:10.1.2.3",  # IPv4-mapped: the private address inside
    "::ffff:169.254.169.254",
    "64:ff9b::a01:203",  # NAT64 of 10.1.2.3
    "64:ff9b::cb00:7101",  # NAT64 of a documentation address: the NAT64 prefix stays private
    "64:ff9b:1::a01:203",
)

CASES: list[Case] = [
    *_cases("off", ("example.test", False), ("$A1", False), ("$B1", False), ("10.1.2.3", False), ("other.test", False)),
    *_cases(
        "open",
        ("example.test", True),
        ("api.example.test", True),
        ("other.test", True),
        ("v6.test", True),
        ("$A1", True),
        ("$A3", True),
        ("$B1", True),
        ("192.0.2.1", True),  # documentation ranges are ordinary destinations
        ("2001:db8::1", True),
        ("::ffff:$A1", True),  # mapped: the public IPv4 address inside
        ("198.51.100.7", True),
        *((address, False) for address in ALWAYS_DENIED_ADDRESSES),
        *((address, False) for address in PRIVATE_ADDRESSES),
    ),
    *_cases(
        "allow-plain",
        ("example.test", True),
        ("EXAMPLE.test", True),
        ("example.test.", True),
        ("www.example.test", True),
        ("api.example.test", True),
        ("deep.a.example.test", True),
        ("notexample.test", False),
        ("other.test", False),
        ("example.test.other.test", False),
        ("v6.test", False),
        ("$A3", False),
        ("$B1", False),
        ("10.1.2.3", False),
        ("169.254.169.254", False),
        ("$GW", False),
        ("$OTHER", False),
    ),
    *_cases(
        "allow-wildcard",
        ("wild.test", False),
        ("x.wild.test", True),
        ("deep.x.wild.test", True),
        ("X.Wild.Test", True),
        ("x.wild.test.", True),
        ("bad.wild.test", True),
        ("notwild.test", False),
        ("other.test", False),
        ("example.test", False),
        ("$A3", False),
    ),
    *_cases(
        "deny-plain",
        ("example.test", False),
        ("www.example.test", False),
        ("api.example.test", False),
        ("Example.Test.", False),
        ("deep.a.example.test", False),
        ("notexample.test", True),
        ("other.test", True),
        ("example.test.other.test", True),
        ("wild.test", True),
        ("$A3", True),
        ("10.1.2.3", False),
    ),
    *_cases(
        "deny-wildcard",
        ("wild.test", True),
        ("x.wild.test", False),
        ("deep.x.wild.test", False),
        ("bad.wild.test", False),
        ("X.WILD.test", False),
        ("other.test", True),
        ("notwild.test", True),
        ("example.test", True),
    ),
    *_cases(
        "allow-plain-deny-sub",
        ("example.test", True),
        ("www.example.test", True),
        ("deep.a.example.test", True),
        ("api.example.test", False),
        ("v1.api.example.test", False),
        ("API.example.test.", False),
        ("other.test", False),
    ),
    *_cases(
        "allow-wildcard-deny-sub",
        ("x.wild.test", True),
        ("deep.x.wild.test", True),
        ("bad.wild.test", False),
        ("sub.bad.wild.test", False),
        ("wild.test", False),
        ("other.test", False),
    ),
    *_cases(
        "allow-cidr-only",
        ("$A1", True),
        ("::ffff:$A1", True),
        ("$A2", False),
        ("example.test", False),  # a name no domain entry covers, whatever it resolves to
        ("10.1.2.3", False),
        ("$B1", False),
        ("$GW", False),
    ),
    *_cases(
        "allow-name-deny-its-address",
        ("example.test", False),  # resolves to $A1: the deny CIDR wins
        ("www.example.test", False),
        ("api.example.test", True),  # resolves to $A2
        ("$A1", False),
        ("$A3", False),
        ("other.test", False),
    ),
    *_cases(
        "deny-doc-range",
        ("$A1", False),
        ("$A3", False),
        ("::ffff:$A1", False),
        ("example.test", False),
        ("other.test", False),
        ("$B1", True),
        ("v6.test", True),
        ("192.0.2.1", True),
        ("198.51.100.7", True),
    ),
    *_cases(
        "allow-private-cidr",
        ("10.1.2.3", True),
        ("10.255.255.254", True),
        ("::ffff:10.1.2.3", True),
        ("10.9.1.1", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("$A1", False),
        ("example.test", False),
    ),
    *_cases(
        "allow-everything-cidr",
        ("$A1", True),
        ("$B1", True),
        ("192.0.2.1", True),
        ("10.1.2.3", False),  # a wider entry never opens a private range
        ("fd12::1", False),
        ("::ffff:10.1.2.3", False),
        ("64:ff9b::a01:203", False),
        ("127.0.0.1", False),
        ("169.254.169.254", False),
        ("example.test", False),  # names need a domain entry
        ("$GW", False),
        ("$OTHER", False),
    ),
    *_cases(
        "private-exception",
        ("10.20.1.1", True),
        ("::ffff:10.20.1.1", True),
        ("10.21.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("$A1", True),  # an exception never makes the list allow-only
        ("example.test", True),
    ),
    *_cases(
        "private-exception-deny",
        ("10.77.5.1", True),
        ("10.77.5.7", False),
        ("10.77.6.1", False),
        ("192.168.5.1", False),
        ("other.test", True),
    ),
    *_cases(
        "allow-name-private-exception",
        ("example.test", True),
        ("other.test", False),
        ("10.20.1.1", True),
        ("10.21.0.1", False),
        ("$A3", False),
    ),
    *_cases(
        "deny-v6-range",
        ("$B1", False),
        ("v6.test", False),
        ("2001:db8::1", False),
        ("2001:db9::1", True),
        ("$A1", True),
        ("example.test", True),
    ),
    *_cases(
        "allow-v6-address",
        ("$B1", True),
        ("$B2", False),
        ("2001:db8::1", False),
        ("$A1", False),
        ("v6.test", False),
        ("::ffff:$A1", False),
    ),
    *_cases(
        "allow-ula-and-name",
        ("fd12:3456::1", True),
        ("fd12:3457::1", False),
        ("fc00::1", False),
        ("fe80::1", False),
        ("example.test", True),
        ("other.test", False),
    ),
    *_cases(
        "deny-all-v4",
        ("$A1", False),
        ("example.test", False),
        ("::ffff:$A1", False),
        ("$B1", True),
        ("v6.test", True),
        ("64:ff9b::cb00:7102", False),
    ),
    *_cases(
        "allow-odd-spelling",
        ("example.test", True),
        ("WWW.EXAMPLE.TEST", True),
        ("other.test", False),
    ),
    *_cases(
        "allow-wildcard-deny-parent",
        ("example.test", False),
        ("www.example.test", False),
        ("api.example.test", False),
        ("other.test", False),
    ),
    *_cases(
        "allow-parent-deny-wildcard",
        ("example.test", True),
        ("EXAMPLE.TEST.", True),
        ("www.example.test", False),
        ("api.example.test", False),
        ("deep.a.example.test", False),
    ),
    *_cases(
        "allow-host-and-sandboxes",
        ("$GW", False),
        ("$DOCKER0", False),
        ("$OTHER", False),
        ("$A1", True),
        ("$A2", False),
    ),
    *_cases(
        "deny-name-allow-its-address",
        ("example.test", True),
        ("api.example.test", False),
        ("v1.api.example.test", False),
        ("$A1", True),
        ("$A2", False),
        ("other.test", False),
    ),
    *_cases(
        "http-rules-allow-list",
        ("http://example.test/v1/x", True, "GET"),
        ("http://example.test/v2/", False, "GET"),
        ("http://example.test/v1/x", False, "POST"),
        ("https://example.test/anything", True),  # TLS: an allow rule decides by SNI
        ("http://api.example.test/", False, "GET"),
        ("http://api.example.test/v1/x", True, "GET"),  # rule 1 matches first
        ("https://api.example.test/", True),  # TLS: by SNI, rule 1 (plain: subdomains too) first
        ("http://www.example.test/", False, "GET"),  # named by rule 1, matched by none
        ("example.test:8080", True),  # not HTTP: the lists decide
        ("http://other.test/", False, "GET"),
    ),
    *_cases(
        "http-rules-open",
        ("http://x.wild.test/", False, "GET"),
        ("https://x.wild.test/", False),
        ("http://wild.test/", True, "GET"),
        ("http://other.test/public/a", True, "GET"),
        ("http://other.test/public/a", False, "POST"),
        ("http://other.test/private", False, "GET"),
        ("https://other.test/", True),
        ("http://example.test/", True, "GET"),
        ("x.wild.test:8080", True),
    ),
]


@dataclass
class Tally:
    """Cases asked and cases agreeing, per column; the disagreeing cases' labels."""

    name: str
    asked: int = 0
    agreeing: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)

    def judge(self, case: Case, verdict: bool | None, why: str = "") -> None:
        """`verdict` None: the column does not apply (`why` counts it)."""
        if verdict is None:
            self.skipped[why] = self.skipped.get(why, 0) + 1
            return
        self.asked += 1
        if verdict == case.allowed:
            self.agreeing += 1
        else:
            expected = "allowed" if case.allowed else "refused"
            self.wrong.append(f"{case.label} (expected {expected}{'; ' + why if why else ''})")

    def line(self) -> str:
        skipped = "; ".join(f"{n} not applicable: {why}" for why, n in self.skipped.items())
        return f"{self.name}: {self.agreeing}/{self.asked} agree" + (f" ({skipped})" if skipped else "")
