"""Adversarial review of issue 13 (rev3), from inside real Docker sandboxes: ways out of a
space's policy that the main egress tests do not try. Every destination is a server this test
starts on this machine (a network namespace with a private 10.x address checked by `ip route
get`, the host's docker0 address, another space's sandbox and resolver); the upstream
resolver is a dnsmasq of the test's own on loopback. Nothing is sent off the machine."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import docker
import pytest

from sandboxes.backends.base import ExecRequest, NetworkSpec
from sandboxes.backends.docker.backend import DockerBackend
from tests.factories import set_policy
from tests.support.egress_support import (
    LISTENER_PORT,
    SandboxMaker,
    docker0_address,
    docker_backend,
    network_settings,
    probe,
    resolve,
    sandbox_maker,
    start_listener,
    upstream_dns,
)
from tests.support.netns import BannerServer, namespace

pytestmark = [pytest.mark.docker]

OPEN = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False)
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
def backend(docker_base_image: str, test_run_id: str, private_server: BannerServer) -> Iterator[DockerBackend]:
    # Rebinding: allowed names whose answers are a private address and the host's own.
    answers = {"rebind-private.test": PRIVATE, "rebind-host.test": docker0_address(), "fine.test": "203.0.113.9"}
    with upstream_dns(answers) as upstream, docker_backend(test_run_id, upstream) as adapter:
        yield adapter


@pytest.fixture(scope="module")
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, prefix="rev3") as make:
        yield make


def _dns(backend: DockerBackend, sandbox_id: str, host: str, name: str) -> dict[str, str]:
    result = backend.exec(sandbox_id, ExecRequest(argv=("python3", "-c", DNS_QUERY, host, name), timeout_s=30))
    assert result.exit_code == 0, result
    answer: dict[str, str] = json.loads(result.stdout)
    return answer


@pytest.mark.parametrize("listed", [False, True])
def test_an_allowed_name_resolving_to_a_private_or_host_address_is_still_refused(
    backend: DockerBackend,
    make_sandbox: SandboxMaker,
    private_server: BannerServer,
    host_server: BannerServer,
    listed: bool,
) -> None:
    names = ("rebind-private.test", "rebind-host.test")
    network = (
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=names) if listed else OPEN
    )
    sandbox = make_sandbox(network)
    resolved = resolve(backend, sandbox.sandbox_id, list(names))
    assert resolved == {"rebind-private.test": [PRIVATE], "rebind-host.test": [host_server.host]}
    answers = probe(
        backend,
        sandbox.sandbox_id,
        [("rebind-private.test", private_server.port), ("rebind-host.test", host_server.port)],
    )
    assert all(answer not in ("reached", "connected") for answer in answers.values()), answers
    assert not private_server.clients
    assert not host_server.clients


def test_dns_to_another_spaces_resolver_is_refused_over_udp_and_tcp(
    backend: DockerBackend, make_sandbox: SandboxMaker, engine: docker.APIClient
) -> None:
    mine = make_sandbox(
        NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("fine.test",))
    )
    theirs = make_sandbox(OPEN)  # another space: its resolver answers every name
    own_gateway = network_settings(engine, mine.sandbox_id)["Gateway"]
    other = network_settings(engine, theirs.sandbox_id)
    # Control: the own resolver answers (UDP and TCP).
    assert _dns(backend, mine.sandbox_id, own_gateway, "fine.test") == {"udp": "answered", "tcp": "answered"}
    for gateway in (other["Gateway"], other.get("IPv6Gateway") or ""):
        if not gateway:
            continue
        answer = _dns(backend, mine.sandbox_id, gateway, "rebind-private.test")
        assert not any(v == "answered" for v in answer.values()), (gateway, answer)


def test_ipv6_and_ipv4_to_another_sandbox_of_any_space_is_refused(
    backend: DockerBackend, make_sandbox: SandboxMaker, engine: docker.APIClient
) -> None:
    space = f"rev3-{uuid.uuid4().hex[:8]}"
    client = make_sandbox(OPEN, space)
    same_space = make_sandbox(OPEN, space)
    other_space = make_sandbox(OPEN)
    targets = []
    for neighbour in (same_space, other_space):
        start_listener(backend, neighbour.sandbox_id)
        settings = network_settings(engine, neighbour.sandbox_id)
        targets += [(a, LISTENER_PORT) for a in (settings["IPAddress"], settings.get("GlobalIPv6Address")) if a]
    assert any(":" in host for host, _ in targets), "the space networks have no IPv6: nothing tried"
    # The listeners answer from inside their own sandbox (they run).
    for neighbour in (same_space, other_space):
        loopback = ("127.0.0.1", LISTENER_PORT)
        assert probe(backend, neighbour.sandbox_id, [loopback]) == {f"127.0.0.1:{LISTENER_PORT}": "reached"}
    answers = probe(backend, client.sandbox_id, targets)
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
    world: Any, session_config: Any, private_server: BannerServer, settings: Any
) -> None:
    import time

    from sandboxes.models import EgressEvent
    from sandboxes.network.log import MAX_PER_READ, ingest_backend
    from sandboxes.sessions.runtime import Runtime, backend_for

    # Was: ingest_backend recorded the first MAX_PER_READ refusals of a read and moved the
    # cursor past all of them, so one sandbox's flood hid every other session's refusals.
    settings.EGRESS_LOG_MAX_PER_SESSION = 50
    set_policy(world.space_a)
    runtime = Runtime()
    flooder = runtime.resolve(world.space_a, "flooder").session
    victim = runtime.resolve(world.space_a, "victim").session
    backend = backend_for(session_config)
    assert isinstance(backend, DockerBackend)
    ingest_backend(session_config.backend)  # the cursor at the end of what was logged so far
    count = str(MAX_PER_READ * 2)
    flood = backend.exec(
        flooder.sandbox_id,
        ExecRequest(argv=("python3", "-c", FLOOD, PRIVATE, str(private_server.port), count), timeout_s=120),
    )
    assert flood.exit_code == 0, flood
    probe(backend, victim.sandbox_id, [(PRIVATE, private_server.port + 1)])
    assert not private_server.clients
    time.sleep(2)  # ulogd writes its JSON lines
    ingest_backend(session_config.backend)
    assert EgressEvent.objects.filter(session=flooder).count() <= 50  # bounded per session
    assert EgressEvent.objects.filter(session=victim).exists()
