"""The engine's HTTP API spoken directly on its unix socket, for the three calls of every exec.

docker-py sends each call through requests and urllib3 and parses the answer's headers with
the email package: about 0.4 ms of CPU a call, three calls an exec, as much again as the rest
of the exec's own work in the console (bench/api_exec.py counts it against the API). Here
HTTP/1.1 connections to the socket are kept (at most KEPT, idle, each used by one call at a
time) for creating and inspecting execs, and a start opens a connection of its own, which the
engine turns into the command's stream.

Only for an engine on this host's unix socket; any other endpoint (tcp, ssh, TLS) keeps
docker-py. Failures are raised for `_engine_call` to say as it says docker-py's: an answer
as `EngineAnswer` (status and the engine's message), the socket's as ConnectionError or
TimeoutError.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import threading
from typing import Any
from urllib.parse import quote

from ..base import ErrorKind, RemoteError
from .common import EngineAnswer

# Idle connections kept for creates and inspects (a request thread takes one per call).
KEPT = 8
# The most of an answer's head read on a start's own connection before the stream begins.
_MAX_HEAD = 64 * 1024


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = _open(self.path, self.timeout)


def _open(path: str, timeout: float | None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


class UnixWire:
    """Exec create, start and inspect on the engine at unix socket `path`, API `version`."""

    def __init__(self, path: str, version: str, timeout: float) -> None:
        self.path, self.version, self.timeout = path, version, timeout
        self._idle: list[_UnixConnection] = []
        self._lock = threading.Lock()

    def exec_create(self, container_id: str, body: dict[str, Any]) -> str:
        answer = self._call("POST", f"/containers/{quote(container_id, safe='')}/exec", body)
        return str(answer["Id"])

    def exec_inspect(self, exec_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/exec/{quote(exec_id, safe='')}/json", None))

    def exec_start(self, exec_id: str) -> tuple[socket.socket, bytes]:
        """The exec's stream: the socket the engine hijacked, and what of the stream came with
        the answer's head."""
        body = json.dumps({"Detach": False, "Tty": False}).encode()
        head = (
            f"POST /v{self.version}/exec/{quote(exec_id, safe='')}/start HTTP/1.1\r\nHost: docker\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        ).encode()
        sock = _open(self.path, self.timeout)
        try:
            sock.sendall(head + body)
            received = b""
            while b"\r\n\r\n" not in received:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionResetError("the Docker engine closed the connection before answering")
                received += chunk
                if len(received) > _MAX_HEAD:
                    raise RemoteError(ErrorKind.INTERNAL, "the Docker engine's answer has no end of its head")
            head_bytes, _, rest = received.partition(b"\r\n\r\n")
            status = _status(head_bytes)
            if status not in (101, 200):
                raise _failure(status, _error_body(received, sock))
            sock.settimeout(None)
            return sock, rest
        except BaseException:
            sock.close()
            raise

    def container_inspect(self, container: str, *, timeout: float | None = None) -> dict[str, Any]:
        """`GET /containers/{id}/json`: the container's attributes."""
        return dict(self.begin_container_inspect(container, timeout=timeout).answer())

    def begin_container_inspect(self, container: str, *, timeout: float | None = None) -> Pending:
        """The same inspect, sent now and read by `answer()` (the engine answers meanwhile)."""
        return self._begin("GET", f"/containers/{quote(container, safe='')}/json", None, timeout)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        return self._begin(method, path, body, None).answer()

    def _begin(self, method: str, path: str, body: dict[str, Any] | None, timeout: float | None) -> Pending:
        payload = None if body is None else json.dumps({k: v for k, v in body.items() if v is not None})
        pending = Pending(
            self, method, f"/v{self.version}{path}", payload, self.timeout if timeout is None else timeout
        )
        pending.send()
        return pending

    def _take(self) -> tuple[_UnixConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return _UnixConnection(self.path, self.timeout), False

    def _give_back(self, connection: _UnixConnection, response: http.client.HTTPResponse) -> None:
        if response.will_close:
            connection.close()
            return
        with self._lock:
            if len(self._idle) < KEPT:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class Pending:
    """One call on a kept connection, sent and not yet read: `answer()` reads it (once), `drop()`
    gives it up (the connection is closed: an unread answer must never reach the next call).
    A kept connection the engine closed meanwhile (a restart) is found at either step: so did it
    every other one kept then. Those go, and the call goes once more, on a new connection."""

    def __init__(self, wire: UnixWire, method: str, url: str, payload: str | None, timeout: float | None) -> None:
        self.wire, self.method, self.url, self.payload, self.timeout = wire, method, url, payload, timeout
        self._connection: _UnixConnection | None = None
        self._reused = False

    def send(self) -> None:
        connection, self._reused = self.wire._take()
        self._connection = connection
        headers = {"Content-Type": "application/json"} if self.payload is not None else {}
        try:
            if connection.sock is not None:
                connection.sock.settimeout(self.timeout)
            else:
                connection.timeout = self.timeout
            connection.request(self.method, self.url, self.payload, headers)
        except (BrokenPipeError, ConnectionResetError):
            self.drop()
            if not self._reused:
                raise
            self._again()
        except BaseException:
            self.drop()
            raise

    def _again(self) -> None:
        self.wire.close()
        self.send()  # on a new connection now: its failure is raised
        self._reused = False

    def answer(self) -> Any:
        connection = self._connection
        if connection is None:
            raise RuntimeError("this call's answer was read or dropped already")
        try:
            response = connection.getresponse()
            data = response.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.drop()
            if not self._reused:
                raise
            self._again()
            return self.answer()
        except BaseException:
            self.drop()
            raise
        self._connection = None
        self.wire._give_back(connection, response)
        if response.status >= 400:
            raise _failure(response.status, data)
        return json.loads(data) if data else {}

    def drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


def _status(head: bytes) -> int:
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise RemoteError(ErrorKind.INTERNAL, "the Docker engine's answer is not HTTP") from None


def _error_body(received: bytes, sock: socket.socket) -> bytes:
    """The body of an error answer on a start's connection, as its head frames it (a length,
    chunks, or up to the connection's end), at most _MAX_HEAD bytes; what came of it so far
    when the engine closes first."""
    response = http.client.HTTPResponse(_Replay(received, sock))  # type: ignore[arg-type]
    response.begin()
    try:
        return response.read(_MAX_HEAD)
    except http.client.IncompleteRead as exc:
        return exc.partial


class _Replay(io.RawIOBase):
    """A start's socket read as http.client reads an answer: what was received first."""

    def __init__(self, received: bytes, sock: socket.socket) -> None:
        self.received, self.sock = received, sock

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self.received:
            return self.sock.recv_into(buffer)
        size = min(len(buffer), len(self.received))
        buffer[:size], self.received = self.received[:size], self.received[size:]
        return size


def _failure(status: int, data: bytes) -> EngineAnswer:
    try:
        message = str(json.loads(data).get("message") or "")
    except (ValueError, AttributeError):
        message = data.decode(errors="replace").strip()[:300]
    return EngineAnswer(status, message or http.client.responses.get(status, str(status)))
