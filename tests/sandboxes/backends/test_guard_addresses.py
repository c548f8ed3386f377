"""The guard's judgement of addresses and host names, and where it is applied.

Pure decisions on literal addresses and a resolver stub: nothing here sends a packet
anywhere but to a forwarder this test starts on loopback. Each way past the guard is one
test, written to fail on the guard before it knew the case.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from netpolicy import ADDRESS_CLASSES, Treatment
from sandboxes.backends.base import BackendConfig, ErrorKind, RemoteError
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.guard import (
    ALWAYS_REFUSED,
    PRIVATE_OPT_IN,
    GuardedHTTPAdapter,
    address_problem,
    check_endpoint,
    embedded_ipv4,
)
from sandboxes.models import PlatformBackend
from tests.personas import World
from tests.sandboxes.catalog.test_platform_backends import backend_form

METADATA = "169.254.169.254"


def literal(host: str, port: int) -> list[str]:
    """A resolver for IP literals only: nothing is looked up."""
    return [str(ipaddress.ip_address(host))]


class StubResolver:
    """Every name resolves to `address` (changeable); records what it was asked."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return [self.address]


def refused(url: str, *, allow_private: bool = False) -> RemoteError:
    with pytest.raises(RemoteError) as caught:
        check_endpoint(url, allow_private=allow_private, resolver=literal)
    assert caught.value.kind == ErrorKind.FORBIDDEN
    return caught.value


# --- The addresses of the issue, accepted before without the private opt-in ---------------


@pytest.mark.parametrize(
    "url",
    [
        "http://[::169.254.169.254]/",  # IPv4-compatible
        "http://[::ffff:169.254.169.254]/",  # IPv4-mapped
        "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 well-known prefix
        "http://[64:ff9b:1:a9fe:a9:fe00::]/",  # NAT64 local-use prefix, /48 layout (RFC 6052)
        "http://[64:ff9b:1::a9fe:a9fe]/",  # NAT64 local-use prefix, /96 layout
        "http://[2002:a9fe:a9fe::]/",  # 6to4
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",  # Teredo, client 169.254.169.254 (xor)
    ],
)
def test_an_ipv6_form_embedding_the_metadata_address_is_refused_even_with_the_opt_in(url: str) -> None:
    error = refused(url, allow_private=True)
    assert "169.254." in error.message
    assert "never allowed" in error.message


@pytest.mark.parametrize(
    "url",
    ["http://[::127.0.0.1]/", "http://[64:ff9b::7f00:1]/", "http://[2002:7f00:1::]/", "http://[::ffff:10.0.0.1]/"],
)
def test_an_ipv6_form_embedding_a_private_address_needs_the_opt_in(url: str) -> None:
    assert "allow private endpoints" in refused(url).message
    assert check_endpoint(url, allow_private=True, resolver=literal)


@pytest.mark.parametrize(
    "address",
    ["64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8", "2001:0:4136:e378:8000:63bf:f7f7:f7f7"],
)
def test_an_ipv6_form_embedding_a_public_address_is_judged_by_it_and_allowed(address: str) -> None:
    assert embedded_ipv4(ipaddress.ip_address(address)) != []
    assert address_problem(address, allow_private=False) is None


@pytest.mark.parametrize(
    "address",
    ["198.18.0.1", "198.19.255.254", "240.0.0.1", "192.0.0.170", "192.0.0.8", "192.0.2.1", "2001:2::1", "2001:db8::1"],
)
def test_reserved_and_benchmarking_ranges_are_not_public(address: str) -> None:
    url = f"http://[{address}]/" if ":" in address else f"http://{address}/"
    assert "allow private endpoints" in refused(url).message
    assert check_endpoint(url, allow_private=True, resolver=literal)


def test_ipv6_loopback_stays_loopback_and_is_not_read_as_an_embedded_address() -> None:
    assert embedded_ipv4(ipaddress.ip_address("::1")) == []
    assert "loopback" in (address_problem("::1", allow_private=False) or "")
    assert address_problem("::1", allow_private=True) is None


# --- Malformed host names: an invalid error before any lookup --------------------------------


@pytest.mark.parametrize("host", ["a" * 64 + ".example.com", "a..b", "api\u2028example.com", "x" * 254])
def test_a_malformed_host_name_is_invalid_and_never_looked_up(host: str) -> None:
    resolver = StubResolver("8.8.8.8")
    with pytest.raises(RemoteError) as caught:
        check_endpoint(f"https://{host}/", allow_private=False, resolver=resolver)
    assert caught.value.kind == ErrorKind.INVALID
    assert resolver.calls == []


@pytest.mark.parametrize("host", ["a" * 64 + ".example.com", "a..b", "api\u2028example.com"])
def test_a_malformed_host_name_in_a_backend_form_is_a_field_error(world: World, host: str) -> None:
    data = backend_form(kind="e2b", endpoint=f"https://{host}", domain="e2b.example.com", api_key="k")
    response = world.client_for("root").post(reverse("sandboxes:backend_create"), data)
    assert response.status_code == 400
    assert "endpoint" in response.context["form"].errors
    assert not PlatformBackend.objects.exists()


# --- Package sources get the endpoints' check -------------------------------------------------


@pytest.mark.parametrize("field", ["pip_index_url", "npm_registry_url"])
@pytest.mark.parametrize(
    ("url", "allow_private", "refused_field"),
    [
        (f"http://{METADATA}/simple/", True, True),
        ("http://[::ffff:169.254.169.254]/simple/", True, True),
        ("http://127.0.0.1:3141/simple/", False, True),
        ("http://127.0.0.1:3141/simple/", True, False),
    ],
)
def test_a_package_source_url_gets_the_endpoint_check(
    world: World, field: str, url: str, allow_private: bool, refused_field: bool
) -> None:
    # Package sources are platform infrastructure now: they are set on a platform backend.
    data: dict[str, Any] = backend_form(**{field: url})
    if allow_private:
        data["allow_private_endpoints"] = "on"
    response = world.client_for("root").post(reverse("sandboxes:backend_create"), data)
    if refused_field:
        assert response.status_code == 400
        assert field in response.context["form"].errors
        assert not PlatformBackend.objects.exists()
    else:
        assert response.status_code == 302
        assert getattr(PlatformBackend.objects.get(), field) == url


# --- Docker tcp:// and ssh:// engines are checked when dialled --------------------------------


class TcpToEngine:
    """A loopback TCP listener forwarding every connection to the engine's Unix socket."""

    def __init__(self, upstream: str = "/var/run/docker.sock") -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            engine = socket.socket(socket.AF_UNIX)
            engine.connect(self.upstream)
            for a, b in ((client, engine), (engine, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


@pytest.fixture
def tcp_engine() -> Iterator[TcpToEngine]:
    forwarder = TcpToEngine()
    yield forwarder
    forwarder.close()


@pytest.mark.docker
def test_a_tcp_docker_engine_name_rebound_to_the_metadata_address_is_refused_when_dialled(
    tcp_engine: TcpToEngine,
) -> None:
    resolver = StubResolver("127.0.0.1")
    config = BackendConfig(
        kind="docker", endpoint=f"tcp://engine.rebind.test:{tcp_engine.port}", allow_private_endpoints=True
    )
    backend = DockerBackend(config, resolver=resolver)
    try:
        assert backend.health().ok  # through the forwarder, pinned to the checked 127.0.0.1
        assert tcp_engine.connections >= 1
        resolver.address = METADATA
        with pytest.raises(RemoteError) as caught:
            backend.api.ping()
        assert caught.value.kind == ErrorKind.FORBIDDEN
        assert METADATA in caught.value.message
        assert resolver.calls.count("engine.rebind.test") >= 2  # re-resolved on the later request
    finally:
        backend.close()


@pytest.mark.docker
def test_a_tcp_docker_engine_on_loopback_needs_the_opt_in_before_anything_is_sent(tcp_engine: TcpToEngine) -> None:
    config = BackendConfig(kind="docker", endpoint=f"tcp://127.0.0.1:{tcp_engine.port}")
    backend = DockerBackend(config)
    health = backend.health()
    assert not health.ok
    assert "allow private endpoints" in health.detail
    assert tcp_engine.connections == 0
    backend.close()


@pytest.mark.parametrize("address", [METADATA, "::ffff:169.254.169.254", "127.0.0.1"])
def test_an_ssh_docker_engine_is_judged_before_it_is_dialled(address: str) -> None:
    resolver = StubResolver(address)
    backend = DockerBackend(
        BackendConfig(kind="docker", endpoint="ssh://deploy@engine.example.test"), resolver=resolver
    )
    health = backend.health()
    assert not health.ok
    assert "never allowed" in health.detail or "allow private endpoints" in health.detail
    assert resolver.calls == ["engine.example.test"]


# --- The requests adapter keeps the name for TLS while it dials the checked address ------------


def self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path, list[str]]]:
    """An HTTPS server on loopback with a certificate for engine.rebind.test; records Host headers."""
    import http.server
    import ssl

    cert, key = self_signed(tmp_path, "engine.rebind.test")
    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hosts.append(self.headers.get("Host", ""))
            body = b'{"ApiVersion": "1.41"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], cert, hosts
    server.shutdown()
    server.server_close()


def test_the_requests_adapter_pins_the_address_and_verifies_tls_for_the_name(
    tls_server: tuple[int, Path, list[str]],
) -> None:
    import requests

    port, cert, hosts = tls_server
    resolver = StubResolver("127.0.0.1")
    session = requests.Session()
    session.trust_env = False
    session.mount("https://", GuardedHTTPAdapter(allow_private=True, resolver=resolver))
    url = f"https://engine.rebind.test:{port}/version"
    assert session.get(url, verify=str(cert), timeout=10).json() == {"ApiVersion": "1.41"}
    assert hosts == [f"engine.rebind.test:{port}"]  # the name travels in Host (and SNI/cert check)
    resolver.address = METADATA
    with pytest.raises(RemoteError) as caught:
        session.get(url, verify=str(cert), timeout=10)
    assert caught.value.kind == ErrorKind.FORBIDDEN
    assert len(hosts) == 1  # refused before anything was sent


def test_the_guard_reads_the_same_table_with_the_endpoint_treatment() -> None:
    never = {c.network for c in ADDRESS_CLASSES if c.endpoint == Treatment.NEVER}
    opt_in = {c.network for c in ADDRESS_CLASSES if c.endpoint == Treatment.OPENABLE}
    assert {n for n, _ in ALWAYS_REFUSED} == never
    assert {n for n, _ in PRIVATE_OPT_IN} == opt_in
    assert never
    assert opt_in
    assert not never & opt_in


@pytest.mark.parametrize(
    ("address", "refused", "with_opt_in"),
    [
        ("169.254.169.254", True, True),
        ("::ffff:169.254.169.254", True, True),
        ("64:ff9b::a9fe:a9fe", True, True),
        ("224.0.0.1", True, True),
        ("0.0.0.0", True, True),
        ("127.0.0.1", True, False),
        ("10.0.0.1", True, False),
        ("::ffff:10.0.0.1", True, False),
        ("64:ff9b:1::a00:1", True, False),
        ("203.0.113.7", True, False),  # documentation: not public enough for an endpoint
        ("8.8.8.8", False, False),
    ],
)
def test_the_guard_judges_endpoints_by_the_table(address: str, refused: bool, with_opt_in: bool) -> None:
    assert (address_problem(address, allow_private=False) is not None) is refused
    assert (address_problem(address, allow_private=True) is not None) is with_opt_in
