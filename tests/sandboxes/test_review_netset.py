"""Review (revnetset) of the per-network exemption copies (`egress_rules.network_sets`).

The same-space hole: one dnsmasq answers all online sandboxes of a space network, and a
name is NXDOMAIN there only when *every* member denies it (`dns.policy_for`). So once any
other sandbox that does not deny the name is online on the network (it need not allow the
wildcard, nor look anything up), the denying sandbox's own lookup of its denied name is
forwarded, and the answer lands in the allowed wildcard's per-network copy, which that
sandbox's deny rule reads as its exemption: the denied name's address is reached.

Every destination is a server this test starts on this machine: a network namespace of its
own (documentation addresses, checked by `ip route get` in `dual_namespace`). The resolvers'
upstream is a dnsmasq of the test's own on loopback.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Iterator

import pytest

from netpolicy import parse_domain
from sandboxes.backends.base import META_SPACE, BackendConfig, NetworkSpec, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.dns import policy_for, render_config
from sandboxes.backends.docker.egress.rules import chain_rules, deny_rules, network_sets
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.egress_support import (
    DualNamespace,
    NamespaceServers,
    dual_namespace,
    probe,
    resolve,
    upstream_dns,
)

TAG = secrets.token_hex(3)
ZONE = f"zone-{TAG}.test"
EVIL = f"evil.{ZONE}"
BRIDGE = "sbx-0123456789a"


def _sets_filled_for(config: str, name: str) -> set[str] | None:
    """The sets dnsmasq adds `name`'s answers to under `config` (its longest-matching
    `nftset=` line), or None when the name is answered locally (`address=/name/`)."""
    best, sets = -1, set[str]()
    for line in config.splitlines():
        local = re.fullmatch(r"address=/([^/]+)/", line)
        if local and (name == local[1] or name.endswith("." + local[1])):
            return None
        found = re.fullmatch(r"nftset=/([^/]+)/(.*)", line)
        if found and (name == found[1] or name.endswith("." + found[1])) and len(found[1]) > best:
            best, sets = len(found[1]), {t.rsplit("#", 1)[1] for t in found[2].split(",")}
    return sets


@pytest.mark.parametrize(
    "other",
    [
        ((True, (f"*.{ZONE}",), ())),  # the helper's case: the same wildcard, nothing denied
        ((True, ("other.test",), ())),  # broader: any allow list that does not deny the name
    ],
)
def test_a_co_members_presence_puts_the_denied_names_answer_into_the_exemption_copy(
    other: tuple[bool, tuple[str, ...], tuple[str, ...]],
) -> None:
    denying = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(EVIL,)
    )
    copy4, copy6 = network_sets(f"*.{ZONE}", BRIDGE)
    # The denying sandbox's deny rule is exempted by that copy ...
    assert f"ip daddr @{copy4} return" in deny_rules(denying, BRIDGE)
    assert "jump s_d" in chain_rules(denying, BRIDGE)
    # ... and alone on its network, its denied name never reaches the copy (NXDOMAIN).
    alone = policy_for([(True, denying.domains("allow_out"), denying.domains("deny_out"))])
    assert _sets_filled_for(render_config("172.30.0.1", "127.0.0.1", alone, "/l", "/p", BRIDGE), EVIL) is None
    # With another sandbox online on the same network, the name is forwarded and its answer
    # must still not fill the copy the denying sandbox's exemption reads.
    has_list, allowed, denied = other
    shared = policy_for(
        [
            (True, denying.domains("allow_out"), denying.domains("deny_out")),
            (has_list, tuple(parse_domain(a) for a in allowed), tuple(parse_domain(d) for d in denied)),
        ]
    )
    filled = _sets_filled_for(render_config("172.30.0.1", "127.0.0.1", shared, "/l", "/p", BRIDGE), EVIL)
    assert filled is not None
    assert not {copy4, copy6} & filled


@pytest.fixture(scope="module")
def ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def servers(ns: DualNamespace) -> Iterator[NamespaceServers]:
    with NamespaceServers(ns) as servers:
        yield servers


@pytest.mark.docker
def test_a_denied_name_stays_refused_when_a_sandbox_of_the_same_space_does_not_deny_it(
    docker_base_image: str, test_run_id: str, ns: DualNamespace, servers: NamespaceServers
) -> None:
    with upstream_dns({EVIL: ns.v4, f"api.{ZONE}": "203.0.113.77"}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"revnetset-{uuid.uuid4().hex[:8]}"}  # one space
        made = []
        try:
            v4 = (servers.v4.host, servers.v4.port)
            key = f"{servers.v4.host}:{servers.v4.port}"
            spec = NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(EVIL,)
            )
            denying = backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata))
            made.append(denying.sandbox_id)
            assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"
            # The same space's other sandbox: an allow list that does not name EVIL at all.
            spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("other.test",))
            other = backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata))
            made.append(other.sandbox_id)
            resolve(backend, denying.sandbox_id, [EVIL])  # its own lookup, now forwarded
            assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"
            # A third one allowing the wildcard without the deny entry: it looks the name up
            # and reaches it (the shared set), and the denying sandbox stays refused.
            spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
            allowing = backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata))
            made.append(allowing.sandbox_id)
            assert resolve(backend, allowing.sandbox_id, [EVIL]) == {EVIL: [servers.v4.host]}
            assert probe(backend, allowing.sandbox_id, [v4])[key] == "reached"
            assert probe(backend, denying.sandbox_id, [v4])[key] != "reached"
        finally:
            for sandbox_id in made:
                backend.delete(sandbox_id)
            backend.close()


def test_a_network_answering_every_name_still_fills_its_allow_lists_sets() -> None:
    # One sandbox of the network without an allow list makes its resolver answer every name;
    # the other's allowed names must still reach their sets, or its packet filter refuses
    # every address of its allowed domains ("not in the allow list").
    listing = NetworkSpec.parse(
        allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(EVIL,)
    )
    policy = policy_for([(True, listing.domains("allow_out"), listing.domains("deny_out")), (False, (), ())])
    config = render_config("172.30.0.1", "127.0.0.1", policy, "/l", "/p", BRIDGE)
    filled = _sets_filled_for(config, f"api.{ZONE}")
    assert filled is not None
    assert set(network_sets(f"*.{ZONE}", BRIDGE)) <= filled
    assert not set(network_sets(f"*.{ZONE}", BRIDGE)) & (_sets_filled_for(config, EVIL) or set())


@pytest.mark.docker
def test_an_allowed_name_is_reached_when_a_sandbox_of_the_same_space_has_no_lists(
    docker_base_image: str, test_run_id: str, ns: DualNamespace, servers: NamespaceServers
) -> None:
    with upstream_dns({EVIL: ns.v4}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"revnetset-{uuid.uuid4().hex[:8]}"}  # one space
        made = []
        try:
            key = f"{servers.v4.host}:{servers.v4.port}"
            for spec in (
                NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",)),
                NetworkSpec(allow_internet_access=True, allow_public_traffic=False),
            ):
                made.append(
                    backend.create(
                        SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)
                    ).sandbox_id
                )
            assert resolve(backend, made[0], [EVIL]) == {EVIL: [servers.v4.host]}
            assert probe(backend, made[0], [(servers.v4.host, servers.v4.port)])[key] == "reached"
        finally:
            for sandbox_id in made:
                backend.delete(sandbox_id)
            backend.close()


@pytest.mark.docker
def test_a_lookup_made_before_the_denying_sandbox_joined_does_not_exempt_its_denied_name(
    docker_base_image: str, test_run_id: str, ns: DualNamespace, servers: NamespaceServers
) -> None:
    # The copies keep their elements for ever: what a co-member's lookups put there while no
    # member denied the name must not exempt it for a sandbox that joins with the deny entry.
    with upstream_dns({EVIL: ns.v4}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"revnetset-{uuid.uuid4().hex[:8]}"}  # one space
        made = []
        try:
            v4 = (servers.v4.host, servers.v4.port)
            key = f"{servers.v4.host}:{servers.v4.port}"
            spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
            made.append(
                backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)).sandbox_id
            )
            assert resolve(backend, made[0], [EVIL]) == {EVIL: [servers.v4.host]}
            spec = NetworkSpec.parse(
                allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",), deny_out=(EVIL,)
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
    docker_base_image: str, test_run_id: str, ns: DualNamespace, servers: NamespaceServers
) -> None:
    with upstream_dns({EVIL: ns.v4}) as upstream:
        options = {"network": docker_test_network_name(test_run_id), "dns_upstream": upstream}
        backend = DockerBackend(BackendConfig(kind="docker", options=options))
        metadata = {"test-run": test_run_id, META_SPACE: f"revnetset-{uuid.uuid4().hex[:8]}"}
        spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
        sandbox_id = backend.create(
            SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)
        ).sandbox_id
        try:
            v4 = (servers.v4.host, servers.v4.port)
            key = f"{servers.v4.host}:{servers.v4.port}"
            assert resolve(backend, sandbox_id, [EVIL]) == {EVIL: [servers.v4.host]}
            assert probe(backend, sandbox_id, [v4])[key] == "reached"
            backend.outbound.update(
                sandbox_id,
                NetworkSpec.parse(
                    allow_internet_access=True, allow_public_traffic=False, allow_out=spec.allow_out, deny_out=(EVIL,)
                ),
            )
            assert probe(backend, sandbox_id, [v4])[key] != "reached"
        finally:
            backend.delete(sandbox_id)
            backend.close()
