"""Terminals on any replica: two real `daphne` processes of the console, no sticky routing.

A terminal opened through the first process, its connection dropped, reconnected through the
second: the shell is the same one (kept by the sandbox in a tmux session), `$FOO` survives,
the first frames carry its scrollback, the first process's grace window ends without closing
the terminal that is in use through the second, and the audit log has one open and one
close. Where the sandbox keeps no shell (`terminal.keep_shells=false`, as for a template without
tmux) the second process says the shell was replaced, and still never closes the row under
the new shell.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from console.models import AuditEvent
from sandboxes.models import Session, Terminal
from sandboxes.terminal import protocol as terminal_protocol
from sandboxes.terminal import sweep
from tests.personas import World
from tests.sandboxes.terminal.test_daphne import Daphne, Websocket, launch_daphne, shells_in_sandbox, wait_listening
from tests.support import terminal_support
from tests.support.terminal_support import cookie_for, new_ticket, wait_closed

store = terminal_support.store
session = terminal_support.session

GRACE_S = 5


def start_daphne(settings: Any, prefix: str, keep_shells: bool) -> Daphne:
    server = launch_daphne(
        settings,
        "redis",
        prefix,
        reattach_s=GRACE_S,
        lease_s=3,
        keep_shells=keep_shells,
    )
    wait_listening(server)
    return server


@pytest.fixture
def replicas(request: pytest.FixtureRequest, session: Session, settings: Any) -> Iterator[tuple[Daphne, Daphne]]:
    terminal_support.require_service("redis")
    prefix = f"test-replicas-{uuid.uuid4().hex[:8]}"
    servers = [start_daphne(settings, prefix, request.param != "plain") for _ in range(2)]
    try:
        yield servers[0], servers[1]
    finally:
        for index, server in enumerate(servers):
            if server.process.poll() is None:
                server.process.terminate()
                try:
                    server.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.process.kill()
            print(f"--- daphne {index} ---\n" + server.process.communicate(timeout=30)[0][-4000:])
        import redis

        client = redis.Redis.from_url(terminal_support.REDIS_URL)
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
        client.close()


async def connect(server: Daphne, world: World, session: Session, terminal_id: str | None = None) -> Websocket:
    grant = await sync_to_async(new_ticket)(world.bob, session, terminal_id)
    path = f"/ws/terminals/{grant['terminal_id']}/?ticket={grant['ticket']}"
    ws = await Websocket.connect(server.port, path, await sync_to_async(cookie_for)(world.bob))
    await ws.until(lambda: any(m.get("state") == "ready" for m in ws.controls))
    ws.terminal_id = grant["terminal_id"]  # type: ignore[attr-defined]
    return ws


def ready(ws: Websocket) -> dict[str, Any]:
    return next(m for m in ws.controls if m.get("state") == "ready")


@pytest.mark.parametrize("replicas", ["kept", "plain"], indirect=True)
@pytest.mark.postgres
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_reconnect_through_another_replica_reattaches_the_same_shell(
    world: World, session: Session, replicas: tuple[Daphne, Daphne], request: pytest.FixtureRequest
) -> None:
    kept = request.node.callspec.params["replicas"] == "kept"
    first, second = replicas
    ws = await connect(first, world, session)
    terminal_id = ws.terminal_id  # type: ignore[attr-defined]
    assert ready(ws)["reattached"] is False
    assert ready(ws)["kept"] is kept
    assert "replaced" not in ready(ws)
    await ws.send_bytes(b"export FOO=bar; echo marker-$((100+23))\n")
    await ws.until(lambda: b"marker-123" in ws.data)
    ws.writer.transport.abort()  # a dropped network: no close frame, the first replica's grace starts
    await asyncio.sleep(0.5)

    again = await connect(second, world, session, terminal_id)
    status = ready(again)
    if kept:
        assert status["reattached"] is True, again.controls
        assert "replaced" not in status
        # The scrollback comes first: before anything is typed into the new connection.
        await again.until(lambda: b"marker-123" in again.data)
    else:
        assert status["reattached"] is False
        assert status["replaced"] is True
        assert "shell was replaced" in status["message"]
    await again.send_bytes(b'echo "[$FOO]"\n')
    expected = b"[bar]" if kept else b"[]"
    await again.until(lambda: expected in again.data)

    # The first replica's grace window ends while the terminal is in use through the second.
    await asyncio.sleep(GRACE_S + 3)
    row = await Terminal.objects.aget(pk=terminal_id)
    assert row.closed is None, row.close_reason
    await again.send_bytes(b"echo still-$((2+3))\n")
    await again.until(lambda: b"still-5" in again.data)

    # A second drop, then a reattach through the first replica: still the same terminal.
    again.writer.transport.abort()
    await asyncio.sleep(0.5)
    third = await connect(first, world, session, terminal_id)
    if kept:
        assert ready(third)["reattached"] is True
        await third.send_bytes(b'echo "<$FOO>"\n')
        await third.until(lambda: b"<bar>" in third.data)
    await third.send_frame(0x8, (1000).to_bytes(2, "big"))  # a normal close ends the terminal
    await third.read_until_closed()

    row = await wait_closed(terminal_id)
    assert row.close_reason == "closed by the client"
    opens = [e async for e in AuditEvent.objects.filter(action="terminal.open", target_id=terminal_id)]
    closes = [e async for e in AuditEvent.objects.filter(action="terminal.close", target_id=terminal_id)]
    assert (len(opens), len(closes)) == (1, 1)
    assert row.bytes_in > 0
    assert row.bytes_out > 0
    sandbox_id = opens[0].details["sandbox_id"]
    deadline = time.monotonic() + 15
    while await sync_to_async(shells_in_sandbox)(session, sandbox_id):
        assert time.monotonic() < deadline, "a shell outlived the terminal"
        await asyncio.sleep(0.3)


def tmux_sessions(session: Session, sandbox_id: str) -> list[str]:
    from sandboxes.backends.base import ExecRequest
    from sandboxes.catalog.bridge import get_backend

    script = "tmux -L sandbox-console list-sessions -F '#{session_name}' 2>/dev/null; true"
    result = get_backend(session.config).exec(sandbox_id, ExecRequest(argv=("/bin/sh", "-c", script), timeout_s=30))
    return result.stdout.decode().split()


@pytest.mark.parametrize("replicas", ["kept"], indirect=True)
@pytest.mark.postgres
@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_stopping_replica_lets_kept_shells_go_and_the_sweep_closes_the_abandoned_one(
    world: World, session: Session, replicas: tuple[Daphne, Daphne], settings: Any
) -> None:
    first, second = replicas
    attached = await connect(first, world, session)
    await attached.send_bytes(b"export FOO=kept; echo up-$((6*7))\n")
    await attached.until(lambda: b"up-42" in attached.data)
    dropped = await connect(first, world, session)  # its connection drops: nobody comes back
    await dropped.send_bytes(b"echo dropped-$((2*3))\n")
    await dropped.until(lambda: b"dropped-6" in dropped.data)
    dropped.writer.transport.abort()
    await asyncio.sleep(1)

    first.process.send_signal(signal.SIGTERM)
    await attached.read_until_closed()
    assert attached.close_code == terminal_protocol.CLOSE_SERVER_STOPPING  # the page reconnects on it
    await sync_to_async(first.process.wait)(30)
    for ws in (attached, dropped):
        assert (await Terminal.objects.aget(pk=ws.terminal_id)).closed is None  # type: ignore[attr-defined]

    # The attached one's client reconnects through the other replica: the same shell.
    again = await connect(second, world, session, attached.terminal_id)  # type: ignore[attr-defined]
    assert ready(again)["reattached"] is True
    await again.send_bytes(b'echo "[$FOO]"\n')
    await again.until(lambda: b"[kept]" in again.data)

    # The dropped one is abandoned once its lease (grace window included) runs out.
    opened = await AuditEvent.objects.filter(action="terminal.open", target_id=dropped.terminal_id).afirst()  # type: ignore[attr-defined]
    assert opened is not None
    sandbox_id = opened.details["sandbox_id"]
    names = await sync_to_async(tmux_sessions)(session, sandbox_id)
    assert len(names) == 2, names
    assert await sync_to_async(sweep.close_abandoned)() == 0  # still within its grace window
    deadline = time.monotonic() + GRACE_S + 3 + sweep.MARGIN_S + 10
    while not await sync_to_async(sweep.close_abandoned)():
        assert time.monotonic() < deadline, "the abandoned terminal was not swept"
        await asyncio.sleep(1)
    row = await Terminal.objects.aget(pk=dropped.terminal_id)  # type: ignore[attr-defined]
    assert row.close_reason == sweep.ABANDONED
    assert await AuditEvent.objects.filter(action="terminal.close", target_id=dropped.terminal_id).acount() == 1  # type: ignore[attr-defined]
    assert len(await sync_to_async(tmux_sessions)(session, sandbox_id)) == 1  # the reattached one's
    # The terminal in use through the second replica is not abandoned: its holder renews it.
    assert (await Terminal.objects.aget(pk=attached.terminal_id)).closed is None  # type: ignore[attr-defined]
    await again.send_bytes(b"echo alive-$((1+1))\n")
    await again.until(lambda: b"alive-2" in again.data)
