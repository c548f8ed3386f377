"""The deny filler (`dns.DenyFiller`): its process and lookups, with real dnsmasq processes of
the test's own on loopback (the upstream is a dnsmasq the test starts,
`egress_support.upstream_dns`), an upstream that never answers one name, and a hung filler
replaced on the real engine."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from netpolicy import Domain, parse_domain
from sandboxes.backends.base import NetworkSpec, SandboxInfo
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress import dns
from sandboxes.backends.docker.egress.component import DockerEgress
from sandboxes.backends.docker.egress.dns import DenyFiller, fillable, lookup
from sandboxes.backends.docker.egress.firewall import TABLE_FAMILY, TABLE_NAME
from sandboxes.backends.docker.egress.rules import domain_sets
from tests.support.egress_support import (
    DualNamespace,
    NamespaceServers,
    SandboxMaker,
    docker_backend,
    dual_namespace,
    free_port,
    probe,
    sandbox_maker,
    upstream_dns,
)

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


# An upstream where one denied name never answers (its authoritative servers black-holed: any
# tenant can name such a domain in a deny list). A refresh asks for every space's denied names at
# once; the names after the slow one's batch must still be resolved into their sets in time. Its
# upstream answers every name but forwards the slow one to a loopback socket that never reads.

SLOW = "a-slow.test"  # sorts first, as `fillable` orders the names


@contextmanager
def upstream_with_a_black_hole() -> Iterator[str]:
    """`127.0.0.1#port` of a dnsmasq answering every name at once (NXDOMAIN) but `SLOW`, which
    it forwards to a bound loopback socket that never reads."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hole:
        hole.bind(("127.0.0.1", 0))
        hole_port = hole.getsockname()[1]
        port = free_port()
        folder = tempfile.mkdtemp(prefix="black-hole-upstream-")
        binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        args = [
            binary,
            "--keep-in-foreground",
            "--no-resolv",
            "--no-hosts",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            f"--port={port}",
            f"--pid-file={folder}/pid",
            "--user=root",
            "--address=/#/",
            f"--server=/{SLOW}/127.0.0.1#{hole_port}",
        ]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            assert process.poll() is None
            yield f"127.0.0.1#{port}"
        finally:
            process.terminate()
            process.wait(timeout=5)
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(shutil.which("dnsmasq") is None and (not Path("/usr/sbin/dnsmasq").exists()), reason="dnsmasq")
@pytest.mark.skipif(os.geteuid() != 0, reason="the filler runs as root (nftset additions need CAP_NET_ADMIN)")
def test_one_black_holed_denied_name_does_not_keep_the_others_out_of_their_sets(tmp_path: Path) -> None:
    others = [f"n{i:03d}.test" for i in range(100)]  # several spaces' deny entries, > one batch
    entries = fillable(parse_domain(n) for n in [SLOW, *others])
    names = [d.name for d in entries]
    filler = DenyFiller(str(tmp_path))
    with upstream_with_a_black_hole() as upstream:
        try:
            port = filler.ensure(upstream, entries)
            assert port is not None
            answered = lookup(port, names)  # as `DockerEgress._fill` asks after a table restore
            missing = sorted(set(others) - answered)
            assert not missing, f"{len(missing)} of {len(others)} names not resolved behind {SLOW}: {missing[:3]}..."
        finally:
            filler.resolver.stop()


# A deny filler that hangs (alive, answering nothing) must be replaced: its pid alive and its
# configuration unchanged, DenyFiller.ensure would keep it, every lookup time out, and a policy
# with a denied name be said to be in force while the name's address is not in its set. On the
# real engine, with an egress state folder of the test's own (so its filler is the test's alone).

EVIL = f"hung-{secrets.token_hex(3)}.test"


@pytest.fixture(scope="module")
def ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def servers(ns: DualNamespace) -> Iterator[NamespaceServers]:
    with NamespaceServers(ns) as servers:
        yield servers


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str, ns: DualNamespace) -> Iterator[DockerBackend]:
    state_dir = tempfile.mkdtemp(prefix="hung-filler-egress-")
    with upstream_dns({EVIL: ns.v4}) as upstream:
        with docker_backend(test_run_id, upstream, {"egress_state_dir": state_dir}) as adapter:
            yield adapter
        dns.DenyFiller(os.path.join(state_dir, "dns")).resolver.stop()


@pytest.fixture
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, "hung-filler") as make:  # a space each
        yield make


def _set_elements(name: str) -> str:
    done = subprocess.run(["nft", "list", "set", TABLE_FAMILY, TABLE_NAME, name], capture_output=True, text=True)
    return done.stdout


@pytest.mark.docker
def test_a_hung_filler_is_replaced_before_a_policy_with_a_denied_name_is_in_force(
    backend: DockerBackend, make_sandbox: Callable[..., SandboxInfo], servers: NamespaceServers
) -> None:
    v4 = (servers.v4.host, servers.v4.port)
    key = f"{servers.v4.host}:{servers.v4.port}"
    first = make_sandbox(NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, deny_out=(EVIL,)))
    assert probe(backend, first.sandbox_id, [v4])[key] != "reached"
    egress = backend.egress()
    assert isinstance(egress, DockerEgress)
    filler = dns.DenyFiller(egress.state.path("dns"))
    pid = filler.resolver.running_pid()
    assert pid is not None
    set4, _ = domain_sets(EVIL)
    os.kill(pid, signal.SIGSTOP)  # hung: alive, answering nothing
    try:
        # The set lost its elements (a table reload; the name's address changed) and a
        # refresh cannot put them back through the hung filler.
        subprocess.run(["nft", "flush", "set", TABLE_FAMILY, TABLE_NAME, set4], check=True)
        egress.refresh_deny_sets()
        # Another sandbox denying the same name: applied, within seconds.
        started = time.monotonic()
        second = make_sandbox(
            NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, deny_out=(EVIL,))
        )
        assert time.monotonic() - started < 30
        assert servers.v4.host in _set_elements(set4), "the denied name's address is not in its set"
        assert probe(backend, second.sandbox_id, [v4])[key] != "reached"
    finally:
        with contextlib.suppress(ProcessLookupError):  # replaced (killed) by the fix
            os.kill(pid, signal.SIGCONT)
