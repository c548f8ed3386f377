"""The pods/exec channel client's connection (`stream.open_stream`): whom its TLS trusts."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from kubernetes import client as k8s

from sandboxes.backends.base import ErrorKind, RemoteError
from sandboxes.backends.kubernetes.stream import exec_path, exec_query, open_stream
from tests.fakes.kube import certs


@pytest.fixture
def tls_server() -> Iterator[tuple[str, certs.Certificates]]:
    """A loopback TLS server (its own CA) that completes handshakes and then hangs up."""
    made = certs.generate()
    context = made.server_context()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)

    def serve() -> None:
        with suppress(OSError):
            conn, _ = listener.accept()
            with suppress(OSError, ssl.SSLError), context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}", made
    listener.close()
    thread.join(timeout=10)


def test_only_the_configured_ca_is_trusted_not_the_systems(
    tls_server: tuple[str, certs.Certificates], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose certificate the system's trust store vouches for, but not the cluster's
    CA, is refused: the exec stream trusts what the REST client trusts."""
    url, server = tls_server
    system_store = tmp_path / "system-ca.pem"
    system_store.write_text(server.ca_pem)
    monkeypatch.setenv("SSL_CERT_FILE", str(system_store))
    configuration = k8s.Configuration()
    configuration.host = url
    configuration.ca_cert_data = certs.generate().ca_pem  # the cluster's CA: another one
    with pytest.raises(RemoteError) as caught:
        open_stream(
            configuration,
            exec_path("default", "p"),
            exec_query(["true"], stdin=False, tty=False),
            allow_private=True,
            what="exec",
        )
    assert caught.value.kind == ErrorKind.UNAVAILABLE
    assert "TLS with the API server failed" in caught.value.message
