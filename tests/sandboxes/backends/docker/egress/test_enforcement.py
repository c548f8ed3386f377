"""A space's network policy enforced by the Docker backend, from inside real sandboxes.

Every destination is a server this test starts on this machine: in network namespaces of its
own (TEST-NET-2 and 2001:db8::/32 documentation addresses, a private 10.x address, a
link-local 169.254.171.x one; each checked by `ip route get` to go to the test's veth), on a
dummy interface, on the host's own addresses, or in another space's sandbox. The resolver's
upstream is a dnsmasq of the test's own on loopback. Nothing is sent off the machine.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import docker
import pytest

from sandboxes.backends.base import ExecRequest, IdleMode, NetworkSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.firewall import TABLE_NAME
from sandboxes.backends.docker.egress.proxy import squid_available
from sandboxes.backends.docker.egress.rules import chain_name
from tests.factories import set_policy
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
from tests.support.tuning import Tuned

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
    assert caps.l7_rules == squid_available()  # HTTP rules through squid (egress/test_http_rules.py)
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


# Ways out of a space's policy the tests above do not try, from inside real sandboxes: an allowed
# name resolving to a private or host address, DNS to another space's resolver, spoofing, and a
# flood hiding another session's refusal. Destinations: a namespace with a private 10.x address
# checked by ip route get, the host's docker0 address, another space's sandbox and resolver.
PRIVATE = f"10.204.{random.randint(0, 255)}.{random.randint(2, 250)}"

# A DNS query for `name` to (host, 53) over UDP and over TCP: prints which got an answer.
DNS_QUERY = r"""
import json, socket, struct, sys
host, name = sys.argv[1], sys.argv[2]
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(
    bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
out = {}
family = socket.AF_INET6 if ":" in host else socket.AF_INET
try:
    s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(q, (host, 53))
    out["udp"] = "answered" if s.recv(512)[:2] == b"\x12\x34" else "garbled"
except OSError as exc:
    out["udp"] = "no answer %s" % type(exc).__name__
try:
    t = socket.create_connection((host, 53), timeout=2); t.settimeout(2)
    t.sendall(struct.pack("!H", len(q)) + q)
    out["tcp"] = "answered" if t.recv(514)[2:4] == b"\x12\x34" else "garbled"
except OSError as exc:
    out["tcp"] = "no answer %s" % type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def private_server() -> Iterator[BannerServer]:
    with ExitStack() as stack:
        inside = stack.enter_context(namespace(address=PRIVATE))
        yield stack.enter_context(inside.run(lambda: BannerServer(inside.address)))


@pytest.fixture(scope="module")
def host_server() -> Iterator[BannerServer]:
    with BannerServer(docker0_address()) as server:
        yield server


@pytest.fixture(scope="module")
def escape_backend(docker_base_image: str, test_run_id: str, private_server: BannerServer) -> Iterator[DockerBackend]:
    # Rebinding: allowed names whose answers are a private address and the host's own.
    answers = {"rebind-private.test": PRIVATE, "rebind-host.test": docker0_address(), "fine.test": "203.0.113.9"}
    with upstream_dns(answers) as upstream, docker_backend(test_run_id, upstream) as adapter:
        yield adapter


@pytest.fixture(scope="module")
def make_escape_sandbox(
    escape_backend: DockerBackend, docker_base_image: str, test_run_id: str
) -> Iterator[SandboxMaker]:
    with sandbox_maker(escape_backend, docker_base_image, test_run_id, prefix="escape") as make:
        yield make


def _dns(escape_backend: DockerBackend, sandbox_id: str, host: str, name: str) -> dict[str, str]:
    result = escape_backend.exec(sandbox_id, ExecRequest(argv=("python3", "-c", DNS_QUERY, host, name), timeout_s=30))
    assert result.exit_code == 0, result
    answer: dict[str, str] = json.loads(result.stdout)
    return answer


@pytest.mark.parametrize("listed", [False, True])
def test_an_allowed_name_resolving_to_a_private_or_host_address_is_still_refused(
    escape_backend: DockerBackend,
    make_escape_sandbox: SandboxMaker,
    private_server: BannerServer,
    host_server: BannerServer,
    listed: bool,
) -> None:
    names = ("rebind-private.test", "rebind-host.test")
    network = (
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=names) if listed else OPEN
    )
    sandbox = make_escape_sandbox(network)
    resolved = resolve(escape_backend, sandbox.sandbox_id, list(names))
    assert resolved == {"rebind-private.test": [PRIVATE], "rebind-host.test": [host_server.host]}
    answers = probe(
        escape_backend,
        sandbox.sandbox_id,
        [("rebind-private.test", private_server.port), ("rebind-host.test", host_server.port)],
    )
    assert all(answer not in ("reached", "connected") for answer in answers.values()), answers
    assert not private_server.clients
    assert not host_server.clients


def test_dns_to_another_spaces_resolver_is_refused_over_udp_and_tcp(
    escape_backend: DockerBackend, make_escape_sandbox: SandboxMaker, engine: docker.APIClient
) -> None:
    mine = make_escape_sandbox(
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("fine.test",))
    )
    theirs = make_escape_sandbox(OPEN)  # another space: its resolver answers every name
    own_gateway = network_settings(engine, mine.sandbox_id)["Gateway"]
    other = network_settings(engine, theirs.sandbox_id)
    # Control: the own resolver answers (UDP and TCP).
    assert _dns(escape_backend, mine.sandbox_id, own_gateway, "fine.test") == {"udp": "answered", "tcp": "answered"}
    for gateway in (other["Gateway"], other.get("IPv6Gateway") or ""):
        if not gateway:
            continue
        answer = _dns(escape_backend, mine.sandbox_id, gateway, "rebind-private.test")
        assert not any(v == "answered" for v in answer.values()), (gateway, answer)


def test_ipv6_and_ipv4_to_another_sandbox_of_any_space_is_refused(
    escape_backend: DockerBackend, make_escape_sandbox: SandboxMaker, engine: docker.APIClient
) -> None:
    space = f"escape-{uuid.uuid4().hex[:8]}"
    client = make_escape_sandbox(OPEN, space)
    same_space = make_escape_sandbox(OPEN, space)
    other_space = make_escape_sandbox(OPEN)
    targets = []
    for neighbour in (same_space, other_space):
        start_listener(escape_backend, neighbour.sandbox_id)
        settings = network_settings(engine, neighbour.sandbox_id)
        targets += [(a, LISTENER_PORT) for a in (settings["IPAddress"], settings.get("GlobalIPv6Address")) if a]
    assert any(":" in host for host, _ in targets), "the space networks have no IPv6: nothing tried"
    # The listeners answer from inside their own sandbox (they run).
    for neighbour in (same_space, other_space):
        loopback = ("127.0.0.1", LISTENER_PORT)
        assert probe(escape_backend, neighbour.sandbox_id, [loopback]) == {f"127.0.0.1:{LISTENER_PORT}": "reached"}
    answers = probe(escape_backend, client.sandbox_id, targets)
    assert all(answer not in ("reached", "connected") for answer in answers.values()), answers


def test_a_sandbox_has_no_capability_to_spoof_or_readdress() -> None:
    from sandboxes.backends.docker.common import ROOT_CAPABILITIES

    assert not {"NET_RAW", "NET_ADMIN", "SYS_ADMIN"} & set(ROOT_CAPABILITIES)


FLOOD = r"""
import socket, sys
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(count):
    try:
        s.sendto(b"x", (host, port))
    except OSError:
        pass
"""


@pytest.mark.django_db(transaction=True)
def test_one_flooding_sandbox_does_not_hide_another_sessions_refusal(
    tuned: Tuned, world: Any, session_config: Any, private_server: BannerServer, settings: Any
) -> None:
    import time

    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import EgressEvent
    from sandboxes.network.log import MAX_PER_READ, ingest_backend
    from sandboxes.sessions.runtime import Runtime

    # One sandbox's flood of refusals must not hide every other session's: ingest_backend
    # records at most MAX_PER_READ per read and keeps the cursor at the first unread one.
    tuned({"network.log_max_per_session": 50})
    set_policy(world.space_a)
    runtime = Runtime()
    flooder = runtime.resolve(world.space_a, "flooder").session
    victim = runtime.resolve(world.space_a, "victim").session
    escape_backend = get_backend(session_config)
    assert isinstance(escape_backend, DockerBackend)
    ingest_backend(session_config.backend)  # the cursor at the end of what was logged so far
    count = str(MAX_PER_READ * 2)
    flood = escape_backend.exec(
        flooder.sandbox_id,
        ExecRequest(argv=("python3", "-c", FLOOD, PRIVATE, str(private_server.port), count), timeout_s=120),
    )
    assert flood.exit_code == 0, flood
    probe(escape_backend, victim.sandbox_id, [(PRIVATE, private_server.port + 1)])
    assert not private_server.clients
    time.sleep(2)  # ulogd writes its JSON lines
    ingest_backend(session_config.backend)
    assert EgressEvent.objects.filter(session=flooder).count() <= 50  # bounded per session
    assert EgressEvent.objects.filter(session=victim).exists()
