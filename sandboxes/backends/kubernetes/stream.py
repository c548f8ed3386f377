"""The `pods/exec` channel protocol, client side: one websocket to the API server, framed in
channels (`ChannelStream`).

The protocol (kubernetes `k8s.io/apimachinery/pkg/util/remotecommand/constants.go`, `.../
httpstream/wsstream/conn.go`): every message is one byte of channel, then data. 0 stdin, 1
stdout, 2 stderr, 3 status (a `metav1.Status` as JSON once the command ended), 4 resize
(`{"Width": cols, "Height": rows}`). `v5.channel.k8s.io` adds channel 255: `[255, c]` closes
channel `c` (EOF on the command's stdin). One handshake offers `v5.channel.k8s.io` and then
`v4.channel.k8s.io`; the server takes the first it knows, so an API server before 1.30 (no
v5) answers v4 and stdin is then ended by the command itself (`exec` reads exactly what it
sends). Nothing older is offered: its status is not JSON and carries no exit code.

The websocket is websocket-client's (it comes with the `kubernetes` client). It dials the
`ApiClient`'s own host, which `client.api_client` checked with the endpoint guard and pinned
to an address (the name kept as the TLS server name); the address is checked again here before
every dial (not the in-cluster one: it comes from the console's own pod). TLS trusts the
configured CA only (`ssl_ca_cert` or `ca_cert_data`), presents a kubeconfig's client
certificate, and sends the bearer token; never through a proxy.

May import: the contract, `guard`, `.client` (errors) and the `kubernetes` client with its
websocket-client.
"""

from __future__ import annotations

import json
import select
import ssl
import threading
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import websocket
from kubernetes import client as k8s

from ..base import ErrorKind, RemoteError
from ..guard import check_endpoint
from .client import remote_error

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
CONNECT_TIMEOUT_S = 30.0


def exec_path(namespace: str, pod: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{pod}/exec"


def exec_query(
    command: Sequence[str], *, container: str | None = None, stdin: bool, tty: bool, stderr: bool = True
) -> list[tuple[str, str]]:
    query = [("command", part) for part in command]
    if container:
        query.append(("container", container))
    query += [
        ("stdin", "true" if stdin else "false"),
        ("stdout", "true"),
        ("stderr", "true" if stderr and not tty else "false"),
        ("tty", "true" if tty else "false"),
    ]
    return query


def exit_code_of(status_text: bytes, what: str) -> int:
    """The command's exit code from the status on channel 3; RemoteError when it did not run."""
    try:
        status = json.loads(status_text)
    except ValueError:
        raise RemoteError(ErrorKind.INTERNAL, f"{what}: the API server sent a status that is not JSON") from None
    if not isinstance(status, dict):
        raise RemoteError(ErrorKind.INTERNAL, f"{what}: the API server sent a status that is not an object")
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                with suppress(TypeError, ValueError):
                    return int(cause.get("message"))
    failure = k8s.ApiException(status=int(status.get("code") or 500), body=json.dumps({**status, "kind": "Status"}))
    raise remote_error(failure, what)


def _handshake_error(exc: websocket.WebSocketBadStatusException, what: str) -> RemoteError:
    """A refused handshake as the API's own errors are translated (`client.remote_error`). An
    empty 403 is how a server refuses the subprotocols offered, or RBAC without a body."""
    body = exc.resp_body.decode(errors="replace") if isinstance(exc.resp_body, bytes) else exc.resp_body
    reason = "no permission for pods/exec, or no exec protocol the console speaks" if not body else None
    return remote_error(k8s.ApiException(status=int(exc.status_code or 0), reason=reason, body=body), what)


def _auth_headers(configuration: Any) -> dict[str, str]:
    """The credentials the client's own requests carry (its `auth_settings`: the bearer token,
    set as `api_key["BearerToken"]` or `["authorization"]`, of settings, kubeconfig or service account)."""
    return {
        str(entry["key"]): str(entry["value"])
        for entry in configuration.auth_settings().values()
        if entry.get("in") == "header" and entry.get("value")
    }


def _tls_context(configuration: Any) -> ssl.SSLContext:
    # A configured CA is the only one trusted (as the REST client's urllib3 does); the
    # system's store only when the cluster names none.
    data = getattr(configuration, "ca_cert_data", None)
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH,
        cafile=configuration.ssl_ca_cert or None,
        cadata=(data if isinstance(data, str) else data.decode()) if data else None,
    )
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    return context


class ChannelStream:
    """One pods/exec websocket. `recv` from one thread; `send` from any (it locks)."""

    def __init__(self, ws: websocket.WebSocket, what: str) -> None:
        self.ws = ws
        self.what = what
        self.protocol: str = getattr(ws, "subprotocol", None) or ""
        self._lock = threading.Lock()
        self.ended = False

    @property
    def closes_channels(self) -> bool:
        return self.protocol == V5

    def send(self, channel: int, data: bytes) -> None:
        try:
            with self._lock:
                self.ws.send_bytes(bytes([channel]) + data)
        except (OSError, websocket.WebSocketException) as exc:
            raise RemoteError(ErrorKind.GONE, f"{self.what}: the exec stream is closed") from exc

    def close_channel(self, channel: int) -> bool:
        """Close one of our channels (v5); False when the protocol cannot say it."""
        if not self.closes_channels:
            return False
        self.send(CLOSE, bytes([channel]))
        return True

    def resize(self, cols: int, rows: int) -> None:
        self.send(RESIZE, json.dumps({"Width": cols, "Height": rows}).encode())

    def recv(self, timeout: float | None) -> tuple[int, bytes] | None:
        """The next (channel, data); None once the server closed the stream; TimeoutError
        when nothing came in time. Empty messages (the server's "stream open") are skipped."""
        sock = self.ws.sock
        while not self.ended:
            if sock is None:
                self.ended = True
                break
            if not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                poller = select.poll()
                poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
                if not poller.poll(None if timeout is None else max(int(timeout * 1000), 0)):
                    raise TimeoutError("no data in time")
            try:
                opcode, frame = self.ws.recv_data_frame(True)
            except (OSError, websocket.WebSocketException):
                self.ended = True
                break
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                self.ended = True
                break
            if opcode not in (websocket.ABNF.OPCODE_BINARY, websocket.ABNF.OPCODE_TEXT):
                continue  # ping (answered by the library) and pong
            data = bytes(frame.data)
            if len(data) > 1:
                return data[0], data[1:]
        return None

    def fileno(self) -> int | None:
        sock = self.ws.sock
        return sock.fileno() if sock is not None else None

    def close(self) -> None:
        """Say goodbye and drop the connection, without reading: another thread may be in `recv`."""
        self.ended = True
        # A send blocked on a full socket holds the lock: then the connection just drops.
        if self._lock.acquire(timeout=1):
            try:
                with suppress(OSError, websocket.WebSocketException):
                    self.ws.send_close()
            finally:
                self._lock.release()
        with suppress(OSError, websocket.WebSocketException):
            self.ws.shutdown()


def open_stream(
    configuration: Any,
    path: str,
    query: Sequence[tuple[str, str]],
    *,
    allow_private: bool,
    what: str,
    headers: Mapping[str, str] | None = None,
    guarded: bool = True,
) -> ChannelStream:
    """Dial `path` on the API server of `configuration` (a `kubernetes.client.Configuration`).

    `guarded`: check the address first (an admin gave it); False for the in-cluster address,
    which comes from the console's own pod."""
    host = configuration.host.rstrip("/")
    parts = urlsplit(host)
    if parts.scheme not in ("https", "http"):
        raise RemoteError(ErrorKind.INVALID, f"{what}: the API server URL must be https or http")
    if guarded:
        check_endpoint(host, allow_private=allow_private)
    scheme = "wss" if parts.scheme == "https" else "ws"
    url = urlunsplit((scheme, parts.netloc, parts.path + path, urlencode(list(query)), ""))
    header = [f"{name}: {value}" for name, value in {**(headers or {}), **_auth_headers(configuration)}.items()]
    sslopt: dict[str, Any] = {}
    if scheme == "wss":
        try:
            sslopt["context"] = _tls_context(configuration)
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise RemoteError(
                ErrorKind.INVALID, f"{what}: the cluster's CA or client certificate is unusable ({exc})"
            ) from None
        server_name = getattr(configuration, "tls_server_name", None)
        if server_name:
            sslopt["server_hostname"] = server_name
    ws = websocket.WebSocket(sslopt=sslopt, skip_utf8_validation=True, enable_multithread=True)
    try:
        ws.connect(
            url,
            header=header,
            subprotocols=list(PROTOCOLS),
            timeout=CONNECT_TIMEOUT_S,
            http_no_proxy=["*"],
            suppress_origin=True,
        )
    except websocket.WebSocketBadStatusException as exc:
        raise _handshake_error(exc, what) from None
    except ssl.SSLError as exc:
        raise RemoteError(
            ErrorKind.UNAVAILABLE, f"{what}: TLS with the API server failed ({exc}); check its CA", retryable=False
        ) from None
    except TimeoutError as exc:
        raise RemoteError(ErrorKind.TIMEOUT, f"{what}: the API server did not answer in time ({exc})") from None
    except (OSError, websocket.WebSocketException) as exc:
        raise RemoteError(ErrorKind.UNAVAILABLE, f"{what}: the API server did not answer ({exc})") from None
    if ws.sock is not None:
        ws.sock.settimeout(None)  # reads wait with poll(); a timeout would also cut sends
    stream = ChannelStream(ws, what)
    if stream.protocol not in PROTOCOLS:
        stream.close()
        raise RemoteError(ErrorKind.UNSUPPORTED, f"{what}: the API server speaks no exec protocol the console knows")
    return stream
