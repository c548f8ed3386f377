"""netpolicy's entries: the one parser (its normal forms and its messages for the admin), and
what a plain or wildcard domain and a CIDR match and cover. Table-driven; pure."""

from __future__ import annotations

import ipaddress
import re

import pytest

from netpolicy import Cidr, Domain, PolicyError, parse_domain, parse_entry, parse_l7_rule


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("192.168.1.7", "192.168.1.7/32"),
        (" 192.168.1.7 ", "192.168.1.7/32"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("2001:DB8:0:0::/64", "2001:db8::/64"),
        ("::1", "::1/128"),
        ("::ffff:10.0.0.1", "::ffff:a00:1/128"),
        ("0.0.0.0/0", "0.0.0.0/0"),
        ("::/0", "::/0"),
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("*.example.com", "*.example.com"),
        ("*.Example.Com.", "*.example.com"),
        ("api.example.co.uk.", "api.example.co.uk"),
        ("a-b.c-d.test", "a-b.c-d.test"),
        ("xn--bcher-kva.test", "xn--bcher-kva.test"),
        ("1a.test", "1a.test"),
        ("a.b.c.d.e.test", "a.b.c.d.e.test"),
    ],
)
def test_entries_parse_to_one_normal_form(text: str, normal: str) -> None:
    assert str(parse_entry(text)) == normal
    assert str(parse_entry(str(parse_entry(text)))) == normal  # the normal form parses to itself


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty entry"),
        ("   ", "empty entry"),
        ("10.0.0.1/8", "host bits are set; did you mean 10.0.0.0/8"),
        ("2001:db8::1/32", "host bits are set; did you mean 2001:db8::/32"),
        ("10.0.0.0/33", "not a valid IP address or CIDR"),
        ("300.1.1.1", "not a valid IP address or CIDR"),
        ("1.2.3", "not a valid IP address"),
        ("1.2.3.4.5", "not a valid IP address"),
        ("fe80::1%eth0/64", "zone index"),
        ("exa mple.com", "cannot contain spaces"),
        ("a.test\tb.test", "cannot contain spaces"),
        ("example", "not a domain name"),
        ("localhost", "not a domain name"),
        ("ex_ample.com", "not a valid domain label"),
        ("-bad.example.com", "not a valid domain label"),
        ("bad-.example.com", "not a valid domain label"),
        ("a..b.test", "not a valid domain label"),
        ("api.*.example.com", "only allowed as a leading"),
        ("*example.com", "only allowed as a leading"),
        ("*.*.example.com", "only allowed as a leading"),
        ("**.example.com", "only allowed as a leading"),
        ("*.com.", "not a domain name"),
        ("a." + "b" * 64 + ".test", "not a valid domain label"),
        (".".join(["abcdefgh"] * 30) + ".test", "at most 253 characters"),
        ("10.0.0.0/8/9", "not a valid IP address or CIDR"),
        ("10.0.0.256", "not a valid IP address"),
        ("ümlaut.test", "not a valid domain label"),
    ],
)
def test_bad_entries_name_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse_entry(text)


def test_a_policy_error_is_a_value_error() -> None:
    assert issubclass(PolicyError, ValueError)


# (entry, name, matches): a plain domain is the name and every name below it; a wildcard the
# names below only; never a sibling or a name merely ending in the same letters.
MATCHES = [
    ("example.com", "example.com", True),
    ("example.com", "api.example.com", True),
    ("example.com", "a.b.example.com", True),
    ("example.com", "EXAMPLE.com.", True),
    ("example.com", "API.Example.COM.", True),
    ("example.com", "badexample.com", False),
    ("example.com", "example.com.evil.test", False),
    ("example.com", "com", False),
    ("example.com", "example.org", False),
    ("example.com", "xexample.com", False),
    ("*.example.com", "example.com", False),
    ("*.example.com", "api.example.com", True),
    ("*.example.com", "a.b.example.com", True),
    ("*.example.com", "API.EXAMPLE.COM.", True),
    ("*.example.com", "badexample.com", False),
    ("*.example.com", "example.com.", False),
    ("api.example.com", "example.com", False),
    ("api.example.com", "api.example.com", True),
    ("api.example.com", "v1.api.example.com", True),
    ("api.example.com", "web.example.com", False),
    ("*.api.example.com", "api.example.com", False),
    ("*.api.example.com", "v1.api.example.com", True),
    ("a.test", "a.test", True),
    ("a.test", "b.a.test", True),
    ("a.test", "ba.test", False),
    ("*.a.test", "a.test", False),
]


@pytest.mark.parametrize(("entry", "name", "matches"), MATCHES)
def test_what_a_domain_entry_matches(entry: str, name: str, matches: bool) -> None:
    domain = parse_domain(entry)
    assert domain.matches_name(name) is matches


# (covering, covered, covers): every name `covered` matches is matched by `covering`.
COVERS = [
    ("example.com", "example.com", True),
    ("example.com", "*.example.com", True),
    ("example.com", "api.example.com", True),
    ("example.com", "*.api.example.com", True),
    ("*.example.com", "example.com", False),
    ("*.example.com", "*.example.com", True),
    ("*.example.com", "api.example.com", True),
    ("*.example.com", "*.api.example.com", True),
    ("api.example.com", "example.com", False),
    ("api.example.com", "*.example.com", False),
    ("example.com", "example.org", False),
    ("example.com", "badexample.com", False),
    ("10.0.0.0/8", "10.1.0.0/16", True),
    ("10.0.0.0/8", "10.0.0.0/8", True),
    ("10.1.0.0/16", "10.0.0.0/8", False),
    ("10.0.0.0/8", "11.0.0.0/8", False),
    ("0.0.0.0/0", "203.0.113.7", True),
    ("0.0.0.0/0", "2001:db8::1", False),
    ("::/0", "2001:db8::1", True),
    ("::/0", "10.0.0.1", False),
    ("10.0.0.0/8", "example.com", False),
    ("example.com", "10.0.0.0/8", False),
]


@pytest.mark.parametrize(("covering", "covered", "covers"), COVERS)
def test_what_an_entry_covers(covering: str, covered: str, covers: bool) -> None:
    assert parse_entry(covering).covers(parse_entry(covered)) is covers


@pytest.mark.parametrize(
    ("cidr", "address", "matches"),
    [
        ("10.0.0.0/8", "10.255.255.255", True),
        ("10.0.0.0/8", "11.0.0.0", False),
        ("203.0.113.0/24", "203.0.113.0", True),
        ("2001:db8::/32", "2001:db8:ffff::1", True),
        ("2001:db8::/32", "2001:db9::1", False),
        ("0.0.0.0/0", "::1", False),
        ("::/0", "127.0.0.1", False),
        ("198.51.100.7/32", "198.51.100.7", True),
        ("198.51.100.7/32", "198.51.100.8", False),
    ],
)
def test_what_a_cidr_matches(cidr: str, address: str, matches: bool) -> None:
    entry = parse_entry(cidr)
    assert isinstance(entry, Cidr)
    assert entry.matches_address(ipaddress.ip_address(address)) is matches


def test_entries_are_values() -> None:
    assert parse_entry("Example.com.") == Domain("example.com")
    assert parse_entry("*.example.com") == Domain("example.com", wildcard=True)
    assert parse_entry("10.0.0.1") == Cidr(ipaddress.ip_network("10.0.0.1/32"))
    assert len({parse_entry("a.test"), parse_entry("A.test."), parse_entry("*.a.test")}) == 2


@pytest.mark.parametrize(
    ("rule", "line"),
    [
        ("allow api.example.com", "allow api.example.com * /"),
        ("deny a.test get,post /admin", "deny a.test GET,POST /admin"),
        ("ALLOW *.a.test * /v1/", "allow *.a.test * /v1/"),
        ({"domain": "A.test", "methods": ["get"], "path_prefix": "/x", "action": "deny"}, "deny a.test GET /x"),
        ({"domain": "a.test", "action": "allow"}, "allow a.test * /"),
    ],
)
def test_http_rules_parse_from_lines_and_objects(rule: object, line: str) -> None:
    parsed = parse_l7_rule(rule)
    assert parsed.as_line() == line
    assert parse_l7_rule(parsed.as_json()) == parsed
    assert parse_l7_rule(parsed.as_line()) == parsed


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("permit a.com", "must be 'allow' or 'deny'"),
        ("allow not_a_domain", "not a domain name"),
        ("allow a.com FETCH", "not an HTTP method"),
        ("allow a.com GET,GET", "listed twice"),
        ("allow a.com GET repos/", "must start with '/'"),
        ("allow", "expected 'allow|deny DOMAIN"),
        ("allow a.com GET / extra", "expected 'allow|deny DOMAIN"),
        ({"domain": "a.com", "methods": "GET", "action": "allow"}, "must be a list"),
        ({"domain": 7, "action": "allow"}, "must be strings"),
        ({"domain": "a.com", "action": "allow", "path_prefix": "/a\x00b"}, "control characters"),
        (42, "must be an object"),
    ],
)
def test_malformed_http_rules(rule: object, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse_l7_rule(rule)


@pytest.mark.parametrize(
    ("rule", "name", "method", "path", "matches"),
    [
        ("allow example.com", "api.example.com", "GET", "/", True),
        ("allow *.example.com", "example.com", "GET", "/", False),
        ("deny a.test GET /admin", "a.test", "GET", "/admin/x", True),
        ("deny a.test GET /admin", "a.test", "POST", "/admin/x", False),
        ("deny a.test GET /admin", "a.test", "GET", "/public", False),
        ("deny a.test GET /admin", "a.test", None, None, True),
        ("allow a.test * /v1/", "b.a.test", "DELETE", "/v1/x", True),
    ],
)
def test_what_an_http_rule_matches(rule: str, name: str, method: str | None, path: str | None, matches: bool) -> None:
    assert parse_l7_rule(rule).matches(name, method, path) is matches


@pytest.mark.parametrize("text", ["fe80::%eth0/64", "2001:db8::%x/64", "fe80::1%eth0", "2001:db8::1%1"])
def test_a_scoped_ipv6_entry_is_refused(text: str) -> None:
    """A zone index (`%eth0`) names an interface of some host, not a destination; Python's
    ipaddress keeps it in the network's text, which nftables cannot load (the whole chain
    then fails to apply) and which is a different value from the same range unscoped."""
    with pytest.raises(PolicyError, match=re.escape("zone index")):
        parse_entry(text)
