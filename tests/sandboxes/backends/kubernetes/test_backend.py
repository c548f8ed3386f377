"""The Kubernetes backend against the fake cluster (tests/fakes/kube/): the conformance suite
(snapshots through the session's OCI registry) plus its own rules: the API's pages as ours
(and an expired one), each network switch as the derived template's NetworkPolicy (checked
by the fake against agent-sandbox's schema), a limited or wrong token in words, ids that name
nothing, the platform's templates listed, suspend and resume keeping /workspace (memory not
kept: `stopped`), a native warm pool's sandbox claimed, a namespace per space.

The adapter reaches the fake only through its BackendConfig (the API server URL, a bearer
token, the fake's CA, private endpoints allowed): the production path, guard and TLS included.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import docker
import pytest

from sandboxes.backends.base import (
    Backend,
    BackendConfig,
    ErrorKind,
    ExecRequest,
    ListQuery,
    NetworkSpec,
    RemoteError,
    Resources,
    SandboxSpec,
    SandboxState,
    SnapshotInfo,
)
from sandboxes.backends.capabilities import SnapshotsCapability
from sandboxes.backends.kubernetes import claims, network, pools
from sandboxes.backends.kubernetes.backend import KubernetesBackend
from tests.fakes.kube.cluster import FakeCluster, running_fake_cluster
from tests.fakes.kube.crds import SANDBOX_CLAIMS, SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS
from tests.fakes.kube.fixtures import template_body, warm_pool_body
from tests.fakes.kube.resources import NAMESPACES
from tests.support.backend_conformance import OFFLINE, BackendConformance, SandboxFactory, run, sandbox_factory
from tests.support.console_process import wait_for
from tests.support.oci_registry import LocalRegistry

pytestmark = pytest.mark.docker

NAMESPACE = "default"


def backend_for(cluster: FakeCluster, token: str | None = None, **options: Any) -> KubernetesBackend:
    config = BackendConfig(
        kind="kubernetes",
        endpoint=cluster.url,
        api_key=token or cluster.admin_token,
        allow_private_endpoints=True,
        options={"tls_ca": cluster.ca_pem, "namespace": NAMESPACE, "ready_timeout": 120, **options},
    )
    return KubernetesBackend(config)


@pytest.fixture(scope="module")
def backend(fake_cluster: FakeCluster, oci_registry: LocalRegistry) -> Iterator[KubernetesBackend]:
    """The adapter, with the test session's registry for skill images (snapshots)."""
    adapter = backend_for(fake_cluster, registry_url=oci_registry.url)
    yield adapter
    adapter.close()


@pytest.fixture(scope="module")
def template_id(fake_cluster: FakeCluster, oci_registry: LocalRegistry, docker_base_image: str) -> Iterator[str]:
    """A SandboxTemplate of the platform admin's, referenced by its name, whose image is in
    the backend's registry (skill images are layers on it)."""
    image = oci_registry.push_local_image(docker_base_image, "sandbox-console/base", "latest")
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    fake_cluster.store.create(SANDBOX_TEMPLATES, NAMESPACE, template_body(name, image=image))
    yield name
    fake_cluster.store.delete(SANDBOX_TEMPLATES, NAMESPACE, name)


class NodePulls(SnapshotsCapability):
    """The adapter's snapshots, and after each create the pull a real node's kubelet makes of
    the skill image (the fake's kubelet never pulls: its pods run images already here)."""

    def __init__(self, inner: SnapshotsCapability, cluster: FakeCluster) -> None:
        self.inner = inner
        self.cluster = cluster

    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        info = self.inner.create(sandbox_id, name=name, labels=labels)
        template = self.cluster.store.get(SANDBOX_TEMPLATES, NAMESPACE, info.snapshot_id)
        image = template["spec"]["podTemplate"]["spec"]["containers"][0]["image"]
        client = docker.from_env(timeout=120)
        try:
            client.images.pull(image)  # from the session's registry, on loopback
        finally:
            client.close()
        return info

    def list(self) -> list[SnapshotInfo]:
        return self.inner.list()

    def delete(self, snapshot_id: str) -> None:
        self.inner.delete(snapshot_id)


class TestKubernetesConformance(BackendConformance):
    """The shared contract, run against the fake cluster."""

    @pytest.fixture
    def snapshots(self, backend: KubernetesBackend, fake_cluster: FakeCluster) -> SnapshotsCapability:
        capability = backend.snapshots()
        assert capability is not None  # the backend has a registry
        return NodePulls(capability, fake_cluster)

    def test_snapshot_keeps_the_source_running_and_seeds_new_sandboxes(
        self, backend: Backend, make_sandbox: SandboxFactory, snapshots: SnapshotsCapability, test_run_id: str
    ) -> None:
        """The suite's, with the seed outside /workspace: there each sandbox has its own volume
        claim, which no image carries (a cluster copies nothing of an image into a volume);
        a skill image holds what an install changed on the root file system."""
        source = make_sandbox()
        run(backend, source.sandbox_id, "echo from-source > /opt/seed.txt", user="root")
        run(backend, source.sandbox_id, "echo own > /workspace/own.txt")
        snapshot = snapshots.create(source.sandbox_id, name="conformance", labels={"test-run": test_run_id})
        try:
            assert snapshot.snapshot_id.startswith("snap-")
            assert backend.get(source.sandbox_id).state == SandboxState.RUNNING
            assert snapshot.snapshot_id in {item.snapshot_id for item in snapshots.list()}
            child = make_sandbox(template_id=snapshot.snapshot_id)
            assert run(backend, child.sandbox_id, "cat /opt/seed.txt") == "from-source\n"
            assert run(backend, child.sandbox_id, "ls -A /workspace").split() == ["input", "output"]
            backend.delete(child.sandbox_id)
        finally:
            snapshots.delete(snapshot.snapshot_id)
        snapshots.delete(snapshot.snapshot_id)  # idempotent
        assert snapshot.snapshot_id not in {item.snapshot_id for item in snapshots.list()}


@pytest.fixture
def make_sandbox(backend: KubernetesBackend, template_id: str, test_run_id: str) -> Iterator[SandboxFactory]:
    with sandbox_factory(backend, template_id, test_run_id) as make:
        yield make


# The API's pages ----------------------------------------------------------------------------


def _stored_claims(cluster: FakeCluster, group: dict[str, str], count: int) -> list[str]:
    """Claims as the adapter writes them, stored directly (no controller needed to list them)."""
    ids = []
    for _ in range(count):
        name = claims.new_claim_name()
        body = claims.claim_body(name, pool="no-pool", template="no-template", metadata=group, template_id="t", env={})
        cluster.store.create(SANDBOX_CLAIMS, NAMESPACE, body)
        ids.append(claims.SandboxRef(NAMESPACE, name).sandbox_id)
    return ids


def test_pages_are_the_apis_continue_tokens(fake_cluster: FakeCluster, backend: KubernetesBackend) -> None:
    group = {"console-space": f"pages-{uuid.uuid4().hex[:8]}", "console-session": "a key / not a label value!"}
    made = _stored_claims(fake_cluster, group, 5)
    _stored_claims(fake_cluster, {**group, "console-session": "another"}, 2)  # same space, not listed
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = backend.list(ListQuery(metadata=group, limit=2, page_token=token))
        pages += 1
        assert len(page.items) <= 2
        seen += [item.sandbox_id for item in page.items]
        assert all(item.metadata == group for item in page.items)  # the exact text, from the annotation
        token = page.next_token
        if not token:
            break
    assert sorted(seen) == sorted(made)
    assert pages == 3
    for sandbox_id in made:
        backend.delete(sandbox_id)


def test_an_expired_page_token_is_gone_and_says_to_list_again(
    fake_cluster: FakeCluster, backend: KubernetesBackend
) -> None:
    group = {"console-space": f"expiry-{uuid.uuid4().hex[:8]}"}
    made = _stored_claims(fake_cluster, group, 3)
    first = backend.list(ListQuery(metadata=group, limit=1))
    assert first.next_token
    made += _stored_claims(fake_cluster, group, 1)  # a write after the snapshot the token holds
    fake_cluster.store.compact()  # the API forgets old versions: the token's snapshot is gone
    with pytest.raises(RemoteError) as caught:
        backend.list(ListQuery(metadata=group, limit=1, page_token=first.next_token))
    assert caught.value.kind == ErrorKind.GONE
    assert "list again" in caught.value.message
    for sandbox_id in made:
        backend.delete(sandbox_id)


# Network switches as NetworkPolicy ------------------------------------------------------


def _spec(**switches: Any) -> NetworkSpec:
    return NetworkSpec.parse(allow_public_traffic=False, **switches)


def _blocks(policy: dict[str, Any]) -> dict[str, list[str]]:
    return {
        peer["ipBlock"]["cidr"]: peer["ipBlock"].get("except", []) for rule in policy["egress"] for peer in rule["to"]
    }


def test_outbound_off_is_no_egress_at_all() -> None:
    assert network.policy_spec(OFFLINE) == {"ingress": [], "egress": []}


def _opened(blocks: dict[str, list[str]], address: str) -> bool:
    ip = ipaddress.ip_address(address)
    for cidr, holes in blocks.items():
        network_ = ipaddress.ip_network(cidr)
        if ip.version == network_.version and ip in network_:
            return not any(ip in ipaddress.ip_network(hole) for hole in holes)
    return False


def test_outbound_on_opens_public_addresses_only() -> None:
    blocks = _blocks(network.policy_spec(_spec(allow_internet_access=True)))
    for public in ("8.8.8.8", "203.0.113.9", "2606:4700::1111"):
        assert _opened(blocks, public), public
    for closed in ("10.96.0.10", "169.254.169.254", "127.0.0.1", "192.168.1.1", "172.16.0.1", "fd00::1", "fe80::1"):
        assert not _opened(blocks, closed), closed


def test_an_allow_list_opens_only_its_cidrs_and_a_deny_entry_inside_is_its_except() -> None:
    spec = _spec(
        allow_internet_access=True, allow_out=["203.0.113.0/24", "198.51.100.0/24"], deny_out=["203.0.113.128/25"]
    )
    assert _blocks(network.policy_spec(spec)) == {"203.0.113.0/24": ["203.0.113.128/25"], "198.51.100.0/24": []}


def test_a_deny_entry_holding_an_allowed_cidr_drops_it() -> None:
    spec = _spec(allow_internet_access=True, allow_out=["203.0.113.0/24"], deny_out=["203.0.0.0/16"])
    assert network.policy_spec(spec)["egress"] == []


def test_a_private_exception_is_opened_beside_the_public_internet() -> None:
    spec = _spec(allow_internet_access=True, allow_private=["10.20.0.0/16"])
    assert "10.20.0.0/16" in _blocks(network.policy_spec(spec))


def test_domains_and_http_rules_are_refused_naming_the_cni_they_need(backend: KubernetesBackend) -> None:
    spec = _spec(allow_internet_access=True, allow_out=["example.test"])
    assert "FQDN" in " ".join(network.problems(spec))
    with pytest.raises(RemoteError) as caught:
        backend.create(SandboxSpec(template_id="sandbox-console/base:latest", network=spec))
    assert caught.value.kind == ErrorKind.UNSUPPORTED
    assert "example.test" in caught.value.message
    capabilities = backend.network_capabilities()
    assert (capabilities.allow_out_cidr, capabilities.allow_out_domain, capabilities.l7_rules) == (True, False, False)


@pytest.mark.parametrize(
    "switches",
    [
        {"allow_internet_access": False},
        {"allow_internet_access": True},
        {"allow_internet_access": True, "allow_out": ["203.0.113.0/24"], "deny_out": ["203.0.113.7/32"]},
        {"allow_internet_access": True, "deny_out": ["198.51.100.0/24"], "allow_private": ["10.20.0.0/16"]},
    ],
)
def test_each_spec_gets_a_template_whose_network_policy_is_the_spec(
    fake_cluster: FakeCluster, backend: KubernetesBackend, template_id: str, switches: dict[str, Any]
) -> None:
    """The derived template passes the upstream schema (the fake validates it) and carries the
    spec's policy, managed; the template's resources and the pool beside it are the spec's."""
    spec = SandboxSpec(template_id=template_id, network=_spec(**switches), resources=Resources(cpus=0.5, memory_mb=256))
    name = backend.derived.template_for(spec, NAMESPACE)
    stored = fake_cluster.store.get(SANDBOX_TEMPLATES, NAMESPACE, name)["spec"]
    assert stored["networkPolicyManagement"] == "Managed"
    assert stored["networkPolicy"]["egress"] == network.policy_spec(spec.network)["egress"]
    assert stored["networkPolicy"].get("ingress", []) == []
    container = stored["podTemplate"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
    assert stored["podTemplate"]["spec"]["automountServiceAccountToken"] is False
    pool = fake_cluster.store.get(SANDBOX_WARM_POOLS, NAMESPACE, name)
    assert (pool["spec"]["replicas"], pool["spec"]["sandboxTemplateRef"]["name"]) == (0, name)
    assert backend.derived.template_for(spec, NAMESPACE) == name  # one spec, one template


# Permissions -------------------------------------------------------------------------------


def test_a_token_without_the_right_gets_a_forbidden_error_in_words(fake_cluster: FakeCluster, template_id: str) -> None:
    read_only = fake_cluster.token_with(
        [{"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]
    )
    limited = backend_for(fake_cluster, token=read_only)
    try:
        with pytest.raises(RemoteError) as caught:
            limited.create(SandboxSpec(template_id=template_id, network=OFFLINE))
        assert caught.value.kind == ErrorKind.FORBIDDEN
        assert not caught.value.retryable
        assert "lacks a permission" in caught.value.message
        assert "sandboxtemplates" in caught.value.message  # what was refused, as the API named it
        assert limited.list(ListQuery(metadata={"console-space": "none"})).items == ()  # reading is allowed
    finally:
        limited.close()


def test_a_wrong_token_is_unauthorized_and_health_says_so(fake_cluster: FakeCluster) -> None:
    stranger = backend_for(fake_cluster, token="not-a-token")
    try:
        health = stranger.health()
        assert not health.ok
        assert "credentials" in health.detail
    finally:
        stranger.close()


def test_a_missing_or_foreign_id_is_not_found(backend: KubernetesBackend) -> None:
    for sandbox_id in ("no-dot-here", f"{NAMESPACE}.sc-0000000000", "other-namespace.sc-1"):
        with pytest.raises(RemoteError) as caught:
            backend.get(sandbox_id)
        assert caught.value.kind == ErrorKind.NOT_FOUND
        backend.delete(sandbox_id)  # idempotent, whatever the id


def test_an_id_whose_claim_part_is_no_claim_name_is_not_found(
    fake_cluster: FakeCluster, backend: KubernetesBackend
) -> None:
    """The claim part goes into the API's path: one that is not an object name (a `/`, `..`)
    reaches nothing, not a subresource or another path."""
    (sandbox_id,) = _stored_claims(fake_cluster, {"console-group": uuid.uuid4().hex}, 1)
    for forged in (f"{sandbox_id}/status", f"{sandbox_id}/../{sandbox_id.partition('.')[2]}", f"{NAMESPACE}.A b"):
        with pytest.raises(RemoteError) as caught:
            backend.get(forged)
        assert caught.value.kind == ErrorKind.NOT_FOUND
        backend.delete(forged)
    assert backend.get(sandbox_id).sandbox_id == sandbox_id
    backend.delete(sandbox_id)


def test_an_id_or_a_claim_in_a_namespace_not_the_backends_is_not_reached(fake_cluster: FakeCluster) -> None:
    """A claim with the console's labels in a namespace the backend does not use (another
    team's) is neither read, deleted nor listed, whatever an id names."""
    foreign = f"team-{uuid.uuid4().hex[:8]}"
    space = str(uuid.uuid4())
    fake_cluster.store.create(NAMESPACES, None, {"metadata": {"name": foreign}})
    name = claims.new_claim_name()
    body = claims.claim_body(
        name, pool="no-pool", template="no-template", metadata={"console-space": space}, template_id="t", env={}
    )
    fake_cluster.store.create(SANDBOX_CLAIMS, foreign, body)
    # Per space, a namespace named like a space's but not this space's holds none of its sandboxes.
    other = f"{NAMESPACE}-team-{uuid.uuid4().hex[:8]}"
    fake_cluster.store.create(NAMESPACES, None, {"metadata": {"name": other}})
    fake_cluster.store.create(SANDBOX_CLAIMS, other, body)
    adapter = backend_for(fake_cluster, namespace_mode="per_space")
    try:
        with pytest.raises(RemoteError) as misplaced:
            adapter.get(f"{other}.{name}")
        assert misplaced.value.kind == ErrorKind.NOT_FOUND
        assert adapter.list(ListQuery(metadata={"console-space": space})).items == ()
    finally:
        adapter.close()
        fake_cluster.store.delete(NAMESPACES, None, other)
    for mode in ("shared", "per_space"):
        adapter = backend_for(fake_cluster, namespace_mode=mode)
        try:
            with pytest.raises(RemoteError) as caught:
                adapter.get(f"{foreign}.{name}")
            assert caught.value.kind == ErrorKind.NOT_FOUND
            with pytest.raises(RemoteError) as refused:
                adapter.exec(f"{foreign}.{name}", ExecRequest(argv=("true",)))
            assert refused.value.kind == ErrorKind.NOT_FOUND
            adapter.delete(f"{foreign}.{name}")
            assert fake_cluster.store.find(SANDBOX_CLAIMS, foreign, name) is not None
            assert adapter.list(ListQuery(metadata={"console-space": space})).items == ()
        finally:
            adapter.close()
    fake_cluster.store.delete(NAMESPACES, None, foreign)


def test_a_look_alike_pool_in_another_teams_namespace_is_neither_reported_nor_drained(
    fake_cluster: FakeCluster,
) -> None:
    foreign = f"team-{uuid.uuid4().hex[:8]}"
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    store = fake_cluster.store
    store.create(NAMESPACES, None, {"metadata": {"name": foreign}})
    body = warm_pool_body(pools.pool_name(pool), "no-template")
    body["metadata"]["labels"] = {claims.MANAGED: "1", pools.POOL: hashlib.sha256(pool.encode()).hexdigest()[:40]}
    body["metadata"]["annotations"] = {pools.POOL_NAME: pool}
    store.create(SANDBOX_WARM_POOLS, foreign, body)
    adapter = backend_for(fake_cluster, namespace_mode="per_space")
    try:
        assert pool not in adapter.warm_pools().pools()
        adapter.warm_pools().drain(pool)
        assert store.find(SANDBOX_WARM_POOLS, foreign, pools.pool_name(pool)) is not None
    finally:
        adapter.close()
        store.delete(NAMESPACES, None, foreign)


# Suspend and resume -------------------------------------------------------------------------


def test_suspend_then_resume_keeps_workspace_and_says_memory_was_not(
    backend: KubernetesBackend, make_sandbox: SandboxFactory
) -> None:
    info = make_sandbox()
    run(backend, info.sandbox_id, "echo kept > /workspace/kept.txt")
    paused = backend.pause(info.sandbox_id)
    assert paused.state == SandboxState.STOPPED  # never PAUSED: the pod is gone, memory with it
    assert backend.get(info.sandbox_id).state == SandboxState.STOPPED
    # A listing reads the claims alone, whose Ready condition the controller forwards from the
    # Sandbox on its next reconcile: it says stopped a moment after `get` does.
    query = ListQuery(metadata=dict(info.metadata), states=frozenset({SandboxState.STOPPED}))
    listed = wait_for(
        lambda: [item.sandbox_id for item in backend.list(query).items] or None, timeout=10, what="listed stopped"
    )
    assert listed == [info.sandbox_id]
    with pytest.raises(RemoteError) as idle:
        backend.exec(info.sandbox_id, ExecRequest(argv=("true",)))
    assert idle.value.kind == ErrorKind.CONFLICT
    resumed = backend.connect(info.sandbox_id)
    assert resumed.state == SandboxState.RUNNING
    assert run(backend, info.sandbox_id, "cat /workspace/kept.txt") == "kept\n"


def test_templates_are_the_platforms_not_the_derived_ones(backend: KubernetesBackend, template_id: str) -> None:
    derived = backend.derived.template_for(SandboxSpec(template_id=template_id, network=OFFLINE), NAMESPACE)
    listed = {info.template_id: info for info in backend.templates().list()}
    assert template_id in listed
    assert "sandbox-console/base:latest" in listed[template_id].description
    assert derived not in listed
    assert backend.templates().get(template_id).name == template_id


# Warm pools and namespaces per space --------------------------------------------------------


def test_a_warm_pools_ready_sandbox_is_claimed_with_the_sessions_metadata(
    backend: KubernetesBackend, template_id: str
) -> None:
    pools = backend.warm_pools()
    pool = f"config-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(template_id=template_id, network=OFFLINE, metadata={"console-config": pool})
    try:
        pools.ensure(pool, spec, 1)
        deadline = time.monotonic() + 60
        while pools.pools().get(pool, (0, 0))[0] < 1:
            assert time.monotonic() < deadline, pools.pools()
            time.sleep(0.5)
        assert pools.claim(pool, replace(spec, env={"A": "b"})) is None  # a warm pod takes no env
        session = {**spec.metadata, "console-session": f"warm-{uuid.uuid4().hex[:8]}"}
        info = pools.claim(pool, replace(spec, metadata=session))
        assert info is not None
        try:
            assert info.state == SandboxState.RUNNING
            assert backend.get(info.sandbox_id).metadata == session
            listed = backend.list(ListQuery(metadata={"console-session": session["console-session"]}))
            assert [item.sandbox_id for item in listed.items] == [info.sandbox_id]
            assert run(backend, info.sandbox_id, "stat -c %u /workspace/output").strip() == "1000"
        finally:
            backend.delete(info.sandbox_id)
    finally:
        pools.drain(pool)
    assert pool not in pools.pools()
    pools.drain(pool)  # idempotent


def test_per_space_namespaces_hold_each_spaces_sandboxes(fake_cluster: FakeCluster, template_id: str) -> None:
    adapter = backend_for(fake_cluster, namespace_mode="per_space")
    space = str(uuid.uuid4())
    try:
        info = adapter.create(SandboxSpec(template_id=template_id, network=OFFLINE, metadata={"console-space": space}))
        try:
            assert info.sandbox_id.startswith(f"{NAMESPACE}-{space}.")
            assert fake_cluster.store.get(NAMESPACES, None, f"{NAMESPACE}-{space}")
            listed = adapter.list(ListQuery(metadata={"console-space": space}))
            assert [item.sandbox_id for item in listed.items] == [info.sandbox_id]
            assert run(adapter, info.sandbox_id, "echo here") == "here\n"
            with pytest.raises(RemoteError) as held:
                adapter.release_space(space)
            assert held.value.kind == ErrorKind.CONFLICT
        finally:
            adapter.delete(info.sandbox_id)
        assert adapter.release_space(space) == [f"namespace {NAMESPACE}-{space}"]
        assert fake_cluster.store.find(NAMESPACES, None, f"{NAMESPACE}-{space}") is None
        assert adapter.release_space(space) == []  # idempotent
    finally:
        adapter.close()


def test_a_derived_template_deleted_behind_the_adapters_back_is_made_again(
    fake_cluster: FakeCluster, backend: KubernetesBackend, make_sandbox: SandboxFactory, template_id: str
) -> None:
    spec = SandboxSpec(template_id=template_id, network=OFFLINE, resources=Resources(memory_mb=320))
    name = backend.derived.template_for(spec, NAMESPACE)
    fake_cluster.store.delete(SANDBOX_WARM_POOLS, NAMESPACE, name)
    fake_cluster.store.delete(SANDBOX_TEMPLATES, NAMESPACE, name)
    info = make_sandbox(resources=Resources(memory_mb=320))
    assert info.state == SandboxState.RUNNING
    assert fake_cluster.store.get(SANDBOX_TEMPLATES, NAMESPACE, name)


def test_health_on_a_cluster_without_agent_sandbox_says_to_install_its_crds() -> None:
    with running_fake_cluster(with_crds=False, docker_pods=False) as bare:
        adapter = backend_for(bare)
        try:
            health = adapter.health()
        finally:
            adapter.close()
    assert not health.ok
    assert "install its CRDs" in health.detail
    assert "sandboxclaims" in health.detail


def test_a_space_namespace_stays_where_the_account_may_not_delete_namespaces(fake_cluster: FakeCluster) -> None:
    token = fake_cluster.token_with(
        [
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "create"]},
            {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["*"], "verbs": ["*"]},
        ]
    )
    adapter = backend_for(fake_cluster, token=token, namespace_mode="per_space")
    space = str(uuid.uuid4())
    try:
        adapter.namespace_for({"console-space": space})  # made on first use
        assert adapter.release_space(space) == []
        assert fake_cluster.store.get(NAMESPACES, None, f"{NAMESPACE}-{space}")
    finally:
        adapter.close()
        fake_cluster.store.delete(NAMESPACES, None, f"{NAMESPACE}-{space}")
