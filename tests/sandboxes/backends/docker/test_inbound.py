"""Inbound traffic on the Docker adapter, against the real engine with the host packet filter
loaded: the traffic token, the sandbox's own address, and an inbound-only sandbox (outbound
off) that the host reaches while it reaches nothing.

Every server is one of the test's own: an http.server inside the sandbox, a TCP listener on
this host. Nothing leaves the machine.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator

import docker
import pytest

from sandboxes.backends.base import BackendConfig, ErrorKind, NetworkSpec, RemoteError, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.firewall import TABLE_FAMILY, TABLE_NAME
from sandboxes.backends.docker.inbound import LABEL_TRAFFIC_TOKEN
from tests.conftest import IN_CI
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.backend_conformance import OFFLINE, run

pytestmark = [pytest.mark.docker]

INBOUND_ONLY = NetworkSpec.parse(allow_internet_access=False, allow_public_traffic=True)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _table_loaded() -> bool:
    done = subprocess.run(["nft", "list", "table", TABLE_FAMILY, TABLE_NAME], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str) -> Iterator[DockerBackend]:
    options = {"network": docker_test_network_name(test_run_id), "inbound_url": "https://console.test/inbound/"}
    adapter = DockerBackend(BackendConfig(kind="docker", options=options))
    yield adapter
    adapter.close()


@pytest.fixture
def make(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[object]:
    made: list[str] = []

    def create(network: NetworkSpec, space: str = "inbound-space") -> str:
        metadata = {"test-run": test_run_id, "console-space": space}
        info = backend.create(SandboxSpec(template_id=docker_base_image, network=network, metadata=metadata))
        made.append(info.sandbox_id)
        return info.sandbox_id

    yield create
    for sandbox_id in made:
        backend.delete(sandbox_id)


def _serve(backend: DockerBackend, sandbox_id: str, port: int = 8000) -> None:
    run(backend, sandbox_id, "echo hello-inbound > /workspace/hello.txt")
    run(
        backend,
        sandbox_id,
        f"cd /workspace && setsid nohup python3 -m http.server {port} --bind 0.0.0.0 > /dev/null 2>&1 < /dev/null &",
    )


def _get(url: str, timeout: float = 5) -> bytes:
    deadline = time.monotonic() + 20
    while True:
        try:
            with _DIRECT.open(url, timeout=timeout) as answer:
                return bytes(answer.read())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_inbound_capability_is_the_consoles_route(backend: DockerBackend, make: object) -> None:
    caps = backend.network_capabilities()
    assert caps.inbound_toggle
    inbound = backend.inbound()
    assert inbound.served_by_console
    assert inbound.token_header == "X-Traffic-Token"
    assert inbound.public_url("abc123", 8080) == "https://console.test/inbound/abc123/8080/"
    for port in (0, 65536, -1):
        with pytest.raises(RemoteError) as caught:
            inbound.public_url("abc123", port)
        assert caught.value.kind == ErrorKind.INVALID
    assert DockerBackend(BackendConfig(kind="docker")).inbound().public_url("x", 1) == "/inbound/x/1/"


def test_each_sandbox_gets_its_own_token_read_back_from_the_engine(
    backend: DockerBackend, make: object, engine_api: docker.APIClient
) -> None:
    first = make(OFFLINE)  # type: ignore[operator]
    second = make(OFFLINE)  # type: ignore[operator]
    inbound = backend.inbound()
    tokens = [inbound.traffic_token(first), inbound.traffic_token(second)]
    assert all(token and len(token) >= 40 for token in tokens)
    assert tokens[0] != tokens[1]
    assert engine_api.inspect_container(first)["Config"]["Labels"][LABEL_TRAFFIC_TOKEN] == tokens[0]
    # What create and connect answer is what the runtime stores with the session.
    assert backend.connect(first).traffic_token == tokens[0]
    # A fresh adapter (a console restart) reads the same token.
    assert DockerBackend(backend.config).inbound().traffic_token(first) == tokens[0]
    with pytest.raises(RemoteError) as caught:
        inbound.traffic_token("doesnotexist0123456789abcdef")
    assert caught.value.kind == ErrorKind.NOT_FOUND


def test_an_inbound_only_sandbox_is_reached_from_the_host_and_reaches_nothing(
    backend: DockerBackend, make: object, engine_api: docker.APIClient
) -> None:
    if not _table_loaded():
        if IN_CI:
            pytest.fail("[CI] the nftables table inet sandbox_console is not loaded", pytrace=False)
        pytest.skip("needs the host packet filter loaded (nft list table inet sandbox_console)")
    sandbox_id = make(INBOUND_ONLY, "inbound-only")  # type: ignore[operator]
    networks = engine_api.inspect_container(sandbox_id)["NetworkSettings"]["Networks"]
    internal = backend.inbound_network_name("inbound-only")
    assert list(networks) == [internal]
    assert engine_api.inspect_network(internal)["Internal"] is True
    _serve(backend, sandbox_id)
    host, port = backend.inbound().console_upstream(sandbox_id, 8000)
    assert (host, port) == (networks[internal]["IPAddress"], 8000)
    # Host -> sandbox: the output hook, allowed with the table loaded.
    assert _get(f"http://{host}:{port}/hello.txt") == b"hello-inbound\n"

    # Sandbox -> host: a listener of ours on every address of this host, at the bridge's gateway.
    gateway = engine_api.inspect_network(internal)["IPAM"]["Config"][0]["Gateway"]
    listener = socket.create_server(("0.0.0.0", 0))
    accepted: list[object] = []

    def accept() -> None:
        listener.settimeout(6)
        with contextlib.suppress(OSError):
            accepted.append(listener.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        line = (
            'python3 -c "import socket,sys; s=socket.socket(); s.settimeout(3)\n'
            f"try: s.connect(('{gateway}', {listener.getsockname()[1]})); print('reached')\n"
            "except OSError as e: print('refused', e)\""
        )
        out = run(backend, sandbox_id, line)
    finally:
        thread.join()
        listener.close()
    assert out.startswith("refused"), out
    assert accepted == []


def test_upstream_refuses_a_sandbox_that_is_not_running_or_has_no_network(backend: DockerBackend, make: object) -> None:
    reachable = make(INBOUND_ONLY)  # type: ignore[operator]
    backend.pause(reachable)
    with pytest.raises(RemoteError) as caught:
        backend.inbound().console_upstream(reachable, 8000)
    assert caught.value.kind == ErrorKind.CONFLICT
    offline = make(OFFLINE)  # type: ignore[operator]
    with pytest.raises(RemoteError) as caught:
        backend.inbound().console_upstream(offline, 8000)
    assert caught.value.kind == ErrorKind.UNSUPPORTED
    assert "rebuild" in caught.value.message
    with pytest.raises(RemoteError) as caught:
        backend.inbound().console_upstream(offline, 70000)
    assert caught.value.kind == ErrorKind.INVALID


def test_the_internal_network_goes_with_the_spaces_last_sandbox(
    backend: DockerBackend, make: object, engine_api: docker.APIClient, docker_base_image: str, test_run_id: str
) -> None:
    space = f"released-{time.monotonic_ns()}"
    info = backend.create(
        SandboxSpec(
            template_id=docker_base_image,
            network=INBOUND_ONLY,
            metadata={"test-run": test_run_id, "console-space": space},
        )
    )
    name = backend.inbound_network_name(space)
    assert engine_api.networks(names=[name])
    backend.delete(info.sandbox_id)
    assert not [n for n in engine_api.networks(names=[name]) if n["Name"] == name]


@pytest.fixture(scope="module")
def engine_api() -> Iterator[docker.APIClient]:
    client = docker.from_env(timeout=60)
    yield client.api
    client.close()


def test_a_snapshot_keeps_no_token_and_its_sandboxes_get_their_own(
    backend: DockerBackend, make: object, engine_api: docker.APIClient
) -> None:
    source = make(OFFLINE)  # type: ignore[operator]
    snapshots = backend.snapshots()
    snapshot = snapshots.create(source, name="inbound-token")
    try:
        assert snapshot.labels[LABEL_TRAFFIC_TOKEN] == ""
        image = engine_api.inspect_image(snapshot.snapshot_id.removeprefix("snap-"))
        assert image["Config"]["Labels"][LABEL_TRAFFIC_TOKEN] == ""
        listed = next(s for s in snapshots.list() if s.snapshot_id == snapshot.snapshot_id)
        assert listed.labels.get(LABEL_TRAFFIC_TOKEN) == ""
        child = backend.create(
            SandboxSpec(template_id=snapshot.snapshot_id, network=OFFLINE, metadata=dict(backend.get(source).metadata))
        )
        try:
            token = backend.inbound().traffic_token(child.sandbox_id)
            assert token
            assert token not in (backend.inbound().traffic_token(source), "")
            assert child.traffic_token == token
        finally:
            backend.delete(child.sandbox_id)
    finally:
        snapshots.delete(snapshot.snapshot_id)
