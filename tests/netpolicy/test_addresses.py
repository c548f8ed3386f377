"""netpolicy's special address classes: which class decides an address for a sandbox's
policy (IPv4-mapped IPv6 judged as the IPv4 address inside, NAT64 a private range), the
backend's reserved ranges, the IPv4 addresses IPv6 forms embed. Table-driven; pure."""

from __future__ import annotations

import ipaddress

import pytest

from netpolicy import Kind, Treatment, reserved_class, sandbox_class, unmapped
from netpolicy.addresses import embedded_ipv4

HOST = reserved_class(ipaddress.ip_network("172.17.0.1/32"), Kind.HOST, "the Docker host")
OTHER = reserved_class(ipaddress.ip_network("172.19.0.0/16"), Kind.SANDBOX, "other sandbox")


@pytest.mark.parametrize(
    ("address", "kind", "treatment"),
    [
        ("169.254.169.254", Kind.LINK_LOCAL, Treatment.NEVER),
        ("169.254.0.1", Kind.LINK_LOCAL, Treatment.NEVER),
        ("fe80::1", Kind.LINK_LOCAL, Treatment.NEVER),
        ("100.100.100.200", Kind.LINK_LOCAL, Treatment.NEVER),
        ("168.63.129.16", Kind.LINK_LOCAL, Treatment.NEVER),
        ("fd00:ec2::254", Kind.LINK_LOCAL, Treatment.NEVER),
        ("127.0.0.1", Kind.LOOPBACK, Treatment.NEVER),
        ("127.255.0.9", Kind.LOOPBACK, Treatment.NEVER),
        ("::1", Kind.LOOPBACK, Treatment.NEVER),
        ("0.0.0.0", Kind.LOOPBACK, Treatment.NEVER),
        ("0.1.2.3", Kind.LOOPBACK, Treatment.NEVER),
        ("::", Kind.LOOPBACK, Treatment.NEVER),
        # IPv4-mapped: the IPv4 address inside decides.
        ("::ffff:169.254.169.254", Kind.LINK_LOCAL, Treatment.NEVER),
        ("::ffff:127.0.0.1", Kind.LOOPBACK, Treatment.NEVER),
        ("::ffff:10.1.2.3", Kind.PRIVATE, Treatment.OPENABLE),
        ("10.1.2.3", Kind.PRIVATE, Treatment.OPENABLE),
        ("172.16.0.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("172.31.255.254", Kind.PRIVATE, Treatment.OPENABLE),
        ("192.168.1.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("100.64.0.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("fd00::5", Kind.PRIVATE, Treatment.OPENABLE),
        ("fc00::1", Kind.PRIVATE, Treatment.OPENABLE),
        ("fec0::1", Kind.PRIVATE, Treatment.OPENABLE),
        ("224.0.0.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("ff02::1", Kind.PRIVATE, Treatment.OPENABLE),
        ("255.255.255.255", Kind.PRIVATE, Treatment.OPENABLE),
        ("240.0.0.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("198.18.0.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("192.0.0.8", Kind.PRIVATE, Treatment.OPENABLE),
        # NAT64: the well-known prefix and the local-use one are private ranges.
        ("64:ff9b::10.0.0.1", Kind.PRIVATE, Treatment.OPENABLE),
        ("64:ff9b::203.0.113.7", Kind.PRIVATE, Treatment.OPENABLE),
        ("64:ff9b:1::a00:1", Kind.PRIVATE, Treatment.OPENABLE),
    ],
)
def test_the_class_that_decides_an_address(address: str, kind: Kind, treatment: Treatment) -> None:
    found = sandbox_class(ipaddress.ip_address(address))
    assert found is not None
    assert (found.kind, found.sandbox) == (kind, treatment)
    assert found.reason


@pytest.mark.parametrize(
    "address",
    [
        "203.0.113.7",  # documentation ranges are ordinary destinations for a sandbox
        "198.51.100.1",
        "192.0.2.1",
        "2001:db8::1",
        "8.8.8.8",
        "1.1.1.1",
        "172.32.0.1",  # just outside 172.16.0.0/12
        "172.15.255.255",
        "100.128.0.1",  # just outside 100.64.0.0/10
        "2606:4700::1111",
        "::ffff:203.0.113.7",
    ],
)
def test_ordinary_destinations_have_no_class(address: str) -> None:
    assert sandbox_class(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("172.17.0.1", Kind.HOST),
        ("::ffff:172.17.0.1", Kind.HOST),
        ("172.19.0.2", Kind.SANDBOX),
        ("172.19.255.1", Kind.SANDBOX),
        ("172.18.0.5", Kind.PRIVATE),  # in no reserved range: an ordinary private address
    ],
)
def test_reserved_ranges_are_never_reachable_before_the_private_ranges(address: str, kind: Kind) -> None:
    found = sandbox_class(ipaddress.ip_address(address), (HOST, OTHER))
    assert found is not None
    assert found.kind == kind
    assert found.sandbox == (Treatment.OPENABLE if kind == Kind.PRIVATE else Treatment.NEVER)


@pytest.mark.parametrize(
    ("address", "unmapped_to"),
    [("::ffff:10.0.0.1", "10.0.0.1"), ("::ffff:203.0.113.7", "203.0.113.7"), ("10.0.0.1", "10.0.0.1"), ("::1", "::1")],
)
def test_v4_mapped_addresses_are_judged_as_the_address_inside(address: str, unmapped_to: str) -> None:
    assert unmapped(ipaddress.ip_address(address)) == ipaddress.ip_address(unmapped_to)


@pytest.mark.parametrize(
    ("address", "inside"),
    [
        ("::ffff:169.254.169.254", ["169.254.169.254"]),
        ("::ffff:0:a00:1", ["10.0.0.1"]),  # SIIT
        ("::a00:1", ["10.0.0.1"]),  # IPv4-compatible
        ("64:ff9b::a9fe:a9fe", ["169.254.169.254"]),
        ("2002:a9fe:a9fe::1", ["169.254.169.254"]),  # 6to4
        ("::1", []),
        ("::", []),
        ("2001:db8::1", []),
    ],
)
def test_ipv6_forms_that_embed_an_ipv4_address(address: str, inside: list[str]) -> None:
    assert [str(a) for a in embedded_ipv4(ipaddress.ip_address(address))] == inside
