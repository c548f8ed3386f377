"""Fixtures and helpers of the web terminal tests (consumer, revocation, Daphne).

Websocket tests go through `console.asgi.application` (origin validator, session auth, URL
router) with `channels.testing.WebsocketCommunicator`, logged in with a real session cookie.
`layer` runs a test on each channel layer: the in-memory one and channels-redis, configured
exactly as production configures it (`console.settings.base.redis_channel_layer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import reverse

from console.settings.base import redis_channel_layer
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig, Session, Terminal
from sandboxes.sessions import store_select as binding
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import MemorySessionStore
from sandboxes.terminal import process as terminal_process
from tests.conftest import IN_CI, REDIS_URL, require_service
from tests.personas import World
from tests.support.tuning import Tuned

ORIGIN = (b"origin", b"http://localhost")
LAYERS = ["memory", "redis"]


@pytest.fixture(params=LAYERS)
def layer(request: pytest.FixtureRequest, settings: Any) -> str:
    """The channel layer the consumers run on; channels-redis under a prefix of its own."""
    if request.param == "redis":
        require_service("redis")
        prefix = f"test-term-{uuid.uuid4().hex[:8]}"
        settings.CHANNEL_LAYERS = {"default": redis_channel_layer(REDIS_URL, prefix=prefix)}
    else:
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return str(request.param)


@pytest.fixture
def store() -> Iterator[MemorySessionStore]:
    """The consumer resolves sessions through the process's store: a fresh one per test."""
    previous = binding._store
    fresh = MemorySessionStore()
    binding.set_store(fresh)
    try:
        yield fresh
    finally:
        binding.set_store(previous)


@pytest.fixture
def session(world: World, session_config: SandboxConfig, store: MemorySessionStore) -> Session:
    return get_or_create_session(world.space_a, f"term-{time.monotonic_ns()}")


@pytest.fixture
def fast_terminals(tuned: Tuned, settings: Any) -> Any:
    tuned({"terminal.reattach_s": 10})
    tuned({"terminal.idle_timeout_s": 600})
    return settings


@pytest_asyncio.fixture
async def cleanup(layer: str) -> AsyncIterator[None]:
    yield
    await terminal_process.close_all("test finished")
    channel_layer = get_channel_layer()
    if layer == "redis" and channel_layer is not None:
        with contextlib.suppress(Exception):
            await channel_layer.flush()
            await channel_layer.close_pools()


def cookie_for(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def new_ticket(user: Any, session: Session, terminal_id: str | None = None) -> dict[str, Any]:
    client = Client()
    client.force_login(user)
    data = {"terminal_id": terminal_id} if terminal_id else {}
    response = client.post(reverse("sandboxes:terminal_create", kwargs={"session_id": session.id}), data)
    assert response.status_code in (200, 201), response.content
    return dict(response.json())


def communicator(
    terminal_id: str, ticket: str | None, cookie: bytes | None, origin: tuple[bytes, bytes] = ORIGIN
) -> Any:
    from console.asgi import application

    path = f"/ws/terminals/{terminal_id}/" + (f"?ticket={ticket}" if ticket is not None else "")
    headers = [origin, (b"host", b"localhost")] + ([(b"cookie", cookie)] if cookie else [])
    return WebsocketCommunicator(application, path, headers=headers)


class Screen:
    """Everything a connection received: PTY bytes and control messages, in order."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.data = b""
        self.controls: list[dict[str, Any]] = []
        self.closed_code: int | None = None

    async def pump(self, timeout: float = 0.2) -> bool:
        # receive_output() cancels the application on a timeout: wait with receive_nothing().
        if await self.comm.receive_nothing(timeout, interval=0.01):
            return False
        message = await self.comm.receive_output(5)
        if message["type"] == "websocket.close":
            self.closed_code = message.get("code", 1000)
        elif message.get("bytes") is not None:
            self.data += message["bytes"]
        elif message.get("text") is not None:
            self.controls.append(json.loads(message["text"]))
        return True

    async def until(self, predicate: Any, timeout: float = 20, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.closed_code is not None:
                raise AssertionError(f"timed out waiting for {what}: {self.data[-300:]!r} {self.controls[-5:]}")
            await self.pump()

    async def until_output(self, needle: bytes, timeout: float = 20) -> None:
        await self.until(lambda: needle in self.data, timeout, repr(needle))

    async def until_control(self, **fields: Any) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for message in self.controls:
                if all(message.get(k) == v for k, v in fields.items()):
                    return message
            return None

        await self.until(lambda: found() is not None, what=str(fields))
        message = found()
        assert message is not None
        return message

    async def run(self, line: str) -> None:
        await self.comm.send_to(bytes_data=line.encode())


async def open_terminal(user: Any, session: Session) -> tuple[Any, Screen, str]:
    grant = await sync_to_async(new_ticket)(user, session)
    comm = communicator(grant["terminal_id"], grant["ticket"], await sync_to_async(cookie_for)(user))
    connected, code = await comm.connect(timeout=10)
    assert connected, code
    screen = Screen(comm)
    await screen.until_control(type="status", state="ready")
    return comm, screen, grant["terminal_id"]


def shells_in(session: Session) -> list[str]:
    session.refresh_from_db()
    result = Runtime().exec(session, ExecRequest(argv=("ps", "-eo", "args"), timeout_s=30))
    return [line for line in result.stdout.decode().splitlines() if line.strip() == "bash -l"]


async def wait_no_shell(session: Session, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while await sync_to_async(shells_in)(session):
        assert time.monotonic() < deadline, "the shell is still running"
        await asyncio.sleep(0.2)


async def wait_closed(terminal_id: str, timeout: float = 15) -> Terminal:
    """The row once its close is recorded (after the shell was ended)."""
    deadline = time.monotonic() + timeout
    while True:
        terminal = await Terminal.objects.aget(pk=terminal_id)
        if terminal.closed is not None:
            return terminal
        assert time.monotonic() < deadline, "the close was not recorded"
        await asyncio.sleep(0.1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server of the test's own on a free loopback port (a fault test kills it, never
    the shared one). No persistence: a restart comes back empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    if not shutil.which("redis-server") and not os.path.exists("/usr/bin/redis-server"):
        if IN_CI:
            pytest.fail("[CI] the redis-server binary is missing", pytrace=False)
        pytest.skip("needs the redis-server binary")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
