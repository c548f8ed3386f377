"""Stopping a real `daphne` process ends the plain shells it held and records their close.

The console runs as `daphne console.asgi:application` in a subprocess on a free loopback
port, sharing this test's PostgreSQL database (and Redis, for the channels-redis variant).
Two terminals are open on it: one attached, one whose connection dropped (in its grace
window, with no websocket application left). SIGTERM or SIGINT: Daphne exits, both shells
end, both Terminal rows are closed and audited.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from console.models import AuditEvent
from sandboxes.backends.base import ExecRequest
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import Session, Terminal
from sandboxes.terminal import protocol as terminal_protocol
from tests.personas import World
from tests.support import terminal_support
from tests.support.terminal_support import cookie_for, free_port, new_ticket, wait_closed
from tests.support.tuning import tuning_env

store = terminal_support.store
session = terminal_support.session

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Daphne:
    process: subprocess.Popen[str]
    port: int


def launch_daphne(settings: Any, layer: str, prefix: str, **terminal: object) -> Daphne:
    """Daphne in a child process on a free loopback port, on this test's database and
    installation id, with channel layer `layer` under `prefix`; `terminal` knobs on top."""
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.daphne_settings",
        "DATABASE_URL": f"postgres://{db['USER'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "TEST_CONSOLE_INSTALLATION_ID": settings.CONSOLE_INSTALLATION_ID,
        "TEST_CHANNEL_LAYER": layer,
        "TEST_CHANNEL_LAYER_PREFIX": prefix,
        **tuning_env({f"terminal.{knob}": value for knob, value in terminal.items()}),
    }
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Daphne(process, port)


def wait_listening(server: Daphne) -> None:
    deadline = time.monotonic() + 30
    while True:
        assert server.process.poll() is None, f"daphne exited: {server.process.communicate()[0][-3000:]}"
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=0.2).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "daphne did not listen"
            time.sleep(0.1)


@pytest.fixture
def daphne(request: pytest.FixtureRequest, session: Session, settings: Any) -> Iterator[Daphne]:
    layer = request.param
    if layer == "redis":
        terminal_support.require_service("redis")
    prefix = f"test-daphne-{uuid.uuid4().hex[:8]}"
    server = launch_daphne(
        settings,
        layer,
        prefix,
        reattach_s=120,  # only the shutdown can end the dropped terminal's shell in time
        # Plain shells, which a stopping process ends; shells kept by the sandbox are let go
        # for another process instead (tests/sandboxes/terminal/test_replicas.py).
        keep_shells=False,
    )
    process = server.process
    try:
        wait_listening(server)
        yield server
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate(timeout=30)[0]
        print(output[-5000:])
        if layer == "redis":  # the child's group entries would otherwise live for a day
            import redis

            client = redis.Redis.from_url(terminal_support.REDIS_URL)
            for key in client.scan_iter(match=f"{prefix}*"):
                client.delete(key)
            client.close()


class Websocket:
    """The little of RFC 6455 a test needs: handshake, masked client frames, server frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.data = b""
        self.controls: list[dict[str, Any]] = []
        self.close_code: int | None = None

    @classmethod
    async def connect(cls, port: int, path: str, cookie: bytes) -> Websocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: http://127.0.0.1:{port}\r\n"
                f"Cookie: {cookie.decode()}\r\n\r\n"
            ).encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def send_bytes(self, data: bytes) -> None:
        await self.send_frame(0x2, data)

    async def send_frame(self, opcode: int, data: bytes) -> None:
        mask = os.urandom(4)
        length = len(data)
        header = bytes([0x80 | opcode]) + (
            bytes([0x80 | length]) if length < 126 else bytes([0x80 | 126]) + struct.pack("!H", length)
        )
        self.writer.write(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        await self.writer.drain()

    async def read_frame(self) -> None:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
        payload = await self.reader.readexactly(length)
        opcode = first & 0x0F
        if opcode == 0x2:
            self.data += payload
        elif opcode == 0x1:
            self.controls.append(json.loads(payload))
        elif opcode == 0x8:
            self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
            with contextlib.suppress(ConnectionError):  # the server may be gone already
                await self.send_frame(0x8, payload[:2])  # the closing handshake's answer

    async def until(self, predicate: Any, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.close_code is None, (self.close_code, self.controls)
            await asyncio.wait_for(self.read_frame(), max(deadline - time.monotonic(), 0.01))

    async def read_until_closed(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.close_code is None:
            try:
                await asyncio.wait_for(self.read_frame(), max(deadline - time.monotonic(), 0.01))
            except asyncio.IncompleteReadError:
                return  # the server went away without a close frame


async def open_on(server: Daphne, world: World, session: Session) -> tuple[Websocket, str]:
    grant = await sync_to_async(new_ticket)(world.bob, session)
    path = f"/ws/terminals/{grant['terminal_id']}/?ticket={grant['ticket']}"
    ws = await Websocket.connect(server.port, path, await sync_to_async(cookie_for)(world.bob))
    await ws.until(lambda: any(m.get("state") == "ready" for m in ws.controls))
    return ws, grant["terminal_id"]


def shells_in_sandbox(session: Session, sandbox_id: str) -> int:
    result = get_backend(session.config).exec(sandbox_id, ExecRequest(argv=("ps", "-eo", "args"), timeout_s=30))
    return sum(line.strip() == "bash -l" for line in result.stdout.decode().splitlines())


@pytest.mark.parametrize(
    ("daphne", "stop_signal"),
    [("memory", signal.SIGTERM), ("redis", signal.SIGTERM), ("redis", signal.SIGINT)],
    indirect=["daphne"],
    ids=["memory-SIGTERM", "redis-SIGTERM", "redis-SIGINT"],
)
@pytest.mark.postgres
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_stopping_daphne_ends_its_shells_and_records_their_close(
    world: World, session: Session, daphne: Daphne, stop_signal: signal.Signals
) -> None:
    attached, attached_id = await open_on(daphne, world, session)
    await attached.send_bytes(b"echo up-$((6*7))\n")
    await attached.until(lambda: b"up-42" in attached.data)
    dropped, dropped_id = await open_on(daphne, world, session)
    await dropped.send_bytes(b"echo dropped-$((2*3))\n")
    await dropped.until(lambda: b"dropped-6" in dropped.data)
    dropped.writer.transport.abort()  # no close frame: the terminal waits in its grace window
    opened = await AuditEvent.objects.filter(action="terminal.open", target_id=attached_id).afirst()
    assert opened is not None
    sandbox_id = opened.details["sandbox_id"]
    assert await sync_to_async(shells_in_sandbox)(session, sandbox_id) == 2
    await asyncio.sleep(1)  # the dropped connection's disconnect reaches the server
    assert (await Terminal.objects.aget(pk=dropped_id)).closed is None

    daphne.process.send_signal(stop_signal)
    await attached.read_until_closed()
    assert attached.close_code == terminal_protocol.CLOSE_SERVER_STOPPING
    closed = [m for m in attached.controls if m.get("state") == "closed"]
    assert closed[0]["reason"] == "server shutting down"
    await sync_to_async(daphne.process.wait)(30)

    for terminal_id in (attached_id, dropped_id):
        terminal = await wait_closed(terminal_id, timeout=5)
        assert terminal.close_reason == "server shutting down"
        assert await AuditEvent.objects.filter(action="terminal.close", target_id=terminal_id).aexists()
    assert await sync_to_async(shells_in_sandbox)(session, sandbox_id) == 0
