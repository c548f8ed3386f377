"""Review (revdeny): the deny rule's exemption for addresses an allowed domain resolved to
read the allowed pattern's nftables set, which every sandbox of the host whose lists name
that pattern fills, in any space. So another space's sandbox that allows the same wildcard
(and does not deny the name) resolving the denied name put its address into the exemption
set, and the denying sandbox reached the denied name's address hard-coded. Now the exemption
reads the pattern's per-network copy (`network_sets`), which only the sandbox's own network's
resolver fills, and a released network's copies are pruned.

Every destination is a server this test starts on this machine: a network namespace of its
own (documentation addresses, checked by `ip route get` in `dual_namespace`). The resolvers'
upstream is a dnsmasq of the test's own on loopback.
"""

from __future__ import annotations

import secrets
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from sandboxes.backends.base import META_SPACE, NetworkSpec, SandboxInfo, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.firewall import TABLE_FAMILY, TABLE_NAME, bridge_name, table_set_names
from sandboxes.backends.docker.egress.rules import network_sets
from tests.support.egress_support import (
    DualNamespace,
    NamespaceServers,
    SandboxMaker,
    docker_backend,
    dual_namespace,
    probe,
    resolve,
    sandbox_maker,
    upstream_dns,
)

pytestmark = [pytest.mark.docker]

TAG = secrets.token_hex(3)
ZONE = f"zone-{TAG}.test"  # its own names: the sets are shared by every sandbox of the host
EVIL = f"evil.{ZONE}"


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
    answers = {EVIL: ns.v4, f"api.{ZONE}": "203.0.113.77"}
    with upstream_dns(answers) as upstream, docker_backend(test_run_id, upstream) as adapter:
        yield adapter


@pytest.fixture
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, "revdeny") as make:  # a space each
        yield make


def test_another_spaces_lookup_under_a_shared_wildcard_does_not_exempt_a_denied_address(
    backend: DockerBackend, make_sandbox: Callable[..., SandboxInfo], servers: NamespaceServers
) -> None:
    v4 = (servers.v4.host, servers.v4.port)
    key = f"{servers.v4.host}:{servers.v4.port}"
    # Space A: the wildcard allowed, one name under it denied.
    denying = make_sandbox(
        NetworkSpec.parse(
            allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(EVIL,)
        )
    )
    assert resolve(backend, denying.sandbox_id, [EVIL]) == {EVIL: []}  # its resolver: NXDOMAIN
    assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"  # hard-coded: refused
    # Space B (another tenant, or the same user's other space): the same wildcard allowed,
    # nothing denied. Its sandbox looks the name up, as it may.
    other = make_sandbox(
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
    )
    assert resolve(backend, other.sandbox_id, [EVIL]) == {EVIL: [servers.v4.host]}
    # Space A's deny entry must still hold for the address.
    assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"


def test_the_per_network_copy_is_filled_by_its_own_resolver_and_pruned_with_the_network(
    backend: DockerBackend, docker_base_image: str, test_run_id: str, servers: NamespaceServers
) -> None:
    space = f"revdeny-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(
        template_id=docker_base_image,
        network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",)),
        metadata={"test-run": test_run_id, META_SPACE: space},
    )
    info = backend.create(spec)
    set4, set6 = network_sets(f"*.{ZONE}", bridge_name(backend.space_network_name(space)))
    try:
        assert {set4, set6} <= set(table_set_names())
        assert resolve(backend, info.sandbox_id, [EVIL]) == {EVIL: [servers.v4.host]}
        listed = subprocess.run(
            ["nft", "list", "set", TABLE_FAMILY, TABLE_NAME, set4], capture_output=True, text=True, check=True
        )
        assert servers.v4.host in listed.stdout  # its own network's resolver filled its copy
    finally:
        backend.delete(info.sandbox_id)  # the space's last sandbox: its network is released
    assert not {set4, set6} & set(table_set_names())
