"""A Unix-socket proxy in front of the Docker engine that a test can kill in the middle of a call.

The shared dockerd must keep running for the other tests, so "the engine stopped mid-call" is
played by this proxy: a backend pointed at `proxy.endpoint` talks to the real engine until the
proxy dies, at which point the listener and every open connection close at once, exactly what
a client sees when the engine goes away. `cut` breaks the open connections only, as a network
blip would while the engine stays up.

Tests synchronise on what the proxy sees, never on sleeps: `arm` makes the proxy die the
moment the engine's answer to a given request (optionally: the part of it carrying a marker,
such as a line a command prints) arrives, so the engine has acted but the client never hears
of it; `requests` lists what the engine was asked. Standard library only; one thread per
direction of each connection.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from dataclasses import dataclass, field

DOCKER_SOCKET = "/var/run/docker.sock"

# docker-py writes each request head in one send and waits for the answer before the next
# request on that connection, so a request line never straddles two reads.
_REQUEST_LINE = re.compile(rb"^(GET|HEAD|POST|PUT|DELETE) (\S+) HTTP/1\.[01]\r$", re.MULTILINE)


@dataclass
class _Link:
    """One client connection and its connection to the engine."""

    client: socket.socket
    upstream: socket.socket
    request: str = ""  # "METHOD /path" of the request the engine is answering
    open_halves: int = 2
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class _Tripwire:
    request: re.Pattern[str]
    marker: bytes
    keep_listening: bool


class EngineProxy:
    """Forwards `path` to the engine's socket until killed; can be started again on the same path."""

    def __init__(self, path: str, upstream: str = DOCKER_SOCKET) -> None:
        self.path = path
        self.upstream = upstream
        self.killed = threading.Event()
        self.was_cut = threading.Event()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._seen: list[str] = []
        self._tripwire: _Tripwire | None = None
        self._hold: re.Pattern[str] | None = None
        self._released = threading.Event()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        """The docker-py base_url of the proxy."""
        return f"unix://{self.path}"

    # Life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        with self._lock:
            self._listener = listener
            self._seen.clear()
            self._tripwire = None
            self.killed.clear()
            self.was_cut.clear()
        threading.Thread(target=self._accept, args=(listener,), name="engine-proxy", daemon=True).start()

    def kill(self) -> None:
        """Die like an engine that stopped: listener and socket file gone, every open connection cut."""
        with self._lock:
            listener, self._listener = self._listener, None
            self.killed.set()
        if listener is not None:
            # shutdown() wakes the thread blocked in accept(); close() alone does not.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self.cut()

    def cut(self) -> None:
        """Cut every open connection but keep listening: a network blip, the engine still up."""
        with self._lock:
            doomed, self._sockets = self._sockets, set()
            self.was_cut.set()
        for sock in doomed:
            _close(sock)

    # Synchronisation ----------------------------------------------------------------------

    def arm(self, request: str, *, marker: bytes = b"", keep_listening: bool = False) -> None:
        """Die (or only cut the connections, with keep_listening) when the engine answers a
        request matching `request` (a regex over "METHOD /path"), at the first chunk of the
        answer containing `marker`; that chunk is never forwarded."""
        with self._lock:
            self._tripwire = _Tripwire(re.compile(request), marker, keep_listening)

    def hold(self, request: str) -> None:
        """Keep requests matching `request` (a regex over "METHOD /path") from the engine until
        `release()`: the call is under way, the engine has not acted yet. Others pass."""
        with self._lock:
            self._hold = re.compile(request)
            self._released.clear()

    def release(self) -> None:
        with self._lock:
            self._hold = None
        self._released.set()

    def requests(self, pattern: str) -> list[str]:
        """The requests ("METHOD /path") seen since start() that match `pattern`."""
        with self._lock:
            return [r for r in self._seen if re.search(pattern, r)]

    # Forwarding --------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # killed
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.upstream)
            except OSError:
                _close(client)
                _close(upstream)
                continue
            if not self._track(client, upstream):
                return
            link = _Link(client, upstream)
            threading.Thread(target=self._to_engine, args=(link,), daemon=True).start()
            threading.Thread(target=self._to_client, args=(link,), daemon=True).start()

    def _track(self, *socks: socket.socket) -> bool:
        with self._lock:
            if self.killed.is_set():
                for sock in socks:
                    _close(sock)
                return False
            self._sockets.update(socks)
            return True

    def _to_engine(self, link: _Link) -> None:
        while data := _recv(link.client):
            if self.killed.is_set():
                # kill() cuts the open connections one by one; a request sent meanwhile on
                # one not yet cut must not reach the engine (nor get half an answer back).
                _close(link.client)
                break
            for match in _REQUEST_LINE.finditer(data):
                self._saw(link, f"{match[1].decode()} {match[2].decode()}")
            with self._lock:
                held = self._hold is not None and bool(self._hold.search(link.request))
            if held:
                self._released.wait(timeout=60)
            if not _send(link.upstream, data):
                break
        # Pass the client's half-close on: an exec's stdin ends with shutdown(SHUT_WR).
        self._half_close(link, link.upstream)

    def _to_client(self, link: _Link) -> None:
        while data := _recv(link.upstream):
            wire = self._tripped_by(link, data)
            if wire is not None:
                if wire.keep_listening:
                    self.cut()
                else:
                    self.kill()
                return
            if not _send(link.client, data):
                break
        self._half_close(link, link.client)

    def _saw(self, link: _Link, request: str) -> None:
        # Recorded before the bytes go on, so the answer always finds its request here.
        link.request = request
        with self._lock:
            self._seen.append(request)

    def _tripped_by(self, link: _Link, data: bytes) -> _Tripwire | None:
        with self._lock:
            wire = self._tripwire
            if wire is None or not wire.request.search(link.request) or wire.marker not in data:
                return None
            self._tripwire = None  # fires once
            return wire

    def _half_close(self, link: _Link, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)
        with link.lock:
            link.open_halves -= 1
            done = link.open_halves == 0
        if done:
            with self._lock:
                self._sockets.difference_update((link.client, link.upstream))
            _close(link.client)
            _close(link.upstream)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _send(sock: socket.socket, data: bytes) -> bool:
    try:
        sock.sendall(data)
    except OSError:
        return False
    return True


def _close(sock: socket.socket) -> None:
    # shutdown() first: it wakes a thread blocked in recv() on this socket, close() does not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
