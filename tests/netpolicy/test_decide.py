"""netpolicy.decide: one destination through the resolver, the packet filter and the HTTP
rules, and the rule that decides. Table-driven (policy, destination) cases covering plain and
wildcard domains, their subdomains and parents, case and trailing dots, IPv4 and IPv6,
v4-mapped and NAT64 forms, private, link-local, loopback, the host's and other sandboxes'
addresses, deny over allow, CIDR against domain, private exceptions and HTTP rules; pure."""

from __future__ import annotations

import ipaddress

import pytest

from netpolicy import Kind, Layer, Policy, PolicyError, Rule, decide, parse_destination, reserved_class

HOST = reserved_class(ipaddress.ip_network("172.17.0.1/32"), Kind.HOST, "the Docker host")
OTHER = reserved_class(ipaddress.ip_network("172.19.0.0/16"), Kind.SANDBOX, "other sandbox")
RESERVED = (HOST, OTHER)


def on(**lists: object) -> Policy:
    return Policy.parse(allow_internet_access=True, **lists)  # type: ignore[arg-type]


OFF = Policy(allow_internet_access=False)
OPEN = on()
ALLOW_EXAMPLE = on(allow_out=["example.com"])
ALLOW_WILD = on(allow_out=["*.example.com"])
DENY_EXAMPLE = on(deny_out=["example.com"])
DENY_WILD = on(deny_out=["*.example.com"])
ALLOW_BUT_DENY = on(allow_out=["example.com"], deny_out=["admin.example.com"])
ALLOW_CIDR = on(allow_out=["203.0.113.0/24"])
ALLOW_PRIVATE_CIDR = on(allow_out=["10.5.0.0/16"])
ALLOW_EVERY_V4 = on(allow_out=["0.0.0.0/0"])
DENY_CIDR = on(deny_out=["203.0.113.0/24"])
DENY_CIDR_ALLOW_NAME = on(allow_out=["example.com"], deny_out=["203.0.113.0/24"])
EXCEPTION = on(allow_private=["10.9.0.0/16"])
EXCEPTION_DENIED = on(allow_private=["10.9.0.0/16"], deny_out=["10.9.9.0/24"])
ALLOW_V6 = on(allow_out=["2001:db8::/32"])
DENY_V6 = on(deny_out=["2001:db8:1::/48"])

A = True
R = False

# (policy, destination, resolved addresses, allowed, rule, detail contains)
CASES: list[tuple[Policy, str, tuple[str, ...], bool, Rule, str]] = [
    # Outbound off: nothing, whatever is asked.
    (OFF, "example.com", (), R, Rule.OUTBOUND_OFF, ""),
    (OFF, "203.0.113.7", (), R, Rule.OUTBOUND_OFF, ""),
    (OFF, "10.0.0.1", (), R, Rule.OUTBOUND_OFF, ""),
    (OFF, "https://a.test/x", (), R, Rule.OUTBOUND_OFF, ""),
    # No allow list: everything but the always-denied set.
    (OPEN, "example.com", (), A, Rule.NO_LIST, ""),
    (OPEN, "api.example.com:443", (), A, Rule.NO_LIST, ""),
    (OPEN, "203.0.113.7", (), A, Rule.NO_LIST, ""),
    (OPEN, "[2001:db8::1]:80", (), A, Rule.NO_LIST, ""),
    (OPEN, "8.8.8.8", (), A, Rule.NO_LIST, ""),
    (OPEN, "example.com", ("203.0.113.7",), A, Rule.NO_LIST, ""),
    (OPEN, "10.1.2.3", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "172.16.0.1", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "192.168.0.1", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "100.64.0.1", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "[fd00::5]:80", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "169.254.169.254", (), R, Rule.ALWAYS_DENIED, "link-local"),
    (OPEN, "[fe80::1]:80", (), R, Rule.ALWAYS_DENIED, "link-local"),
    (OPEN, "100.100.100.200", (), R, Rule.ALWAYS_DENIED, "link-local"),
    (OPEN, "127.0.0.1", (), R, Rule.ALWAYS_DENIED, "loopback"),
    (OPEN, "[::1]:22", (), R, Rule.ALWAYS_DENIED, "loopback"),
    (OPEN, "0.0.0.0", (), R, Rule.ALWAYS_DENIED, "loopback"),
    (OPEN, "172.17.0.1", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (OPEN, "172.17.0.1:8080", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (OPEN, "172.19.0.2", (), R, Rule.ALWAYS_DENIED, "other sandbox"),
    (OPEN, "172.18.0.1", (), R, Rule.ALWAYS_DENIED, "private range"),
    # A name resolving to an always-denied address is refused at the packet filter.
    (OPEN, "internal.test", ("10.0.0.7",), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "meta.test", ("169.254.169.254",), R, Rule.ALWAYS_DENIED, "link-local"),
    (OPEN, "host.test", ("172.17.0.1",), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (OPEN, "peer.test", ("203.0.113.7", "172.19.0.9"), R, Rule.ALWAYS_DENIED, "other sandbox"),
    # v4-mapped forms are judged as the IPv4 address they carry.
    (OPEN, "[::ffff:169.254.169.254]:80", (), R, Rule.ALWAYS_DENIED, "link-local"),
    (OPEN, "[::ffff:10.0.0.1]:80", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "[::ffff:127.0.0.1]:80", (), R, Rule.ALWAYS_DENIED, "loopback"),
    (OPEN, "[::ffff:172.17.0.1]:80", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (OPEN, "[::ffff:203.0.113.7]:80", (), A, Rule.NO_LIST, ""),
    # NAT64 prefixes are private ranges.
    (OPEN, "[64:ff9b::a00:1]:80", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "[64:ff9b::cb00:7107]:80", (), R, Rule.ALWAYS_DENIED, "private range"),
    (OPEN, "[64:ff9b:1::a00:1]:80", (), R, Rule.ALWAYS_DENIED, "private range"),
    # A plain domain: the name and every subdomain, allowed...
    (ALLOW_EXAMPLE, "example.com", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_EXAMPLE, "api.example.com", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_EXAMPLE, "a.b.example.com", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_EXAMPLE, "API.Example.COM.", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_EXAMPLE, "https://api.example.com/v1", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_EXAMPLE, "api.example.com", ("203.0.113.7",), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_EXAMPLE, "badexample.com", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_EXAMPLE, "example.org", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_EXAMPLE, "example.com.evil.test", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_EXAMPLE, "com.test", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_EXAMPLE, "203.0.113.7", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_EXAMPLE, "api.example.com", ("10.0.0.7",), R, Rule.ALWAYS_DENIED, "private range"),
    (ALLOW_EXAMPLE, "api.example.com", ("169.254.169.254",), R, Rule.ALWAYS_DENIED, "link-local"),
    (ALLOW_EXAMPLE, "api.example.com", ("172.17.0.1",), R, Rule.ALWAYS_DENIED, "the Docker host"),
    # ...and denied.
    (DENY_EXAMPLE, "example.com", (), R, Rule.DENY_ENTRY, "example.com"),
    (DENY_EXAMPLE, "api.example.com", (), R, Rule.DENY_ENTRY, "example.com"),
    (DENY_EXAMPLE, "a.b.example.com", (), R, Rule.DENY_ENTRY, "example.com"),
    (DENY_EXAMPLE, "Api.Example.Com.", (), R, Rule.DENY_ENTRY, "example.com"),
    (DENY_EXAMPLE, "https://api.example.com/", (), R, Rule.DENY_ENTRY, "example.com"),
    (DENY_EXAMPLE, "badexample.com", (), A, Rule.NO_LIST, ""),
    (DENY_EXAMPLE, "example.org", (), A, Rule.NO_LIST, ""),
    (DENY_EXAMPLE, "203.0.113.7", (), A, Rule.NO_LIST, ""),
    # A wildcard: the subdomains only, never the parent.
    (ALLOW_WILD, "api.example.com", (), A, Rule.ALLOW_ENTRY, "*.example.com"),
    (ALLOW_WILD, "a.b.example.com", (), A, Rule.ALLOW_ENTRY, "*.example.com"),
    (ALLOW_WILD, "example.com", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_WILD, "example.com.", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_WILD, "other.test", (), R, Rule.NOT_ALLOWED, ""),
    (DENY_WILD, "api.example.com", (), R, Rule.DENY_ENTRY, "*.example.com"),
    (DENY_WILD, "example.com", (), A, Rule.NO_LIST, ""),
    (DENY_WILD, "EXAMPLE.COM.", (), A, Rule.NO_LIST, ""),
    # Deny wins over allow.
    (ALLOW_BUT_DENY, "admin.example.com", (), R, Rule.DENY_ENTRY, "admin.example.com"),
    (ALLOW_BUT_DENY, "x.admin.example.com", (), R, Rule.DENY_ENTRY, "admin.example.com"),
    (ALLOW_BUT_DENY, "https://admin.example.com/x", (), R, Rule.DENY_ENTRY, "admin.example.com"),
    (ALLOW_BUT_DENY, "api.example.com", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_BUT_DENY, "example.com", (), A, Rule.ALLOW_ENTRY, "example.com"),
    (ALLOW_BUT_DENY, "admin.example.com.", (), R, Rule.DENY_ENTRY, "admin.example.com"),
    # CIDR allow entries.
    (ALLOW_CIDR, "203.0.113.7", (), A, Rule.ALLOW_ENTRY, "203.0.113.0/24"),
    (ALLOW_CIDR, "203.0.113.255:443", (), A, Rule.ALLOW_ENTRY, "203.0.113.0/24"),
    (ALLOW_CIDR, "203.0.114.1", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_CIDR, "[2001:db8::1]:80", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_CIDR, "[::ffff:203.0.113.7]:80", (), A, Rule.ALLOW_ENTRY, "203.0.113.0/24"),
    # A CIDR entry allows a name's addresses, never the name itself (the resolver refuses it).
    (ALLOW_CIDR, "cdn.test", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_CIDR, "cdn.test", ("203.0.113.9",), R, Rule.NOT_ALLOWED, ""),
    # A private range is opened by an allow entry inside it, never by a wider one.
    (ALLOW_PRIVATE_CIDR, "10.5.0.1", (), A, Rule.ALLOW_ENTRY, "10.5.0.0/16"),
    (ALLOW_PRIVATE_CIDR, "10.6.0.1", (), R, Rule.ALWAYS_DENIED, "private range"),
    (ALLOW_PRIVATE_CIDR, "[::ffff:10.5.0.1]:80", (), A, Rule.ALLOW_ENTRY, "10.5.0.0/16"),
    (ALLOW_PRIVATE_CIDR, "203.0.113.7", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_EVERY_V4, "203.0.113.7", (), A, Rule.ALLOW_ENTRY, "0.0.0.0/0"),
    (ALLOW_EVERY_V4, "8.8.8.8", (), A, Rule.ALLOW_ENTRY, "0.0.0.0/0"),
    (ALLOW_EVERY_V4, "10.1.2.3", (), R, Rule.ALWAYS_DENIED, "private range"),
    (ALLOW_EVERY_V4, "169.254.169.254", (), R, Rule.ALWAYS_DENIED, "link-local"),
    (ALLOW_EVERY_V4, "127.0.0.1", (), R, Rule.ALWAYS_DENIED, "loopback"),
    (ALLOW_EVERY_V4, "172.17.0.1", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (ALLOW_EVERY_V4, "172.19.0.2", (), R, Rule.ALWAYS_DENIED, "other sandbox"),
    (ALLOW_EVERY_V4, "[2001:db8::1]:80", (), R, Rule.NOT_ALLOWED, ""),
    # CIDR deny entries.
    (DENY_CIDR, "203.0.113.7", (), R, Rule.DENY_ENTRY, "203.0.113.0/24"),
    (DENY_CIDR, "[::ffff:203.0.113.7]:80", (), R, Rule.DENY_ENTRY, "203.0.113.0/24"),
    (DENY_CIDR, "198.51.100.1", (), A, Rule.NO_LIST, ""),
    (DENY_CIDR, "cdn.test", ("203.0.113.9",), R, Rule.DENY_ENTRY, "203.0.113.0/24"),
    (DENY_CIDR, "cdn.test", ("198.51.100.9",), A, Rule.NO_LIST, ""),
    (DENY_CIDR_ALLOW_NAME, "api.example.com", ("203.0.113.9",), R, Rule.DENY_ENTRY, "203.0.113.0/24"),
    (DENY_CIDR_ALLOW_NAME, "api.example.com", ("198.51.100.9",), A, Rule.ALLOW_ENTRY, "example.com"),
    (DENY_CIDR_ALLOW_NAME, "api.example.com", (), A, Rule.ALLOW_ENTRY, "example.com"),
    # The host's own addresses are refused before any list, a deny entry included.
    (DENY_CIDR, "172.17.0.1", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (on(allow_out=["172.17.0.1"]), "172.17.0.1", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (on(allow_private=["172.17.0.0/16"]), "172.17.0.1", (), R, Rule.ALWAYS_DENIED, "the Docker host"),
    (on(allow_out=["172.19.0.0/16"]), "172.19.0.2", (), R, Rule.ALWAYS_DENIED, "other sandbox"),
    (on(allow_private=["172.19.0.0/16"]), "172.19.0.2", (), R, Rule.ALWAYS_DENIED, "other sandbox"),
    # Private exceptions open their part without making the list allow-only; deny still wins.
    (EXCEPTION, "10.9.1.1", (), A, Rule.PRIVATE_EXCEPTION, "10.9.0.0/16"),
    (EXCEPTION, "10.8.1.1", (), R, Rule.ALWAYS_DENIED, "private range"),
    (EXCEPTION, "203.0.113.7", (), A, Rule.NO_LIST, ""),
    (EXCEPTION, "example.com", (), A, Rule.NO_LIST, ""),
    (EXCEPTION_DENIED, "10.9.9.9", (), R, Rule.DENY_ENTRY, "10.9.9.0/24"),
    (EXCEPTION_DENIED, "10.9.8.9", (), A, Rule.PRIVATE_EXCEPTION, "10.9.0.0/16"),
    (on(allow_out=["example.com"], allow_private=["10.9.0.0/16"]), "10.9.1.1", (), A, Rule.PRIVATE_EXCEPTION, ""),
    (on(allow_out=["example.com"], allow_private=["10.9.0.0/16"]), "203.0.113.7", (), R, Rule.NOT_ALLOWED, ""),
    # IPv6 entries.
    (ALLOW_V6, "[2001:db8::1]:443", (), A, Rule.ALLOW_ENTRY, "2001:db8::/32"),
    (ALLOW_V6, "[2001:db9::1]:443", (), R, Rule.NOT_ALLOWED, ""),
    (ALLOW_V6, "203.0.113.7", (), R, Rule.NOT_ALLOWED, ""),
    (DENY_V6, "[2001:db8:1::5]:80", (), R, Rule.DENY_ENTRY, "2001:db8:1::/48"),
    (DENY_V6, "[2001:db8:2::5]:80", (), A, Rule.NO_LIST, ""),
    (DENY_V6, "v6.test", ("2001:db8:1::7",), R, Rule.DENY_ENTRY, "2001:db8:1::/48"),
]


@pytest.mark.parametrize(("policy", "text", "resolved", "allowed", "rule", "detail"), CASES)
def test_decide(policy: Policy, text: str, resolved: tuple[str, ...], allowed: bool, rule: Rule, detail: str) -> None:
    destination = parse_destination(text)
    if resolved:
        destination = destination.resolved(*resolved)
    decision = decide(policy, destination, reserved=RESERVED)
    assert (decision.allowed, decision.rule) == (allowed, rule), decision
    assert detail in f"{decision.detail} {decision.reason}", decision
    assert decision.sentence


def test_without_the_reserved_ranges_the_host_is_a_private_address() -> None:
    decision = decide(OPEN, parse_destination("172.17.0.1"))
    assert (decision.allowed, decision.rule, decision.detail) == (False, Rule.ALWAYS_DENIED, "private range")


def test_a_name_is_decided_at_the_resolver_and_an_address_at_the_packet_filter() -> None:
    assert decide(DENY_EXAMPLE, parse_destination("api.example.com")).layer == Layer.DNS
    assert decide(ALLOW_EXAMPLE, parse_destination("other.test")).layer == Layer.DNS
    assert decide(DENY_CIDR, parse_destination("203.0.113.7")).layer == Layer.PACKET
    assert decide(OPEN, parse_destination("10.0.0.1")).layer == Layer.PACKET


RULES = on(
    allow_out=["example.com", "a.test"],
    l7_rules=["deny api.example.com * /admin", "allow api.example.com GET,POST /", "allow *.a.test"],
)

# (destination, allowed, rule, layer): HTTP rules apply to HTTP (80) and TLS (443, by SNI).
HTTP_CASES = [
    ("http://api.example.com/admin/x", R, Rule.HTTP_RULE, Layer.HTTP),
    ("http://api.example.com/v1", A, Rule.HTTP_RULE, Layer.HTTP),
    ("api.example.com:80", R, Rule.HTTP_RULE, Layer.HTTP),  # path unknown: the first rule for the host
    ("https://api.example.com/admin", A, Rule.HTTP_RULE, Layer.TLS),  # the narrow deny cannot be seen in TLS
    ("api.example.com:443", A, Rule.HTTP_RULE, Layer.TLS),
    ("api.example.com:22", A, Rule.ALLOW_ENTRY, Layer.DNS),  # not HTTP: the lists decide
    ("api.example.com", A, Rule.ALLOW_ENTRY, Layer.DNS),
    ("http://example.com/", A, Rule.ALLOW_ENTRY, Layer.DNS),  # a host no rule names
    ("http://x.a.test/", A, Rule.HTTP_RULE, Layer.HTTP),
    ("http://a.test/", A, Rule.ALLOW_ENTRY, Layer.DNS),  # *.a.test names subdomains only
    ("http://other.test/", R, Rule.NOT_ALLOWED, Layer.DNS),
]


@pytest.mark.parametrize(("text", "allowed", "rule", "layer"), HTTP_CASES)
def test_http_rules(text: str, allowed: bool, rule: Rule, layer: Layer) -> None:
    decision = decide(RULES, parse_destination(text))
    assert (decision.allowed, decision.rule, decision.layer) == (allowed, rule, layer), decision


def test_a_host_some_rule_names_but_none_lets_through_is_refused() -> None:
    policy = on(l7_rules=["allow api.test GET /v1/"])
    decision = decide(policy, parse_destination("http://api.test/v2/"))
    assert (decision.allowed, decision.rule) == (False, Rule.HTTP_UNMATCHED)
    tls = decide(on(l7_rules=["deny api.test GET /x"]), parse_destination("https://api.test/"))
    assert (tls.allowed, tls.rule) == (False, Rule.TLS_UNMATCHED)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "give one destination"),
        ("a b", "give one destination"),
        ("ftp://example.com/", "only http:// and https://"),
        ("*.example.com", "not a wildcard"),
        ("host.test:port", "the port must be a number"),
        ("host.test:0", "from 1 to 65535"),
        ("host.test:65536", "from 1 to 65535"),
        ("not_a_name", "not a domain name"),
        ("bad_label.test", "not a valid domain label"),
        ("single", "not a domain name"),
        ("x" * 501, "give one destination"),
    ],
)
def test_bad_destinations_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_destination(text)


@pytest.mark.parametrize(
    ("text", "name", "address", "port"),
    [
        ("Example.COM.", "example.com", None, None),
        ("example.com:8443", "example.com", None, 8443),
        ("https://API.example.com/x", "api.example.com", None, None),
        ("203.0.113.7", None, "203.0.113.7", None),
        ("203.0.113.7:22", None, "203.0.113.7", 22),
        ("[2001:db8::1]:443", None, "2001:db8::1", 443),
        ("[2001:db8::1]", None, "2001:db8::1", None),
        ("2001:db8::1", None, "2001:db8::1", None),
        ("http://[2001:db8::1]:8080/", None, "2001:db8::1", 8080),
    ],
)
def test_destinations_parse(text: str, name: str | None, address: str | None, port: int | None) -> None:
    destination = parse_destination(text)
    assert destination.name == name
    assert (str(destination.addresses[0]) if destination.addresses else None) == address
    assert destination.port == port


@pytest.mark.parametrize("text", ["2001:db8::1%eth0", "[2001:db8::1%x]:443", "fe80::1%1"])
def test_a_destination_with_a_zone_index_is_refused(text: str) -> None:
    """Explain would otherwise offer "Add 2001:db8::1%eth0/128 to the allow list", an entry the
    policy refuses to save (a zone index names an interface, never a destination)."""
    with pytest.raises(PolicyError, match="zone index"):
        parse_destination(text)
