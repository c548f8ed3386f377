"""A TLS front for the Docker engine on loopback, requiring a client certificate.

Plays a remote `tcp://` Docker host with TLS client authentication: a test CA signs the
server certificate (for 127.0.0.1) and one client certificate; connections that complete
the handshake are piped to the local engine socket. Standard library plus `cryptography`.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DOCKER_SOCKET = "/var/run/docker.sock"


@dataclass(frozen=True)
class Pem:
    cert: str
    key: str


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _issue(
    name: str, issuer_key: ec.EllipticCurvePrivateKey | None, issuer: x509.Name | None, *, ca: bool, server: bool
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer or subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256()), key


@dataclass
class TlsEngine:
    ca_pem: str
    client: Pem
    port: int = 0
    handshakes_refused: int = 0
    _sock: socket.socket | None = None
    _dir: tempfile.TemporaryDirectory[str] | None = None
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @classmethod
    def start(cls) -> TlsEngine:
        ca_cert, ca_key = _issue("test docker CA", None, None, ca=True, server=False)
        server_cert, server_key = _issue("127.0.0.1", ca_key, ca_cert.subject, ca=False, server=True)
        client_cert, client_key = _issue("console", ca_key, ca_cert.subject, ca=False, server=False)
        pem = lambda cert: cert.public_bytes(serialization.Encoding.PEM).decode()  # noqa: E731
        engine = cls(ca_pem=pem(ca_cert), client=Pem(pem(client_cert), _key_pem(client_key)))
        engine._dir = tempfile.TemporaryDirectory(prefix="tls-engine-")
        folder = Path(engine._dir.name)
        (folder / "server.pem").write_text(pem(server_cert))
        (folder / "server.key").write_text(_key_pem(server_key))
        (folder / "ca.pem").write_text(engine.ca_pem)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "server.pem", folder / "server.key")
        context.load_verify_locations(folder / "ca.pem")
        context.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no engine
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        engine.port = listener.getsockname()[1]
        engine._sock = listener
        thread = threading.Thread(target=engine._serve, args=(listener, context), daemon=True)
        thread.start()
        return engine

    def _serve(self, listener: socket.socket, context: ssl.SSLContext) -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                conn = context.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                self.handshakes_refused += 1
                raw.close()
                continue
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(DOCKER_SOCKET)
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        if self._dir is not None:
            self._dir.cleanup()
