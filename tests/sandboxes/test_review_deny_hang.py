"""Review (revdeny): a deny filler that hangs (alive, answering nothing) is never replaced: its
pid is alive, its configuration unchanged, so `DenyFiller.ensure` keeps it, every lookup times
out, and a policy with a denied name is applied (said to be in force) while the name's
address is not in its set: the deny entry does not hold at the packet filter.

The backend has an egress state folder of its own (so its filler is the test's alone). Every
destination is a server this test starts on this machine: a network namespace of its own
(documentation addresses, checked by `ip route get` in `dual_namespace`); the resolvers'
upstream is a dnsmasq of the test's own on loopback.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from sandboxes.backends.base import NetworkSpec, SandboxInfo
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress import dns
from sandboxes.backends.docker.egress.component import DockerEgress
from sandboxes.backends.docker.egress.firewall import TABLE_FAMILY, TABLE_NAME
from sandboxes.backends.docker.egress.rules import domain_sets
from tests.support.egress_support import (
    DualNamespace,
    NamespaceServers,
    SandboxMaker,
    docker_backend,
    dual_namespace,
    probe,
    sandbox_maker,
    upstream_dns,
)

pytestmark = [pytest.mark.docker]

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
    state_dir = tempfile.mkdtemp(prefix="revdeny-egress-")
    with upstream_dns({EVIL: ns.v4}) as upstream:
        with docker_backend(test_run_id, upstream, {"egress_state_dir": state_dir}) as adapter:
            yield adapter
        dns.DenyFiller(os.path.join(state_dir, "dns")).resolver.stop()


@pytest.fixture
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, "revhang") as make:  # a space each
        yield make


def _set_elements(name: str) -> str:
    done = subprocess.run(["nft", "list", "set", TABLE_FAMILY, TABLE_NAME, name], capture_output=True, text=True)
    return done.stdout


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
