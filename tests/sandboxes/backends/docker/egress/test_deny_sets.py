"""A deny entry by domain at the packet filter, from inside real sandboxes: the address of a
denied name is refused however the sandbox learnt it (here: hard-coded), not only at the
resolver. The deny filler (`dns.DenyFiller`) resolves denied names into their sets.

Every destination is a server this test starts on this machine: a network namespace of its
own (TEST-NET-2 and 2001:db8::/32 documentation addresses, checked by `ip route get` to go to
the test's veth). The resolvers' upstream is a dnsmasq of the test's own on loopback.
"""

from __future__ import annotations

import secrets
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from sandboxes.backends.base import META_SPACE, BackendConfig, NetworkSpec, SandboxInfo, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.component import DockerEgress
from sandboxes.backends.docker.egress.firewall import TABLE_FAMILY, TABLE_NAME, bridge_name, table_set_names
from sandboxes.backends.docker.egress.rules import domain_sets, network_sets
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.egress_support import (
    DualNamespace,
    NamespaceServers,
    SandboxMaker,
    docker_backend,
    dual_namespace,
    probe,
    resolve,
    sandbox_maker,
    target,
    upstream_dns,
    wait_refusal,
)

pytestmark = [pytest.mark.docker]

TAG = secrets.token_hex(3)
EVIL = f"evil-{TAG}.test"  # its own names: the sets are shared by every sandbox of the host
EVIL6 = f"evil6-{TAG}.test"
# Reading every refusal back takes seconds where the host's log is large (a shared CI host).
READ_S = 30
SHARED = f"shared-{TAG}.test"  # its subdomains resolve to the denied name's address


@pytest.fixture(scope="module")
def denied_ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def servers(denied_ns: DualNamespace) -> Iterator[NamespaceServers]:
    with NamespaceServers(denied_ns) as servers:
        yield servers


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str, denied_ns: DualNamespace) -> Iterator[DockerBackend]:
    answers = {EVIL: denied_ns.v4, EVIL6: denied_ns.v6, SHARED: denied_ns.v4}
    with upstream_dns(answers) as upstream, docker_backend(test_run_id, upstream) as adapter:
        yield adapter


@pytest.fixture
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, "deny") as make:  # a space each
        yield make


def _egress(backend: DockerBackend) -> DockerEgress:
    egress = backend.egress()
    assert isinstance(egress, DockerEgress)
    return egress


def _key(host: str, port: int) -> str:
    return f"{host}:{port}"  # as the probe names them


def _set_elements(name: str) -> str:
    done = subprocess.run(["nft", "list", "set", TABLE_FAMILY, TABLE_NAME, name], capture_output=True, text=True)
    return done.stdout


def test_a_hard_coded_address_of_a_denied_name_is_refused_by_the_packet_filter(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: NamespaceServers
) -> None:
    v4, v6 = (servers.v4.host, servers.v4.port), (servers.v6.host, servers.v6.port)
    control = make_sandbox(
        NetworkSpec(allow_internet_access=True, allow_public_traffic=False)
    )  # no lists: both addresses reachable
    answers = probe(backend, control.sandbox_id, [v4, v6])
    assert answers == {_key(*v4): "reached", _key(*v6): "reached"}, answers

    started = time.monotonic()
    denying = make_sandbox(
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, deny_out=(EVIL, EVIL6))
    )
    assert resolve(backend, denying.sandbox_id, [EVIL, EVIL6]) == {EVIL: [], EVIL6: []}  # the resolver: NXDOMAIN
    answers = probe(backend, denying.sandbox_id, [v4, v6])  # the addresses, hard-coded
    assert answers[_key(*v4)] != "reached", answers
    assert answers[_key(*v6)] != "reached", answers
    assert wait_refusal(backend, denying.sandbox_id, target(*v4), timeout_s=READ_S).rule == f"deny entry {EVIL}"
    assert wait_refusal(backend, denying.sandbox_id, target(*v6), timeout_s=READ_S).rule == f"deny entry {EVIL6}"
    assert probe(backend, control.sandbox_id, [v4])[_key(*v4)] == "reached"  # only the denying one
    assert time.monotonic() - started < 60


def test_the_deny_sets_are_filled_again_on_refresh_and_a_live_change_fills_them_at_once(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: NamespaceServers
) -> None:
    v4 = (servers.v4.host, servers.v4.port)
    sandbox = make_sandbox(NetworkSpec(allow_internet_access=True, allow_public_traffic=False))
    assert probe(backend, sandbox.sandbox_id, [v4])[_key(*v4)] == "reached"
    egress = _egress(backend)
    started = time.monotonic()
    egress.update(
        sandbox.sandbox_id, NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, deny_out=(EVIL,))
    )
    took = time.monotonic() - started
    assert took < 5, f"a live change with a denied name took {took:.2f} s"
    set4, _ = domain_sets(EVIL)
    assert servers.v4.host in _set_elements(set4)
    assert probe(backend, sandbox.sandbox_id, [v4])[_key(*v4)] != "reached"

    # The set lost its elements (a reload of the table, an address that changed): a refresh
    # resolves every denied name again.
    subprocess.run(["nft", "flush", "set", TABLE_FAMILY, TABLE_NAME, set4], check=True)
    assert servers.v4.host not in _set_elements(set4)
    egress.refresh_deny_sets()
    assert servers.v4.host in _set_elements(set4)
    assert probe(backend, sandbox.sandbox_id, [v4])[_key(*v4)] != "reached"

    # The deny entry removed: the address is reachable again for this sandbox.
    egress.update(sandbox.sandbox_id, NetworkSpec(allow_internet_access=True, allow_public_traffic=False))
    assert probe(backend, sandbox.sandbox_id, [v4])[_key(*v4)] == "reached"


def test_a_denied_name_wins_over_a_cidr_allow_entry_but_not_over_an_allowed_name_on_its_address(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: NamespaceServers
) -> None:
    v4 = (servers.v4.host, servers.v4.port)
    by_cidr = make_sandbox(
        NetworkSpec.parse(
            allow_internet_access=True,
            allow_public_traffic=False,
            allow_out=(f"{servers.v4.host}/32",),
            deny_out=(EVIL,),
        )
    )
    assert probe(backend, by_cidr.sandbox_id, [v4])[_key(*v4)] != "reached"
    assert wait_refusal(backend, by_cidr.sandbox_id, target(*v4), timeout_s=READ_S).rule == f"deny entry {EVIL}"
    # An allowed name that resolved to the same address (wildcard DNS, a CDN): one destination
    # at the packet filter; the resolver refuses the denied name, the allowed one reaches it.
    shared = make_sandbox(
        NetworkSpec.parse(
            allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{SHARED}",), deny_out=(EVIL,)
        )
    )
    assert resolve(backend, shared.sandbox_id, [f"api.{SHARED}", EVIL]) == {
        f"api.{SHARED}": [servers.v4.host],
        EVIL: [],
    }
    assert probe(backend, shared.sandbox_id, [(f"api.{SHARED}", servers.v4.port)])[
        f"api.{SHARED}:{servers.v4.port}"
    ] == ("reached")


# The deny rule's exemption for addresses an allowed domain resolved to reads the allowed
# pattern's per-network copy (network_sets), which only the sandbox's own network's resolver
# fills: another space's sandbox allowing the same wildcard, and resolving the denied name, must
# not exempt its address for the denying sandbox; a released network's copies are pruned.
ZONE = f"zone-{TAG}.test"  # its own names: the sets are shared by every sandbox of the host
ZONE_EVIL = f"evil.{ZONE}"


@pytest.fixture(scope="module")
def exempt_ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def exempt_servers(exempt_ns: DualNamespace) -> Iterator[NamespaceServers]:
    with NamespaceServers(exempt_ns) as exempt_servers:
        yield exempt_servers


@pytest.fixture(scope="module")
def exempt_backend(docker_base_image: str, test_run_id: str, exempt_ns: DualNamespace) -> Iterator[DockerBackend]:
    answers = {ZONE_EVIL: exempt_ns.v4, f"api.{ZONE}": "203.0.113.77"}
    with upstream_dns(answers) as upstream, docker_backend(test_run_id, upstream) as adapter:
        yield adapter


@pytest.fixture
def make_exempt_sandbox(
    exempt_backend: DockerBackend, docker_base_image: str, test_run_id: str
) -> Iterator[SandboxMaker]:
    with sandbox_maker(exempt_backend, docker_base_image, test_run_id, "exempt") as make:  # a space each
        yield make


def test_another_spaces_lookup_under_a_shared_wildcard_does_not_exempt_a_denied_address(
    exempt_backend: DockerBackend, make_exempt_sandbox: Callable[..., SandboxInfo], exempt_servers: NamespaceServers
) -> None:
    v4 = (exempt_servers.v4.host, exempt_servers.v4.port)
    key = f"{exempt_servers.v4.host}:{exempt_servers.v4.port}"
    # Space A: the wildcard allowed, one name under it denied.
    denying = make_exempt_sandbox(
        NetworkSpec.parse(
            allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(ZONE_EVIL,)
        )
    )
    assert resolve(exempt_backend, denying.sandbox_id, [ZONE_EVIL]) == {ZONE_EVIL: []}  # its resolver: NXDOMAIN
    assert probe(exempt_backend, denying.sandbox_id, [v4])[key] != "reached"  # hard-coded: refused
    # Space B (another tenant, or the same user's other space): the same wildcard allowed,
    # nothing denied. Its sandbox looks the name up, as it may.
    other = make_exempt_sandbox(
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
    )
    assert resolve(exempt_backend, other.sandbox_id, [ZONE_EVIL]) == {ZONE_EVIL: [exempt_servers.v4.host]}
    # Space A's deny entry must still hold for the address.
    assert probe(exempt_backend, denying.sandbox_id, [v4])[key] != "reached"


def test_the_per_network_copy_is_filled_by_its_own_resolver_and_pruned_with_the_network(
    exempt_backend: DockerBackend, docker_base_image: str, test_run_id: str, exempt_servers: NamespaceServers
) -> None:
    space = f"exempt-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(
        template_id=docker_base_image,
        network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",)),
        metadata={"test-run": test_run_id, META_SPACE: space},
    )
    info = exempt_backend.create(spec)
    set4, set6 = network_sets(f"*.{ZONE}", bridge_name(exempt_backend.space_network_name(space)))
    try:
        assert {set4, set6} <= set(table_set_names())
        assert resolve(exempt_backend, info.sandbox_id, [ZONE_EVIL]) == {ZONE_EVIL: [exempt_servers.v4.host]}
        listed = subprocess.run(
            ["nft", "list", "set", TABLE_FAMILY, TABLE_NAME, set4], capture_output=True, text=True, check=True
        )
        assert exempt_servers.v4.host in listed.stdout  # its own network's resolver filled its copy
    finally:
        exempt_backend.delete(info.sandbox_id)  # the space's last sandbox: its network is released
    assert not {set4, set6} & set(table_set_names())


# The same hole live: a sandbox of the same space network that does not deny a name (it need not
# allow the wildcard, nor look anything up) must not let the denying sandbox reach the denied
# name's address through the per-network exemption copy.


@pytest.fixture(scope="module")
def netset_ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def netset_servers(netset_ns: DualNamespace) -> Iterator[NamespaceServers]:
    with NamespaceServers(netset_ns) as netset_servers:
        yield netset_servers


@pytest.mark.docker
def test_a_denied_name_stays_refused_when_a_sandbox_of_the_same_space_does_not_deny_it(
    docker_base_image: str, test_run_id: str, netset_ns: DualNamespace, netset_servers: NamespaceServers
) -> None:
    with upstream_dns({ZONE_EVIL: netset_ns.v4, f"api.{ZONE}": "203.0.113.77"}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"netset-{uuid.uuid4().hex[:8]}"}  # one space
        made = []
        try:
            v4 = (netset_servers.v4.host, netset_servers.v4.port)
            key = f"{netset_servers.v4.host}:{netset_servers.v4.port}"
            spec = NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(ZONE_EVIL,)
            )
            denying = backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata))
            made.append(denying.sandbox_id)
            assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"
            # The same space's other sandbox: an allow list that does not name EVIL at all.
            spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("other.test",))
            other = backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata))
            made.append(other.sandbox_id)
            resolve(backend, denying.sandbox_id, [ZONE_EVIL])  # its own lookup, now forwarded
            assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"
            # A third one allowing the wildcard without the deny entry: it looks the name up
            # and reaches it (the shared set), and the denying sandbox stays refused.
            spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
            allowing = backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata))
            made.append(allowing.sandbox_id)
            assert resolve(backend, allowing.sandbox_id, [ZONE_EVIL]) == {ZONE_EVIL: [netset_servers.v4.host]}
            assert probe(backend, allowing.sandbox_id, [v4])[key] == "reached"
            assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"
        finally:
            for sandbox_id in made:
                backend.delete(sandbox_id)
            backend.close()


@pytest.mark.docker
def test_an_allowed_name_is_reached_when_a_sandbox_of_the_same_space_has_no_lists(
    docker_base_image: str, test_run_id: str, netset_ns: DualNamespace, netset_servers: NamespaceServers
) -> None:
    with upstream_dns({ZONE_EVIL: netset_ns.v4}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"netset-{uuid.uuid4().hex[:8]}"}  # one space
        made = []
        try:
            key = f"{netset_servers.v4.host}:{netset_servers.v4.port}"
            for spec in (
                NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",)),
                NetworkSpec(allow_internet_access=True, allow_public_traffic=False),
            ):
                made.append(
                    backend.create(
                        SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)
                    ).sandbox_id
                )
            assert resolve(backend, made[0], [ZONE_EVIL]) == {ZONE_EVIL: [netset_servers.v4.host]}
            assert probe(backend, made[0], [(netset_servers.v4.host, netset_servers.v4.port)])[key] == "reached"
        finally:
            for sandbox_id in made:
                backend.delete(sandbox_id)
            backend.close()


@pytest.mark.docker
def test_a_lookup_made_before_the_denying_sandbox_joined_does_not_exempt_its_denied_name(
    docker_base_image: str, test_run_id: str, netset_ns: DualNamespace, netset_servers: NamespaceServers
) -> None:
    # The copies keep their elements for ever: what a co-member's lookups put there while no
    # member denied the name must not exempt it for a sandbox that joins with the deny entry.
    with upstream_dns({ZONE_EVIL: netset_ns.v4}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"netset-{uuid.uuid4().hex[:8]}"}  # one space
        made = []
        try:
            v4 = (netset_servers.v4.host, netset_servers.v4.port)
            key = f"{netset_servers.v4.host}:{netset_servers.v4.port}"
            spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
            made.append(
                backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)).sandbox_id
            )
            assert resolve(backend, made[0], [ZONE_EVIL]) == {ZONE_EVIL: [netset_servers.v4.host]}
            spec = NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(ZONE_EVIL,)
            )
            made.append(
                backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)).sandbox_id
            )
            assert probe(backend, made[1], [v4])[key] != "reached"
        finally:
            for sandbox_id in made:
                backend.delete(sandbox_id)
            backend.close()


@pytest.mark.docker
def test_a_deny_entry_added_live_holds_for_an_address_the_sandbox_looked_up_while_allowed(
    docker_base_image: str, test_run_id: str, netset_ns: DualNamespace, netset_servers: NamespaceServers
) -> None:
    with upstream_dns({ZONE_EVIL: netset_ns.v4}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"netset-{uuid.uuid4().hex[:8]}"}
        spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
        sandbox_id = backend.create(
            SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)
        ).sandbox_id
        try:
            v4 = (netset_servers.v4.host, netset_servers.v4.port)
            key = f"{netset_servers.v4.host}:{netset_servers.v4.port}"
            assert resolve(backend, sandbox_id, [ZONE_EVIL]) == {ZONE_EVIL: [netset_servers.v4.host]}
            assert probe(backend, sandbox_id, [v4])[key] == "reached"
            backend.outbound.update(
                sandbox_id,
                NetworkSpec.parse(
                    allow_internet_access=True,
                    allow_public_traffic=False,
                    allow_out=spec.allow_out,
                    deny_out=(ZONE_EVIL,),
                ),
            )
            assert probe(backend, sandbox_id, [v4])[key] != "reached"
        finally:
            backend.delete(sandbox_id)
            backend.close()
