"""The deny filler's process and lookups (no engine): real dnsmasq processes of the test's own
on loopback; the upstream is a dnsmasq the test starts (`egress_support.upstream_dns`)."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from netpolicy import Domain, parse_domain
from sandboxes.backends.docker.egress.dns import DenyFiller, fillable, lookup
from tests.support.egress_support import free_port, upstream_dns

pytestmark = pytest.mark.skipif(
    shutil.which("dnsmasq") is None and not Path("/usr/sbin/dnsmasq").exists(), reason="needs dnsmasq"
)


def dom(*names: str) -> tuple[Domain, ...]:
    return tuple(parse_domain(n) for n in names)


def test_a_lookup_waits_for_every_answer_and_gives_up_where_nothing_listens() -> None:
    with upstream_dns({"a.test": "203.0.113.5"}) as upstream:
        port = int(upstream.split("#")[1])
        assert lookup(port, ["a.test", "b.test", "a.test"]) == {"a.test", "b.test"}  # NXDOMAIN is an answer too
    started = time.monotonic()
    assert lookup(free_port(), ["a.test"], timeout_s=1.0) == set()
    assert time.monotonic() - started < 1.5


def test_wildcards_name_nothing_to_resolve() -> None:
    assert [str(d) for d in fillable(dom("*.b.test", "a.test", "a.test", "c.test"))] == ["a.test", "c.test"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the filler runs as root (its nftset additions need CAP_NET_ADMIN)")
def test_the_filler_keeps_its_port_takes_another_when_it_is_taken_and_stops_with_nothing_to_do(
    tmp_path: Path,
) -> None:
    filler = DenyFiller(str(tmp_path))
    with upstream_dns({"denied.test": "203.0.113.9"}) as upstream:
        try:
            port = filler.ensure(upstream, dom("denied.test", "*.wild.test"))
            assert port is not None
            pid = filler.resolver.running_pid()
            assert pid is not None
            assert filler.ensure(upstream, dom("denied.test")) == port  # the same names: not restarted
            assert filler.resolver.running_pid() == pid
            assert lookup(port, ["denied.test"]) == {"denied.test"}

            filler.resolver.stop()
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
                taken.bind(("127.0.0.1", port))  # someone else holds its port now
                other = filler.ensure(upstream, dom("denied.test", "more.test"))
            assert other is not None
            assert other != port
            assert lookup(other, ["denied.test", "more.test"]) == {"denied.test", "more.test"}

            assert filler.ensure("", dom("denied.test")) is None  # no upstream: nothing resolves
            assert filler.resolver.running_pid() is None
            filler.ensure(upstream, dom("denied.test"))
            assert filler.ensure(upstream, dom("*.wild.test")) is None  # no name to resolve
            assert filler.resolver.running_pid() is None
        finally:
            filler.resolver.stop()
