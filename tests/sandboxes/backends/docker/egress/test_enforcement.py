"""A space's network policy enforced by the Docker backend, from inside real sandboxes.

Every destination is a server this test starts on this machine: in network namespaces of its
own (TEST-NET-2 and 2001:db8::/32 documentation addresses, a private 10.x address, a
link-local 169.254.171.x one; each checked by `ip route get` to go to the test's veth), on a
dummy interface, on the host's own addresses, or in another space's sandbox. The resolver's
upstream is a dnsmasq of the test's own on loopback. Nothing is sent off the machine.
"""

from __future__ import annotations

import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import docker
import pytest

from sandboxes.backends.base import ExecRequest, IdleMode, NetworkSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.firewall import TABLE_NAME
from sandboxes.backends.docker.egress.proxy import squid_available
from sandboxes.backends.docker.egress.rules import chain_name
from tests.support.backend_conformance import run
from tests.support.egress_support import (
    LISTENER_PORT,
    DualNamespace,
    NamespaceServers,
    SandboxMaker,
    docker0_address,
    docker_backend,
    dual_namespace,
    network_settings,
    probe,
    resolve,
    sandbox_maker,
    start_listener,
    target,
    upstream_dns,
    wait_refusal,
)
from tests.support.netns import BannerServer, dummy_link_local, namespace

pytestmark = [pytest.mark.docker]

OPEN = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False)
OFF = NetworkSpec.parse(allow_internet_access=False, allow_public_traffic=False)


def only(*allow: str, deny: tuple[str, ...] = ()) -> NetworkSpec:
    return NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=allow, deny_out=deny)


@pytest.fixture(scope="module")
def allowed_ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def other_ns() -> Iterator[DualNamespace]:
    with dual_namespace() as space:
        yield space


@pytest.fixture(scope="module")
def servers(allowed_ns: DualNamespace, other_ns: DualNamespace) -> Iterator[tuple[NamespaceServers, NamespaceServers]]:
    with NamespaceServers(allowed_ns) as allowed, NamespaceServers(other_ns) as other:
        yield allowed, other


@pytest.fixture(scope="module")
def upstream(allowed_ns: DualNamespace, other_ns: DualNamespace) -> Iterator[str]:
    # name.test and its subdomains answer with the allowed namespace, other.test with the other.
    with upstream_dns({"name.test": allowed_ns.v4, "other.test": other_ns.v4}) as address:
        yield address


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str, upstream: str) -> Iterator[DockerBackend]:
    with docker_backend(test_run_id, upstream) as adapter:
        yield adapter


@pytest.fixture(scope="module")
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, prefix="egress") as make:
        yield make


def test_the_capabilities_are_truthful(backend: DockerBackend) -> None:
    caps = backend.network_capabilities()
    assert caps.allow_out_cidr
    assert caps.allow_out_domain
    assert caps.deny_out_cidr
    assert caps.deny_out_domain
    assert caps.live_update
    assert caps.l7_rules == squid_available()  # HTTP rules through squid (test_docker_http_rules.py)
    assert caps.inbound_toggle  # the console's inbound proxy (docs/inbound.md)
    assert backend.egress() is not None


def test_an_allow_list_admits_only_its_cidrs_and_a_deny_entry_wins(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    # The allowed namespace's /24 is allowed, but the other namespace's address, inside that
    # same /24, is denied by name: deny wins.
    sandbox = make_sandbox(only("198.51.100.0/24", allowed.v6.host + "/128", deny=(other.v4.host + "/32",)))
    answers = probe(
        backend,
        sandbox.sandbox_id,
        [(allowed.v4.host, allowed.v4.port), (other.v4.host, other.v4.port), (allowed.v6.host, allowed.v6.port)],
    )
    assert answers[f"{allowed.v4.host}:{allowed.v4.port}"] == "reached"
    assert answers[f"{allowed.v6.host}:{allowed.v6.port}"] == "reached"  # IPv6 too
    assert answers[f"{other.v4.host}:{other.v4.port}"] != "reached"
    refusal = wait_refusal(backend, sandbox.sandbox_id, target(other.v4.host, other.v4.port))
    assert refusal.rule == f"deny entry {other.v4.host}/32"
    assert refusal.detail == "tcp"
    # Not in the list at all: the other namespace's IPv6 address.
    assert probe(backend, sandbox.sandbox_id, [(other.v6.host, other.v6.port)]) != {
        target(other.v6.host, other.v6.port): "reached"
    }
    assert wait_refusal(backend, sandbox.sandbox_id, target(other.v6.host, other.v6.port)).rule == (
        "not in the allow list"
    )


def test_a_program_ignoring_proxy_variables_is_filtered(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    sandbox = make_sandbox(only(allowed.v4.host + "/32"))
    line = "exec 3<>/dev/tcp/{}/{} && head -c 7 <&3"
    env = {"http_proxy": "", "https_proxy": "", "HTTP_PROXY": "", "no_proxy": "*"}
    reached = backend.exec(
        sandbox.sandbox_id,
        ExecRequest(argv=("bash", "-c", line.format(allowed.v4.host, allowed.v4.port)), env=env, user="user"),
    )
    assert reached.exit_code == 0, reached
    assert reached.stdout == b"reached", reached
    refused = backend.exec(
        sandbox.sandbox_id,
        ExecRequest(argv=("bash", "-c", line.format(other.v4.host, other.v4.port)), env=env, user="user", timeout_s=20),
    )
    assert refused.exit_code != 0
    assert b"reached" not in refused.stdout
    assert wait_refusal(backend, sandbox.sandbox_id, target(other.v4.host, other.v4.port)).rule == (
        "not in the allow list"
    )


def test_a_wildcard_domain_opens_exactly_the_addresses_it_resolved_to(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    sandbox = make_sandbox(only("*.name.test", deny=("bad.name.test",)))
    names = resolve(backend, sandbox.sandbox_id, ["api.name.test", "name.test", "x.other.test", "bad.name.test"])
    assert names["api.name.test"] == [allowed.v4.host]
    assert names["bad.name.test"] == []  # a deny entry inside the wildcard wins
    assert names["name.test"] == []  # *.name.test: subdomains only
    assert names["x.other.test"] == []  # not in the allow list: the resolver does not answer
    answers = probe(
        backend,
        sandbox.sandbox_id,
        [("api.name.test", allowed.v4.port), (other.v4.host, other.v4.port)],
    )
    assert answers[f"api.name.test:{allowed.v4.port}"] == "reached"
    assert answers[f"{other.v4.host}:{other.v4.port}"] != "reached"  # its address was never resolved
    refusal = wait_refusal(backend, sandbox.sandbox_id, "x.other.test", layer="dns")
    assert refusal.rule == "not in the allow list"
    assert wait_refusal(backend, sandbox.sandbox_id, "bad.name.test", layer="dns").rule == "deny entry bad.name.test"


def test_dns_answers_allowed_names_only_and_nothing_when_off(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, _other = servers
    open_sandbox = make_sandbox(
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, deny_out=("other.test",))
    )
    names = resolve(backend, open_sandbox.sandbox_id, ["www.name.test", "other.test", "unknown.test"])
    assert names["www.name.test"] == [allowed.v4.host]  # outbound on, no allow list: forwarded
    assert names["other.test"] == []  # a deny entry
    assert names["unknown.test"] == []  # the upstream's own NXDOMAIN
    assert wait_refusal(backend, open_sandbox.sandbox_id, "other.test", layer="dns").rule == "deny entry other.test"
    offline = make_sandbox(OFF)
    assert run(backend, offline.sandbox_id, "ls /sys/class/net").split() == ["lo"]
    assert resolve(backend, offline.sandbox_id, ["www.name.test"]) == {"www.name.test": []}


def test_a_live_change_reaches_a_running_sandbox_within_5_seconds(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    sandbox = make_sandbox(only(allowed.v4.host + "/32"))
    sandbox_id = sandbox.sandbox_id
    run(backend, sandbox_id, "echo kept > /workspace/kept; nohup sleep 600 > /dev/null 2>&1 & echo $! > /tmp/pid")
    pid = run(backend, sandbox_id, "cat /tmp/pid").strip()
    destination = target(other.v4.host, other.v4.port)
    assert probe(backend, sandbox_id, [(other.v4.host, other.v4.port)])[destination] != "reached"
    egress = backend.egress()
    assert egress is not None
    started = time.monotonic()
    egress.update(sandbox_id, only(allowed.v4.host + "/32", other.v4.host + "/32"))
    while probe(backend, sandbox_id, [(other.v4.host, other.v4.port)])[destination] != "reached":
        assert time.monotonic() - started < 5, "the change did not reach the sandbox within 5 s"
    elapsed = time.monotonic() - started
    assert elapsed < 5
    # The session survived: same process, same workspace, same container.
    assert run(backend, sandbox_id, f"kill -0 {pid} && cat /workspace/kept") == "kept\n"
    assert backend.get(sandbox_id).sandbox_id == sandbox_id
    # Off, live: no interface but loopback, nothing reached; on again: reached.
    egress.update(sandbox_id, OFF)
    assert run(backend, sandbox_id, "ls /sys/class/net").split() == ["lo"]
    listed = subprocess.run(["nft", "list", "table", "inet", TABLE_NAME], capture_output=True, text=True, check=True)
    assert f"jump {chain_name(sandbox_id)}" not in listed.stdout  # its address is bound to nothing
    egress.update(sandbox_id, only(other.v4.host + "/32"))
    assert probe(backend, sandbox_id, [(other.v4.host, other.v4.port)])[destination] == "reached"
    assert run(backend, sandbox_id, f"kill -0 {pid} && cat /workspace/kept") == "kept\n"


def test_an_offline_sandbox_switched_on_gets_network_and_dns(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, _other = servers
    sandbox = make_sandbox(OFF)
    assert run(backend, sandbox.sandbox_id, "ls /sys/class/net").split() == ["lo"]
    egress = backend.egress()
    assert egress is not None
    egress.update(sandbox.sandbox_id, only("api.name.test"))
    answers = probe(backend, sandbox.sandbox_id, [("api.name.test", allowed.v4.port)])
    assert answers == {f"api.name.test:{allowed.v4.port}": "reached"}


def test_other_sandboxes_and_the_hosts_own_addresses_are_refused(
    backend: DockerBackend, make_sandbox: SandboxMaker, engine: docker.APIClient
) -> None:
    space = f"egress-{uuid.uuid4().hex[:8]}"
    client = make_sandbox(OPEN, space)
    neighbour = make_sandbox(OPEN)  # another space
    start_listener(backend, neighbour.sandbox_id)
    settings = network_settings(engine, neighbour.sandbox_id)
    mine = network_settings(engine, client.sandbox_id)
    with BannerServer(mine["Gateway"]) as on_gateway, BannerServer(docker0_address()) as on_docker0:
        answers = probe(
            backend,
            client.sandbox_id,
            [
                (settings["IPAddress"], LISTENER_PORT),
                (on_gateway.host, on_gateway.port),
                (on_docker0.host, on_docker0.port),
            ],
        )
        assert all(answer != "reached" and answer != "connected" for answer in answers.values()), answers
        assert not on_gateway.clients
        assert not on_docker0.clients
    # The words netpolicy.decide gives (Decision.words), the same at every layer.
    assert wait_refusal(backend, client.sandbox_id, f"{settings['IPAddress']}:{LISTENER_PORT}").rule == (
        "always denied: other sandbox"
    )
    host = wait_refusal(backend, client.sandbox_id, target(on_gateway.host, on_gateway.port))
    assert host.rule == "always denied: the Docker host"


def test_metadata_and_private_ranges_are_refused_unless_a_cidr_opens_a_private_one(
    backend: DockerBackend, make_sandbox: SandboxMaker
) -> None:
    forwarded = f"169.254.171.{random.randint(2, 250)}"
    private = f"10.203.{random.randint(0, 255)}.{random.randint(2, 250)}"
    with ExitStack() as stack:
        local = stack.enter_context(dummy_link_local())
        on_host = stack.enter_context(BannerServer(local))
        behind = stack.enter_context(namespace(address=forwarded))
        routed = stack.enter_context(behind.run(lambda: BannerServer(behind.address)))
        inside = stack.enter_context(namespace(address=private))
        private_server = stack.enter_context(inside.run(lambda: BannerServer(inside.address)))
        # Outbound on without lists, and even an allow list naming the metadata range.
        sandbox = make_sandbox(OPEN)
        listed = make_sandbox(only("169.254.0.0/16", "name.test"))
        for each in (sandbox, listed):
            answers = probe(
                backend,
                each.sandbox_id,
                [(local, on_host.port), (forwarded, routed.port), (private, private_server.port)],
            )
            assert all(answer != "reached" for answer in answers.values()), answers
        assert not on_host.clients
        assert not routed.clients
        assert not private_server.clients
        assert wait_refusal(backend, sandbox.sandbox_id, f"{forwarded}:{routed.port}").rule == (
            "always denied: link-local/metadata"
        )
        assert wait_refusal(backend, sandbox.sandbox_id, f"{private}:{private_server.port}").rule == (
            "always denied: private range"
        )
        # A CIDR entry inside the private range opens it; a domain entry never does.
        egress = backend.egress()
        assert egress is not None
        egress.update(sandbox.sandbox_id, only(f"{private}/32"))
        answers = probe(backend, sandbox.sandbox_id, [(private, private_server.port), (forwarded, routed.port)])
        assert answers[f"{private}:{private_server.port}"] == "reached"
        assert answers[f"{forwarded}:{routed.port}"] != "reached"


def test_each_sandbox_of_a_space_has_its_own_list(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    """A session's grants are merged into its own NetworkSpec: they open nothing for the
    space's other sandboxes, and end with it."""
    allowed, other = servers
    space = f"egress-{uuid.uuid4().hex[:8]}"
    plain = make_sandbox(only(allowed.v4.host + "/32"), space)
    granted = make_sandbox(only(allowed.v4.host + "/32", "api.other.test"), space)
    destination = f"api.other.test:{other.v4.port}"
    assert probe(backend, granted.sandbox_id, [("api.other.test", other.v4.port)]) == {destination: "reached"}
    # Same network, same resolver: the name resolves for the other sandbox too (the union),
    # but its packet filter has no such entry.
    assert (
        probe(backend, plain.sandbox_id, [(other.v4.host, other.v4.port)])[target(other.v4.host, other.v4.port)]
        != "reached"
    )
    egress = backend.egress()
    assert egress is not None
    egress.update(granted.sandbox_id, only(allowed.v4.host + "/32"))  # the grant ended
    assert (
        probe(backend, granted.sandbox_id, [(other.v4.host, other.v4.port)])[target(other.v4.host, other.v4.port)]
        != "reached"
    )
    assert resolve(backend, granted.sandbox_id, ["api.other.test"]) == {"api.other.test": []}


def test_refusals_resume_after_their_cursor(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    sandbox = make_sandbox(only(allowed.v4.host + "/32"))
    egress = backend.egress()
    assert egress is not None
    _, cursor = egress.refusals("")
    probe(backend, sandbox.sandbox_id, [(other.v4.host, other.v4.port)])
    deadline = time.monotonic() + 5
    fresh: list[object] = []
    while time.monotonic() < deadline and not fresh:
        found, next_cursor = egress.refusals(cursor)
        fresh = [r for r in found if r.sandbox_id == sandbox.sandbox_id]
        time.sleep(0.1)
    assert len(fresh) == 1, fresh
    again, _ = egress.refusals(next_cursor)
    assert [r for r in again if r.sandbox_id == sandbox.sandbox_id] == []
    assert egress.refusals("")[0]  # from the start: the old ones are still kept


def test_a_flushed_table_is_restored_with_every_sandboxs_policy(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    sandbox = make_sandbox(only(allowed.v4.host + "/32"))
    subprocess.run(["nft", "delete", "table", "inet", TABLE_NAME], check=True)
    fresh = DockerBackend(backend.config)
    try:
        fresh.outbound.ensure_firewall()  # what the next online sandbox or policy change does
    finally:
        fresh.close()
    answers = probe(backend, sandbox.sandbox_id, [(allowed.v4.host, allowed.v4.port), (other.v4.host, other.v4.port)])
    assert answers == {
        target(allowed.v4.host, allowed.v4.port): "reached",
        target(other.v4.host, other.v4.port): "error 113",  # refused by its restored chain
    }


def test_a_stopped_sandbox_keeps_its_policy_when_it_starts_again(
    docker_base_image: str, test_run_id: str, upstream: str, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, other = servers
    with (
        docker_backend(test_run_id, upstream, idle_mode=IdleMode.STOP) as stopping,
        sandbox_maker(stopping, docker_base_image, test_run_id, prefix="egress") as make_stopping,
    ):
        info = make_stopping(only(allowed.v4.host + "/32"))
        stopping.pause(info.sandbox_id)
        stopping.connect(info.sandbox_id)
        answers = probe(stopping, info.sandbox_id, [(allowed.v4.host, allowed.v4.port), (other.v4.host, other.v4.port)])
        assert answers[target(allowed.v4.host, allowed.v4.port)] == "reached"
        assert answers[target(other.v4.host, other.v4.port)] != "reached"


def test_a_paused_offline_sandbox_switched_on_resolves_once_it_resumes(
    backend: DockerBackend, make_sandbox: SandboxMaker, servers: tuple[NamespaceServers, NamespaceServers]
) -> None:
    allowed, _other = servers
    sandbox = make_sandbox(OFF)
    backend.pause(sandbox.sandbox_id)
    egress = backend.egress()
    assert egress is not None
    egress.update(sandbox.sandbox_id, only("api.name.test"))
    backend.connect(sandbox.sandbox_id)
    answers = probe(backend, sandbox.sandbox_id, [("api.name.test", allowed.v4.port)])
    assert answers == {f"api.name.test:{allowed.v4.port}": "reached"}


def test_a_container_removed_behind_the_consoles_back_leaves_no_chain(
    backend: DockerBackend, make_sandbox: SandboxMaker, engine: docker.APIClient
) -> None:
    sandbox = make_sandbox(only("198.51.100.0/24"))
    chain = chain_name(sandbox.sandbox_id)

    def listed() -> str:
        return subprocess.run(
            ["nft", "list", "table", "inet", TABLE_NAME], capture_output=True, text=True, check=True
        ).stdout

    assert f"chain {chain}" in listed()
    engine.remove_container(sandbox.sandbox_id, force=True)
    fresh = DockerBackend(backend.config)
    try:
        fresh.outbound.ensure_firewall()  # once per process: restored, but not what is gone
        egress = fresh.egress()
        assert egress is not None
        egress.refusals("")  # a read prunes nothing
        assert f"chain {chain}" in listed()
        assert "pruned" in egress.housekeeping()  # the periodic job does
    finally:
        fresh.close()
    assert f"chain {chain}" not in listed()
