"""The world of the inbound tests (tests/sandboxes/inbound/test_proxy.py and
test_cross_tenant.py): a real console (Daphne) with INBOUND_BASE_URL
`http://*.localhost:<port>`, three spaces with a session each on real Docker sandboxes that run
the test's own servers (`python3 -m http.server` on 8000, an echo server on 9000, a websocket
echo on 9100), and clients that send every request to 127.0.0.1 (a sandbox host's name only in
the Host header, or mapped to 127.0.0.1 inside Chromium: no name is ever looked up).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.console_process import (
    ADMIN_PASSWORD,
    ADMIN_USER,
    ApiClient,
    Console,
    docker_api,
    free_port,
    remove_docker_leftovers,
)
from tests.support.tuning import tuning_env

MAX_BODY = 3 * 1024 * 1024
ECHO_SERVER = r"""
import hashlib, http.server, json

class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _body(self):
        digest, length = hashlib.sha256(), 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunk = self.rfile.read(size)
                self.rfile.readline()
                digest.update(chunk)
                length += len(chunk)
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                chunk = self.rfile.read(min(left, 65536))
                digest.update(chunk)
                length += len(chunk)
                left -= len(chunk)
        return length, digest.hexdigest()

    def _answer(self, payload, extra=()):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        length, digest = self._body()
        self._answer({"length": length, "sha256": digest, "path": self.path})

    def do_GET(self):
        if self.path.startswith("/big"):
            size = 8 * 1024 * 1024
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("Connection", "close, X-Upstream-Hop")
            self.send_header("X-Upstream-Hop", "1")
            self.end_headers()
            block = bytes(range(256)) * 256
            for _ in range(size // len(block)):
                self.wfile.write(block)
            return
        headers = [[name.lower(), value] for name, value in self.headers.items()]
        extra = [("Set-Cookie", "app=1; Path=/; Domain=example.com"), ("Set-Cookie", "sessionid=stolen; Path=/")]
        self._answer({"path": self.path, "headers": headers}, extra)

http.server.ThreadingHTTPServer(("0.0.0.0", 9000), Echo).serve_forever()
"""

# A websocket echo server of the test's own (stdlib only: the base image has no packages for it).
WS_SERVER = r"""
import base64, hashlib, socket, struct, threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

def serve(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    lines = data.split(b"\r\n\r\n")[0].decode().split("\r\n")
    path = lines[0].split()[1]
    fields = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    accept = base64.b64encode(hashlib.sha1((fields["sec-websocket-key"] + GUID).encode()).digest()).decode()
    answer = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    answer += "Sec-WebSocket-Accept: " + accept + "\r\n\r\n"
    conn.sendall(answer.encode())
    stream = conn.makefile("rb")
    prefix = (path + "|" + fields.get("cookie", "") + "|").encode()
    while True:
        b1, b2 = stream.read(2)
        opcode, size = b1 & 0x0F, b2 & 0x7F
        if size == 126:
            size = struct.unpack(">H", stream.read(2))[0]
        elif size == 127:
            size = struct.unpack(">Q", stream.read(8))[0]
        mask = stream.read(4) if b2 & 0x80 else b"\0\0\0\0"
        payload = bytes(c ^ mask[i % 4] for i, c in enumerate(stream.read(size)))
        if opcode == 8:
            conn.sendall(b"\x88\x02\x03\xe8")
            return
        if opcode in (9, 10):
            continue
        reply = prefix + payload
        length = bytes([len(reply)]) if len(reply) < 126 else bytes([126]) + struct.pack(">H", len(reply))
        conn.sendall(bytes([0x80 | opcode]) + length + reply)

listener = socket.create_server(("0.0.0.0", 9100))
while True:
    connection, _ = listener.accept()
    threading.Thread(target=serve, args=(connection,), daemon=True).start()
"""

_SEED = """
import json
from django.contrib.auth import get_user_model
from console.services import SYSTEM, do_create_space, do_update_network_policy
from sandboxes.api.tokens import do_create_api_token
from sandboxes.catalog.services import do_create_config
from sandboxes.models import PlatformBackend

get_user_model().objects.create_superuser(username={user!r}, password={password!r}, email="")
engine = PlatformBackend.objects.create(name="local engine", kind="docker")
out = {{}}
for name, inbound in (("a", True), ("b", True), ("c", False)):
    space = do_create_space(name="Inbound " + name, slug="inbound-" + name, actor=SYSTEM)
    engine.spaces.add(space)
    do_update_network_policy(space, allow_internet_access=False, allow_out=[], deny_out=[], l7_rules=[],
                             allow_public_traffic=inbound, actor=SYSTEM)
    do_create_config(space, data={{"name": "inbound", "backend": engine, "default_template": {image!r}, "cpus": 1,
                     "memory_mb": 256, "pids_limit": 128, "persistent_workspace": False, "is_default": True}},
                     api_key="", actor=SYSTEM)
    token, raw = do_create_api_token(space, name="inbound", actor=SYSTEM)
    out[name] = {{"space_id": str(space.id), "token": raw}}
print("SEED " + json.dumps(out))
"""

_SET_INBOUND = """
from console.models import Space
from console.services import SYSTEM, do_update_network_policy
space = Space.objects.get(pk={space_id!r})
do_update_network_policy(space, allow_internet_access=False, allow_out=[], deny_out=[], l7_rules=[],
                         allow_public_traffic={on!r}, actor=SYSTEM)
"""


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]


@dataclass
class World:
    console: Console
    spaces: dict[str, dict[str, str]]
    sandboxes: dict[str, str]  # space letter -> sandbox id of its session "web"

    @property
    def port(self) -> int:
        return self.console.web_ports["web"]

    def api(self, letter: str) -> ApiClient:
        space = self.spaces[letter]
        return ApiClient(f"http://127.0.0.1:{self.port}", space["space_id"], space["token"])

    def inbound(self, letter: str, port: int = 8000) -> dict[str, Any]:
        answer = self.api(letter).call("GET", "web", f"inbound?port={port}")
        assert answer.status == 200, answer.body
        return dict(answer.body)

    def request(
        self, path: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: Any = None
    ) -> Reply:
        """`path` on the console's origin, or an absolute URL: then sent to 127.0.0.1 all the
        same, with the URL's host in the Host header (unless `headers` names one)."""
        headers = dict(headers or {})
        if path.startswith("http"):
            parts = urllib.parse.urlsplit(path)
            headers.setdefault("Host", parts.netloc)
            path = url_path(path)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            chunked = body is not None and not isinstance(body, bytes)
            connection.request(method, path, body=body, headers=headers, encode_chunked=chunked)
            answer = connection.getresponse()
            return Reply(answer.status, answer.getheaders(), answer.read())
        finally:
            connection.close()


def url_path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def host_of(url: str) -> str:
    return urllib.parse.urlsplit(url).netloc


LABEL = r"[a-z2-7]{34}"


def browser_args(base: list[str]) -> list[str]:
    """Chromium's arguments, with every sandbox host (`*.localhost`) mapped to 127.0.0.1 in the
    browser itself: no name is ever handed to a resolver."""
    return [*base, "--host-resolver-rules=MAP *.localhost 127.0.0.1"]


def wait_for(check: Any, what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.3)


@contextlib.contextmanager
def made_world(docker_base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The console, its spaces and their sandboxes (a module's fixture: `with made_world(…)`)."""
    workdir = tmp_path_factory.mktemp("inbound-console")
    port = free_port()
    # Inbound URLs on a host per sandbox port under *.localhost, while the console is used at
    # 127.0.0.1 (a request for 127.0.0.1 is the console's own origin, served under CSP sandbox).
    console = Console(
        workdir=workdir / "console",
        installation_id=f"inbound-{uuid.uuid4().hex[:10]}",
        database_url=f"sqlite:///{workdir / 'console' / 'console.sqlite3'}",
        extra_env={
            **tuning_env({"inbound.max_request_bytes": MAX_BODY, "sessions.idle_sweep_interval_s": 3600}),
            "INBOUND_BASE_URL": f"http://*.localhost:{port}",
        },
        web_ports={"web": port},
    )
    spaces: dict[str, dict[str, str]] = {}
    try:
        console.workdir.mkdir(parents=True, exist_ok=True)
        console.manage("migrate", "--noinput")
        out = console.manage(
            "shell", "-c", _SEED.format(user=ADMIN_USER, password=ADMIN_PASSWORD, image=docker_base_image)
        )
        spaces = json.loads(out.split("SEED ", 1)[1].splitlines()[0])
        console.start_web()
        made = World(console, spaces, {})
        for letter in "abc":
            api = made.api(letter)
            resolved = api.resolve("web")
            assert resolved.status == 200, resolved.body
            made.sandboxes[letter] = resolved.body["sandbox_id"]
            wrote = api.shell("web", f"echo hello-inbound-{letter} > /workspace/hello.txt")
            assert wrote.status == 200, wrote.body
            for name, source in (("echo.py", ECHO_SERVER), ("wsecho.py", WS_SERVER)):
                put = api.call("PUT", "web", f"files/content?path={name}", raw=source.encode())
                assert put.status == 201, put.body
            started = api.shell(
                "web",
                "cd /workspace"
                " && (setsid nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null &)"
                " && (setsid nohup python3 echo.py >/dev/null 2>&1 </dev/null &)"
                " && (setsid nohup python3 wsecho.py >/dev/null 2>&1 </dev/null &)",
            )
            assert started.status == 200, started.body
        yield made
    finally:
        console.stop_all()
        remove_docker_leftovers(console.installation_id)
        api = docker_api()
        for space in spaces.values():
            for network in api.networks(filters={"label": f"console.network.space={space['space_id']}"}):
                with contextlib.suppress(Exception):
                    api.remove_network(network["Id"])


def ws_exchange(world: World, path: str, headers: dict[str, str], text: str) -> tuple[int, bytes]:
    """A websocket handshake by hand, one masked text frame, one frame back: (status, payload).
    `path` on the console's origin, or an absolute URL (its host in the Host header)."""
    import base64
    import socket
    import struct

    host = f"127.0.0.1:{world.port}"
    if path.startswith("http"):
        host, path = host_of(path), url_path(path)
    with socket.create_connection(("127.0.0.1", world.port), timeout=20) as sock:
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        stream = sock.makefile("rb")
        status = int(stream.readline().split()[1])
        while stream.readline() not in (b"\r\n", b""):
            pass
        if status != 101:
            return status, b""
        payload = text.encode()
        mask = os.urandom(4)
        masked = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
        sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + masked)
        _first, second = stream.read(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack(">H", stream.read(2))[0]
        return status, stream.read(size)
