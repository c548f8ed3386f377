"""The web terminal when the sandbox behind it goes away: removed on the engine behind the
console's back, replaced by a rebuild, or deleted with its session. The websocket closes
promptly and says why; the shell's PTY, threads and row are not left behind. A shell that
exits in a sandbox still running is told apart from them.

On a real Docker sandbox, through the real ASGI stack (tests/support/terminal_support.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import docker
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from console.services import SYSTEM
from sandboxes.models import Session, Terminal
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.teardown import delete_session
from sandboxes.terminal import process as terminal_process
from sandboxes.terminal import protocol as terminal_protocol
from tests.personas import World
from tests.support import terminal_support
from tests.support.terminal_support import Screen, open_terminal, wait_closed
from tests.support.tuning import Tuned

# The shared fixtures (pytest finds them as attributes of this module).
layer = terminal_support.layer
store = terminal_support.store
session = terminal_support.session
fast_terminals = terminal_support.fast_terminals
cleanup = terminal_support.cleanup

# On a real sandbox, on one channel layer (the layer carries nothing of these closes).
pytestmark = [
    pytest.mark.parametrize("layer", ["memory"], indirect=True),
    pytest.mark.docker,
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fast_terminals", "cleanup"),
]

# A correctness bound (the close follows the sandbox's end, not a timer), kept generous.
CLOSE_WITHIN_S = 3.0


def remove_on_the_engine(session: Session) -> None:
    docker.from_env(timeout=30).containers.get(session.sandbox_id).remove(force=True)


def rebuild(session: Session) -> None:
    Runtime().rebuild(Session.objects.get(pk=session.pk), actor=SYSTEM)


def delete(session: Session) -> None:
    delete_session(Session.objects.get(pk=session.pk), actor=SYSTEM)


GOING: dict[str, tuple[Callable[[Session], None], int, str]] = {
    "removed on the engine": (remove_on_the_engine, terminal_protocol.CLOSE_NORMAL, "the sandbox is gone"),
    "rebuilt": (rebuild, terminal_protocol.CLOSE_NORMAL, "the sandbox is gone"),
    "session deleted": (delete, terminal_protocol.CLOSE_SESSION_DELETED, "the session was deleted"),
}


async def open_a_working_shell(tuned: Tuned, world: World, session: Session, keep: bool) -> tuple[Any, Screen, str]:
    tuned({"terminal.keep_shells": keep})
    comm, screen, tid = await open_terminal(world.bob, session)
    await screen.run("echo up-$((2+3))\n")
    await screen.until_output(b"up-5")
    return comm, screen, tid


def in_own_thread(work: Callable[[Session], None], session: Session) -> None:
    """Off the thread the consumer's database work runs in (a rebuild there would hold it up)."""
    try:
        work(session)
    finally:
        connections.close_all()


@pytest.mark.parametrize(
    ("how", "keep"),
    [("removed on the engine", True), ("removed on the engine", False), ("rebuilt", True), ("session deleted", True)],
)
async def test_the_terminal_closes_promptly_and_says_why_when_its_sandbox_goes(
    tuned: Tuned, world: World, session: Session, how: str, keep: bool
) -> None:
    """The PTY's end is the sandbox's: the websocket closes within a moment of it with the
    reason, and the terminal's close is recorded, its PTY owner and input thread gone."""
    work, code, reason = GOING[how]
    comm, screen, tid = await open_a_working_shell(tuned, world, session, keep)
    await screen.run("cat > /dev/null\n")  # a pasted line queues input: the input thread runs
    await comm.send_to(bytes_data=b"x" * 4096 + b"\n")
    await sync_to_async(session.refresh_from_db)()
    started = time.monotonic()
    going = asyncio.ensure_future(sync_to_async(in_own_thread, thread_sensitive=False)(work, session))
    await screen.until(lambda: screen.closed_code is not None, timeout=30, what="the close")
    took = time.monotonic() - started
    await going
    closed = [m for m in screen.controls if m.get("state") == "closed"]
    assert (screen.closed_code, [m["reason"] for m in closed]) == (code, [reason])
    assert took < CLOSE_WITHIN_S, f"the websocket closed {took:.1f} s after the sandbox went"
    if how != "session deleted":  # the row went with the session
        assert (await wait_closed(tid)).close_reason == reason
    assert terminal_process.get_process(tid) is None
    deadline = time.monotonic() + 5
    while any(t.name.startswith(f"terminal-input-{tid[:8]}") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the terminal's input thread outlived it"
        await asyncio.sleep(0.1)
    await comm.disconnect()


@pytest.mark.parametrize("keep", [True, False])
async def test_a_shell_that_exits_in_a_running_sandbox_says_so(
    tuned: Tuned, world: World, session: Session, keep: bool
) -> None:
    """The sandbox runs on: the terminal says the shell exited, not that the sandbox went."""
    comm, screen, tid = await open_a_working_shell(tuned, world, session, keep)
    await screen.run("exit\n")
    await screen.until(lambda: screen.closed_code is not None, timeout=30, what="the close")
    closed = [m for m in screen.controls if m.get("state") == "closed"]
    assert (screen.closed_code, [m["reason"] for m in closed]) == (terminal_protocol.CLOSE_NORMAL, ["the shell exited"])
    assert (await wait_closed(tid)).close_reason == "the shell exited"
    await comm.disconnect()


@pytest.mark.parametrize("keep", [True, False])
async def test_a_session_deleted_as_its_shell_exits_is_said_deleted_not_gone(
    tuned: Tuned, world: World, session: Session, keep: bool
) -> None:
    """A DELETE that comes as the shell exits by itself, while the terminal is telling why:
    the sandbox found going then is the DELETE's, so the terminal says the session was
    deleted (or, when the shell's end was told before the DELETE began, that the shell
    exited), never that the sandbox is gone."""
    comm, screen, tid = await open_a_working_shell(tuned, world, session, keep)
    await sync_to_async(session.refresh_from_db)()
    await screen.run("exit\n")
    await screen.until_output(b"logout")
    going = asyncio.ensure_future(sync_to_async(in_own_thread, thread_sensitive=False)(delete, session))
    await screen.until(lambda: screen.closed_code is not None, timeout=30, what="the close")
    await going
    told = (screen.closed_code, [m["reason"] for m in screen.controls if m.get("state") == "closed"])
    assert told in (
        (terminal_protocol.CLOSE_SESSION_DELETED, ["the session was deleted"]),
        (terminal_protocol.CLOSE_NORMAL, ["the shell exited"]),
    )
    assert not await Session.objects.filter(pk=session.pk).aexists()
    assert not await Terminal.objects.filter(pk=tid).aexists()  # went with the session
    await comm.disconnect()


# Takes every process slot the sandbox has (its pids limit) with threads, says so, and holds them.
HOLD_EVERY_PROCESS_SLOT = (
    "import threading, time\n"
    "n = 0\n"
    "while True:\n"
    "    try:\n"
    "        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
    "    except RuntimeError:\n"
    "        break\n"
    "    n += 1\n"
    "print('slots-' + 'taken', n, flush=True)\n"
    "time.sleep(3600)\n"
)


async def test_a_shell_that_exits_in_a_sandbox_that_can_start_nothing_says_it_exited(
    tuned: Tuned, world: World, session: Session
) -> None:
    """The sandbox runs on, every process slot taken: no command can start in it, so the
    `true` asked of it fails. It is still running (the engine says so), not gone: the terminal
    says the shell exited."""
    comm, screen, tid = await open_a_working_shell(tuned, world, session, False)
    await screen.run("cat > /tmp/hold.py <<'EOF'\n" + HOLD_EVERY_PROCESS_SLOT + "EOF\n")
    await screen.run("python3 /tmp/hold.py &\n")
    await screen.until_output(b"slots-taken", timeout=60)
    await screen.run("exit\n")
    await screen.until(lambda: screen.closed_code is not None, timeout=30, what="the close")
    closed = [m for m in screen.controls if m.get("state") == "closed"]
    assert (screen.closed_code, [m["reason"] for m in closed]) == (terminal_protocol.CLOSE_NORMAL, ["the shell exited"])
    assert (await wait_closed(tid)).close_reason == "the shell exited"
    await sync_to_async(session.refresh_from_db)()
    assert docker.from_env(timeout=30).containers.get(session.sandbox_id).status == "running"
    await comm.disconnect()
