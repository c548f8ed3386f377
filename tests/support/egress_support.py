"""Destinations for the egress tests, all on this machine: an IPv4+IPv6 network namespace of
the test's own (TEST-NET-2 and 2001:db8::/32, documentation ranges, checked with `ip route
get` to go to the test's veth before anything is sent), an upstream DNS server on loopback
(a dnsmasq of the test's own answering `--address=/name/ip` lines), and the Docker egress
tests' shared set-up: their backend on the run's test network, a sandbox maker that deletes
what it made, the probes run inside a sandbox, a listener started in one, and waiting for a
refusal to be read back.
"""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import docker

from sandboxes.backends.base import META_SPACE, BackendConfig, ExecRequest, NetworkSpec, SandboxInfo, SandboxSpec
from sandboxes.backends.capabilities import EgressRefusal
from sandboxes.backends.docker.backend import DockerBackend
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.netns import ip, require_root_networking, route_device

# Connects to every (host, port) at once, each connect and read waiting at most argv[2]
# seconds; prints {"host:port": "reached" | "refused" | "timeout" | ...}.
# Plain sockets: the program ignores any proxy variable, as an agent's own code may.
PROBE = r"""
import json, socket, sys, threading
out = {}
wait = float(sys.argv[2])
def probe(host, port):
    key = "%s:%s" % (host, port)
    try:
        with socket.create_connection((host, port), timeout=wait) as conn:
            conn.settimeout(wait)
            out[key] = "reached" if conn.recv(64).startswith(b"reached") else "connected"
    except ConnectionRefusedError:
        out[key] = "refused"
    except socket.timeout:
        out[key] = "timeout"
    except socket.gaierror as exc:
        out[key] = "no such name"
    except OSError as exc:
        out[key] = "error %s" % exc.errno
threads = [threading.Thread(target=probe, args=tuple(t)) for t in json.loads(sys.argv[1])]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""

RESOLVE = r"""
import json, socket, sys
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = sorted({a[4][0] for a in socket.getaddrinfo(name, 80, proto=socket.IPPROTO_TCP)})
    except socket.gaierror:
        out[name] = []
print(json.dumps(out))
"""


# A banner server as the session user inside a sandbox, on every IPv4 and IPv6 address of it.
LISTENER_PORT = 8000
LISTENER = (
    "import socket\ns = socket.socket(socket.AF_INET6); s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    f"s.bind(('::', {LISTENER_PORT})); s.listen(8)\n"
    "while True:\n c = s.accept()[0]; c.sendall(b'reached\\n'); c.close()\n"
)

SandboxMaker = Callable[..., SandboxInfo]


@contextlib.contextmanager
def docker_backend(
    test_run_id: str, dns_upstream: str = "", options: Mapping[str, str] | None = None, **config: Any
) -> Iterator[DockerBackend]:
    """A Docker backend on the run's test network (its resolver forwarding to `dns_upstream`
    when given, with more adapter `options`); `config` goes to BackendConfig (idle_mode, ...).
    Closed on the way out."""
    options = {"network": docker_test_network_name(test_run_id), **(options or {})}
    if dns_upstream:
        options["dns_upstream"] = dns_upstream
    adapter = DockerBackend(BackendConfig(kind="docker", options=options, **config))
    try:
        yield adapter
    finally:
        adapter.close()


@contextlib.contextmanager
def sandbox_maker(backend: DockerBackend, image: str, test_run_id: str, prefix: str) -> Iterator[SandboxMaker]:
    """`make(network, space=None)`: a sandbox of `image` labelled with the run, in `space`
    (else a space `<prefix>-<random>` of its own); every one made is deleted at the end."""
    made: list[str] = []

    def make(network: NetworkSpec, space: str | None = None) -> SandboxInfo:
        metadata = {"test-run": test_run_id, META_SPACE: space or f"{prefix}-{uuid.uuid4().hex[:8]}"}
        info = backend.create(SandboxSpec(template_id=image, network=network, metadata=metadata))
        made.append(info.sandbox_id)
        return info

    try:
        yield make
    finally:
        for sandbox_id in made:
            backend.delete(sandbox_id)


def network_settings(engine: docker.APIClient, sandbox_id: str) -> dict[str, Any]:
    """The engine's settings (IPAddress, Gateway, GlobalIPv6Address, ...) of the one network
    a sandbox's container is on."""
    (settings,) = engine.inspect_container(sandbox_id)["NetworkSettings"]["Networks"].values()
    return dict(settings)


def docker0_address() -> str:
    """The host's IPv4 address on docker0."""
    info = json.loads(ip("-j", "addr", "show", "docker0").stdout)[0]["addr_info"]
    return str(next(a["local"] for a in info if a["family"] == "inet"))


def start_listener(backend: DockerBackend, sandbox_id: str) -> None:
    """LISTENER in the background in the sandbox, on LISTENER_PORT, once it listens (a busy
    machine may take a while to start its Python: a probe sent before would be refused)."""
    started = backend.exec(
        sandbox_id, ExecRequest(argv=("sh", "-c", 'nohup python3 -c "$0" > /dev/null 2>&1 &', LISTENER), user="user")
    )
    assert started.exit_code == 0, started
    loopback = ("127.0.0.1", LISTENER_PORT)
    deadline = time.monotonic() + 30
    while probe(backend, sandbox_id, [loopback], timeout_s=1) != {f"127.0.0.1:{LISTENER_PORT}": "reached"}:
        assert time.monotonic() < deadline, f"the listener in {sandbox_id} did not listen within 30 s"
        time.sleep(0.1)


def probe(
    backend: DockerBackend, sandbox_id: str, targets: list[tuple[str, int]], timeout_s: float = 3
) -> dict[str, str]:
    """PROBE as the session user: each target's answer, a connect or read given `timeout_s`."""
    argv = ("python3", "-c", PROBE, json.dumps(targets), str(timeout_s))
    result = backend.exec(sandbox_id, ExecRequest(argv=argv, user="user", timeout_s=60))
    assert result.exit_code == 0, result
    answers: dict[str, str] = json.loads(result.stdout)
    return answers


def resolve(backend: DockerBackend, sandbox_id: str, names: list[str]) -> dict[str, list[str]]:
    result = backend.exec(
        sandbox_id, ExecRequest(argv=("python3", "-c", RESOLVE, json.dumps(names)), user="user", timeout_s=60)
    )
    assert result.exit_code == 0, result
    answers: dict[str, list[str]] = json.loads(result.stdout)
    return answers


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def wait_refusal(
    backend: DockerBackend, sandbox_id: str, destination: str, layer: str = "packet", timeout_s: float = 5
) -> EgressRefusal:
    """The first refusal of this sandbox to this destination, read back through the contract."""
    egress = backend.egress()
    assert egress is not None
    deadline = time.monotonic() + timeout_s
    seen: list[EgressRefusal] = []
    while time.monotonic() < deadline:
        seen, _ = egress.refusals("")
        for refusal in seen:
            if refusal.sandbox_id == sandbox_id and refusal.destination == destination and refusal.layer == layer:
                return refusal
        time.sleep(0.2)
    mine = [r for r in seen if r.sandbox_id == sandbox_id]
    raise AssertionError(f"no {layer} refusal for {destination}; this sandbox's: {mine}")


@dataclass
class DualNamespace:
    """A namespace with one IPv4 and one IPv6 address, each routed to it from the host."""

    name: str
    v4: str
    v6: str
    host_device: str


@contextlib.contextmanager
def dual_namespace() -> Iterator[DualNamespace]:
    """TEST-NET-2 /30 and a 2001:db8:5c::/64 of its own; both checked to route to the veth."""
    require_root_networking()
    tag = secrets.token_hex(4)
    name, host_dev, inner_dev = f"sce-{tag}", f"scev{tag}h", f"scev{tag}n"
    ip("netns", "add", name)
    try:
        ip("link", "add", host_dev, "type", "veth", "peer", "name", inner_dev, "netns", name)
        # Linux lets two interfaces hold the same address: a /30 is free only when no
        # interface holds an address inside it (another run's namespace may).
        taken = {
            str(addr["local"])
            for link in json.loads(ip("-j", "addr").stdout)
            for addr in link.get("addr_info", [])
            if addr.get("family") == "inet"
        }
        free = [third for third in range(0, 256, 4) if not any(f"198.51.100.{third + k}" in taken for k in range(4))]
        random.shuffle(free)
        if not free:
            raise RuntimeError("no free /30 in 198.51.100.0/24")
        third = free[0]
        host_v4, inner_v4 = f"198.51.100.{third + 1}", f"198.51.100.{third + 2}"
        ip("addr", "add", f"{host_v4}/30", "dev", host_dev)
        prefix = f"2001:db8:5c:{random.randint(1, 0xFFFF):x}"
        ip("-6", "addr", "add", f"{prefix}::1/64", "dev", host_dev, "nodad")
        ip("link", "set", host_dev, "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "addr", "add", f"{inner_v4}/30", "dev", inner_dev)
        ip("-n", name, "-6", "addr", "add", f"{prefix}::2/64", "dev", inner_dev, "nodad")
        ip("-n", name, "link", "set", inner_dev, "up")
        ip("-n", name, "route", "add", "default", "via", host_v4)
        ip("-n", name, "-6", "route", "add", "default", "via", f"{prefix}::1")
        for address in (inner_v4, f"{prefix}::2"):
            assert route_device(address) == ("unicast", host_dev), f"{address} is not routed to the test namespace"
        yield DualNamespace(name=name, v4=inner_v4, v6=f"{prefix}::2", host_device=host_dev)
    finally:
        ip("link", "del", host_dev, check=False)
        ip("netns", "del", name, check=False)


def free_port() -> int:
    """A loopback port free for UDP and TCP alike (dnsmasq listens on both): other suites on
    this machine take ports too, so one free for UDP only was seen taken for TCP."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no loopback port free for both UDP and TCP")


@contextlib.contextmanager
def upstream_dns(answers: Mapping[str, str]) -> Iterator[str]:
    """A DNS server of the test's own on loopback: `answers` maps a domain (and its
    subdomains) to an address; every other name is NXDOMAIN. Yields `127.0.0.1#port`."""
    binary = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
    port = free_port()
    folder = tempfile.mkdtemp(prefix="egress-upstream-")
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
        *(f"--address=/{name}/{address}" for name, address in answers.items()),
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and process.poll() is None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    break  # dnsmasq holds it
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        yield f"127.0.0.1#{port}"
    finally:
        process.terminate()
        process.wait(5)
        shutil.rmtree(folder, ignore_errors=True)


class NamespaceServers:
    """Banner servers inside a namespace on its IPv4 and IPv6 address (one port each)."""

    def __init__(self, space: DualNamespace) -> None:
        from tests.support.netns import BannerServer, Namespace

        self._ns = Namespace(name=space.name, address=space.v4, host_address="", host_device=space.host_device)
        self.v4 = self._ns.run(lambda: BannerServer(space.v4))
        self.v6 = self._ns.run(lambda: BannerServer(space.v6))

    def __enter__(self) -> NamespaceServers:
        self.v4.__enter__()
        self.v6.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.v4.__exit__(*exc)
        self.v6.__exit__(*exc)
