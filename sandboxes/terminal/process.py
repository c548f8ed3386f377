"""The PTY owner behind each websocket: `TerminalProcess` and this process's registry of them.

The shell itself is kept by the sandbox where its template can (`keeper`: a tmux session per
terminal), so the PTY here is one attachment to it and any console process can make another;
the attachment lease in the database (`attachments`) says which process holds the live one.
Only the process that wins `attachments.claim_close` ends the kept shell and audits the close:
a grace window that ends while another process holds the terminal lets go of its own PTY only.

It reads the PTY (through the fd with `loop.add_reader` when the backend gives one, else a
reader thread), keeps a replay ring buffer, forwards output to the attached client through
a bounded queue, keeps the session from idling, closes on idle, waits `terminal.reattach_s`
for a reconnect after an abnormal disconnect, and ends the shell through the contract's
`kill()` when it closes. `install_shutdown_hook()` ends every shell when Daphne stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from channels.db import database_sync_to_async

from ..backends.base import ErrorKind, PtySize, RemoteError
from ..backends.capabilities import PtyHandle
from ..sessions.streams import MemoryRingBuffer
from . import attachments
from .access import revoked
from .protocol import (
    CLOSE_IDLE,
    CLOSE_NORMAL,
    CLOSE_REPLACED,
    CLOSE_SERVER_STOPPING,
    CLOSE_SESSION_DELETED,
    MAX_PENDING_INPUT,
    MAX_QUEUED_INPUT,
    QUEUE_CHUNKS,
    READ_BYTES,
)
from .shells import (
    end_kept_shell,
    open_shell,
    record_close,
    record_open,
    shell_history,
    touch_session,
    why_the_shell_ended,
)
from .tickets import Grant
from .tuning import TERMINAL

logger = logging.getLogger(__name__)

REPLACED_MESSAGE = (
    "The shell was replaced: this sandbox cannot keep a shell between connections (its template "
    "has no tmux), so this is a new shell; the earlier one's output and environment are gone."
)
TAKEN_OVER = "another connection took over this terminal"


class TerminalGone(Exception):
    """The terminal was closed (or is closing) before this process could attach to it."""


class TerminalClient(Protocol):
    """What a `TerminalProcess` needs of the websocket attached to it (`consumer.TerminalConsumer`).

    A protocol rather than the consumer's class, so this module does not import the consumer
    that imports it.
    """

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None: ...

    async def send_pty(self, data: bytes) -> None: ...

    async def send_control(self, message: dict[str, Any]) -> None: ...

    async def end(self, reason: str, code: int) -> None: ...


# --- The PTY owner ---------------------------------------------------------------------------

# The terminals this process owns (state, not a cache).
_processes: dict[str, TerminalProcess] = {}


def get_process(terminal_id: str) -> TerminalProcess | None:
    process = _processes.get(terminal_id)
    return process if process is not None and not process.closed else None


# Closes in flight, held so the loop does not drop them (state, not a cache).
_closing: set[asyncio.Task[None]] = set()


async def close_all(reason: str = "server shutting down", *, code: int = CLOSE_SERVER_STOPPING) -> None:
    """Close every terminal this process owns (attached or in its grace window), at once,
    and wait for every close in flight: each ends its shell and records the close.

    A shell the sandbox keeps is not ended: this process lets go of it (its client is told
    why and reconnects, through another process), and a terminal nobody takes again within
    the grace window is closed by the sweep (`sweep.close_abandoned`)."""
    closes = [process.close(reason, code=code, let_go=process.kept) for process in list(_processes.values())]
    await asyncio.gather(*closes, return_exceptions=True)
    if _closing:
        await asyncio.gather(*list(_closing), return_exceptions=True)


_shutdown_hook: list[object] = []
# Set (synchronously) by the shutdown trigger, so the consumers Daphne cancels in the same
# breath leave their terminals attached for close_all() to end with a message and a close code.
shutting_down = False
SHUTDOWN_LINGER_S = 0.3


def install_shutdown_hook() -> None:
    """Under Daphne, end this process's shells before the server stops.

    On SIGTERM/SIGINT Daphne stops its Twisted reactor, which first cancels every websocket
    application; a shell left in its grace window has no application at all. Both would
    leave shells running and Terminal rows open, so a "before shutdown" trigger closes every
    terminal (and Twisted waits for it). Outside a Twisted reactor this does nothing.
    """
    if _shutdown_hook or "twisted.internet.reactor" not in sys.modules:
        return
    from twisted.internet import defer, reactor

    def before_shutdown() -> object:
        global shutting_down
        shutting_down = True
        logger.info("server stopping: closing %d terminal(s)", len(_processes))
        return defer.Deferred.fromFuture(asyncio.ensure_future(close_all_and_linger()))

    async def close_all_and_linger() -> None:
        await close_all("server shutting down")
        # The close frames are written; give the clients a moment to answer them before
        # Twisted drops the connections (else a reset can swallow the frame unread).
        await asyncio.sleep(SHUTDOWN_LINGER_S)

    _shutdown_hook.append(reactor.addSystemEventTrigger("before", "shutdown", before_shutdown))  # type: ignore[arg-type]  # zope interface stubs


class TerminalProcess:
    """One shell, owned by this process's event loop, attached to at most one websocket."""

    def __init__(self, grant: Grant, user: Any, source_ip: str | None) -> None:
        self.grant = grant
        self.user = user
        self.source_ip = source_ip
        self.loop = asyncio.get_running_loop()
        self.ring = MemoryRingBuffer(max_bytes=TERMINAL.replay_bytes, max_chunks=1000)
        self.size = PtySize()
        self.applied_size: PtySize | None = None
        self.handle: PtyHandle | None = None
        self.consumer: TerminalClient | None = None
        # Bounded by the readers, which stop at QUEUE_CHUNKS (a full asyncio.Queue would raise).
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.send_lock = asyncio.Lock()
        self.reading = False
        self.fd: int | None = None
        self.reader_wakeup = threading.Event()
        self.reader_stop = False
        self.closed = False
        self.closing: asyncio.Task[None] | None = None
        self.started_at = time.monotonic()
        self.last_activity = time.monotonic()
        self.bytes_in = 0
        self.bytes_out = 0
        self.pending_input = bytearray()
        self.tasks: list[asyncio.Task[Any]] = []
        self.grace: asyncio.TimerHandle | None = None
        self.resizing: asyncio.Task[Any] | None = None
        self.writes: asyncio.Queue[bytes] = asyncio.Queue()
        self.writer_busy = False
        self.queued_input = 0  # bytes in `writes` and in the write under way
        # The writes' own thread: one blocked on a shell that reads nothing holds no thread of
        # the loop's shared executor (which the closes' kills need). Started at the first write.
        self.input_thread = ThreadPoolExecutor(1, thread_name_prefix=f"terminal-input-{grant.terminal_id[:8]}")
        # This attachment's name in the lease (unique per process and per PTY).
        self.holder = f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(6)}"
        self.sandbox_id: str | None = None
        self.history_busy = False
        self.kept = False  # the sandbox keeps the shell (tmux)
        self.reattached = False  # the shell is an earlier connection's
        self.replaced = False  # an earlier connection had a shell this one cannot be
        _processes[grant.terminal_id] = self

    # Lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the lease, attach to the terminal's shell (resuming the sandbox; creating the
        shell unless the sandbox keeps it already), then start reading, sending and keeping alive."""
        terminal_id = self.grant.terminal_id
        if not await database_sync_to_async(attachments.take)(terminal_id, self.holder):
            raise TerminalGone("the terminal was closed")
        opened = await database_sync_to_async(open_shell)(self.grant.session_id, terminal_id, self.size)
        handle = opened.handle
        if self.closed:  # closed while the sandbox was resolving
            await self.loop.run_in_executor(None, handle.kill)
            return
        self.handle = handle
        self.touch()  # the idle clock starts with the shell, not with the sandbox's resolve
        self.sandbox_id = opened.sandbox_id
        self.kept = opened.kept
        self.applied_size = self.size
        first = await database_sync_to_async(record_open)(self.grant, self.user, self.source_ip, opened.sandbox_id)
        self.reattached = opened.existed
        self.replaced = not first and not opened.existed
        if opened.scrollback:
            self.ring.append(opened.scrollback)  # replayed first, before live output
        if self.replaced:
            logger.info("terminal %s: the shell was replaced (the sandbox keeps none)", terminal_id)
        self.tasks.append(self.loop.create_task(self._sender()))
        self.tasks.append(self.loop.create_task(self._keepalive()))
        self.tasks.append(self.loop.create_task(self._writer()))
        self.fd = handle.fileno()
        if self.fd is not None:
            # Bytes the backend already read ahead are served by read() before the fd wakes.
            first = await self.loop.run_in_executor(None, self._read_now)
            if first:
                self.queue.put_nowait(first)
            self._start_reading()
        else:
            threading.Thread(target=self._reader_thread, name=f"terminal-{self.grant.terminal_id}", daemon=True).start()
        if self.pending_input:
            self.write(bytes(self.pending_input))
            self.pending_input.clear()
        self._apply_size()

    async def close(self, reason: str, *, code: int = CLOSE_NORMAL, force: bool = True, let_go: bool = False) -> None:
        """End the shell, close the websocket with `reason`, record and audit the close.

        Unless `force`, the terminal closes only when no other process holds a live attachment
        (`attachments.claim_close`); otherwise, and always with `let_go`, only this process's
        PTY ends (its client, if any, is told that another connection took over). The work runs in a task of its own: a
        consumer cancelled while closing (Daphne's application close timeout) cannot leave the
        shell running or the close unrecorded.
        """
        if self.closing is None:
            self.closed = True
            self.closing = self.loop.create_task(self._close(reason, code, force, let_go))
            _closing.add(self.closing)
            self.closing.add_done_callback(_closing.discard)
        await asyncio.shield(self.closing)

    async def _close(self, reason: str, code: int, force: bool, let_go: bool) -> None:
        if self.grace is not None:
            self.grace.cancel()
        terminal_id = self.grant.terminal_id
        try:
            claimed = not let_go and await database_sync_to_async(attachments.claim_close)(
                terminal_id, self.holder, force=force
            )
        except Exception:
            logger.exception("terminal %s: claiming the close failed", terminal_id)
            claimed = force
        if not claimed and not let_go and not force:
            reason, code = TAKEN_OVER, CLOSE_REPLACED
            logger.info("terminal %s: held through another process; letting go of this PTY", terminal_id)
        if not claimed:  # a holder that lets go leaves the grace window in the lease (for the sweep)
            with contextlib.suppress(Exception):
                await database_sync_to_async(attachments.release)(terminal_id, self.holder)
        self._stop_reading()
        self.reader_stop = True
        self.reader_wakeup.set()
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.end(reason, code)
        if claimed and self.kept and self.sandbox_id is not None:
            with contextlib.suppress(Exception):
                await database_sync_to_async(end_kept_shell)(self.grant.session_id, self.sandbox_id, terminal_id)
        if self.handle is not None:
            with contextlib.suppress(Exception):
                await self.loop.run_in_executor(None, self.handle.kill)
        for task in self.tasks:
            task.cancel()
        self.input_thread.shutdown(wait=False, cancel_futures=True)  # the kill woke a blocked write
        if _processes.get(terminal_id) is self:  # a fresh attachment may have taken the place
            del _processes[terminal_id]
        stats = {
            "duration_s": round(time.monotonic() - self.started_at, 3),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        }
        try:
            if claimed:
                await database_sync_to_async(record_close)(self.grant, self.user, self.source_ip, reason, stats)
            else:
                await database_sync_to_async(attachments.add_traffic)(terminal_id, self.bytes_in, self.bytes_out)
        except Exception:
            logger.exception("terminal %s: recording the close failed", terminal_id)

    async def send_history(self, consumer: TerminalClient) -> None:
        """Answer a client's `history` request: the kept shell's pane as tmux holds it (lines
        above the screen, the screen, the cursor), for the client to rebuild its scrollback
        after tmux dropped output it could not take. A plain shell has none to give."""
        if not self.kept or self.sandbox_id is None or self.history_busy:
            await consumer.send_control({"type": "history", "kept": self.kept, "busy": self.history_busy})
            return
        self.history_busy = True
        try:
            found = await database_sync_to_async(shell_history)(
                self.grant.session_id, self.sandbox_id, self.grant.terminal_id
            )
        except Exception:
            logger.exception("terminal %s: reading the shell's history failed", self.grant.terminal_id)
            found = None
        finally:
            self.history_busy = False
        if found is None or self.consumer is not consumer:
            return
        await consumer.send_control(
            {
                "type": "history",
                "kept": True,
                "lines": found.lines,
                "history": found.history.decode("utf-8", "replace"),
                "screen": found.screen.decode("utf-8", "replace"),
                "cursor": list(found.cursor),
            }
        )

    async def attach(self, consumer: TerminalClient, *, reattached: bool) -> None:
        """Make `consumer` the one client: replay the buffered output, then stream live."""
        if self.grace is not None:
            self.grace.cancel()
            self.grace = None
        if not await database_sync_to_async(attachments.take)(self.grant.terminal_id, self.holder):
            await consumer.end("the terminal was closed", CLOSE_NORMAL)
            return
        previous = self.consumer
        if previous is not None and previous is not consumer:
            self.consumer = None
            await previous.end("another connection took over this terminal", CLOSE_REPLACED)
        async with self.send_lock:
            replay = self.ring.read_after(None, max(TERMINAL.replay_bytes, 1))
            ready: dict[str, Any] = {"type": "status", "state": "ready", "reattached": reattached, "kept": self.kept}
            if self.replaced:
                ready.update(replaced=True, message=REPLACED_MESSAGE)
                self.replaced = False  # said once; later reattaches here get this shell back
            await consumer.send_control(ready)
            for _, chunk in replay.chunks:
                await consumer.send(bytes_data=chunk)
            self.consumer = consumer
        self.flowing.set()
        self._maybe_resume_reading()

    def detach(self, consumer: TerminalClient) -> None:
        """The client went away abnormally: keep the shell for the grace window, input fenced."""
        if self.consumer is not consumer or self.closed:
            return
        self.consumer = None
        self.start_grace()

    def start_grace(self) -> None:
        """No client: keep draining into the replay buffer; end the shell if none comes back."""
        if self.closed or self.consumer is not None or self.grace is not None:
            return
        self.flowing.set()
        self.tasks.append(self.loop.create_task(self._release()))
        self.grace = self.loop.call_later(
            TERMINAL.reattach_s,
            lambda: self.loop.create_task(self.close("not reattached within the grace window", force=False)),
        )

    async def _release(self) -> None:
        """No live attachment here any more: another process may take the terminal."""
        with contextlib.suppress(Exception):
            await database_sync_to_async(attachments.release)(self.grant.terminal_id, self.holder)

    # Client -> shell -------------------------------------------------------------------------

    def write(self, data: bytes) -> bool:
        """Send input to the shell; False when it was dropped (the shell is not reading and
        `MAX_QUEUED_INPUT` bytes wait already)."""
        self.touch()
        self.bytes_in += len(data)
        if self.handle is None:
            if len(self.pending_input) + len(data) <= MAX_PENDING_INPUT:
                self.pending_input += data
            return True
        if not self.writer_busy and self.writes.empty() and len(data) <= 1024 and self._room_to_write():
            # Keystrokes: write at once (a short send on a socket with room never blocks).
            with contextlib.suppress(RemoteError):
                self.handle.write(data)
            return True
        if self.queued_input + len(data) > MAX_QUEUED_INPUT:
            return False
        self.queued_input += len(data)
        self.writes.put_nowait(data)
        return True

    def _room_to_write(self) -> bool:
        """True when the PTY's descriptor takes a keystroke without waiting: a program that
        reads nothing fills the PTY, then the socket, and a send then blocks until it reads."""
        if self.fd is None:
            return False
        poller = select.poll()
        poller.register(self.fd, select.POLLOUT)
        return bool(poller.poll(0))

    async def _writer(self) -> None:
        """Writes that may wait (pastes, input for a shell not reading) in the terminal's own
        thread, in order, so neither the loop nor the shared executor blocks on them."""
        while True:
            data = await self.writes.get()
            self.writer_busy = True
            try:
                if self.handle is not None:
                    await self.loop.run_in_executor(self.input_thread, self.handle.write, data)
            except RemoteError:
                pass
            finally:
                self.writer_busy = False
                self.queued_input -= len(data)

    def resize(self, size: PtySize) -> None:
        """Remember the size; apply it once the shell runs (a resize before start fails)."""
        self.size = size.clamped()
        self.touch()
        if self.handle is not None:
            self._apply_size()

    def _apply_size(self) -> None:
        if self.resizing is not None and not self.resizing.done():
            return  # the running resize re-checks the wanted size when it finishes
        if self.handle is None or self.size == self.applied_size:
            return
        self.resizing = self.loop.create_task(self._resize_loop())

    async def _resize_loop(self) -> None:
        while self.handle is not None and self.size != self.applied_size and not self.closed:
            wanted = self.size
            try:
                await self.loop.run_in_executor(None, self.handle.resize, wanted)
            except RemoteError as exc:
                logger.info("terminal %s: resize failed: %s", self.grant.terminal_id, exc)
                return
            self.applied_size = wanted

    def pause(self) -> None:
        self.flowing.clear()
        self._stop_reading()

    def resume(self) -> None:
        self.flowing.set()
        self._maybe_resume_reading()

    def touch(self) -> None:
        self.last_activity = time.monotonic()

    # Shell -> client -------------------------------------------------------------------------

    def _read_now(self) -> bytes | None:
        """One non-waiting read: bytes, b"" at end of stream, None when nothing is there."""
        assert self.handle is not None
        try:
            return self.handle.read(READ_BYTES, timeout=0)
        except RemoteError as exc:
            return None if exc.kind == ErrorKind.TIMEOUT else b""

    def _start_reading(self) -> None:
        if self.fd is not None and not self.reading and not self.closed:
            self.loop.add_reader(self.fd, self._on_readable)
            self.reading = True

    def _stop_reading(self) -> None:
        if self.fd is not None and self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def _maybe_resume_reading(self) -> None:
        if self.flowing.is_set() and self.queue.qsize() <= QUEUE_CHUNKS // 2:
            if self.fd is not None:
                self._start_reading()
            else:
                self.reader_wakeup.set()

    def _on_readable(self) -> None:
        data = self._read_now()
        if data is None:
            return
        if data == b"":
            self._stop_reading()
            self.fd = None  # the descriptor may be closed and reused from here on
            self.queue.put_nowait(None)
            return
        self.queue.put_nowait(data)
        if self.queue.qsize() >= QUEUE_CHUNKS or not self.flowing.is_set():
            self._stop_reading()  # the kernel's PTY buffer fills and the producer blocks

    def _reader_thread(self) -> None:
        """For backends without a descriptor: blocking reads, bounded by the same queue."""
        assert self.handle is not None
        while not self.reader_stop:
            if self.queue.qsize() >= QUEUE_CHUNKS or not self.flowing.is_set():
                self.reader_wakeup.wait(0.5)
                self.reader_wakeup.clear()
                continue
            try:
                data: bytes | None = self.handle.read(READ_BYTES, timeout=0.5)
            except RemoteError as exc:
                if exc.kind == ErrorKind.TIMEOUT:
                    continue
                data = b""
            put: Callable[[bytes | None], None] = self.queue.put_nowait
            self.loop.call_soon_threadsafe(put, data or None)
            if not data:
                return

    async def _sender(self) -> None:
        while True:
            await self.flowing.wait()
            data = await self.queue.get()
            if data is None:
                break
            self.ring.append(data)
            self.bytes_out += len(data)
            self.touch()
            async with self.send_lock:
                consumer = self.consumer
                if consumer is not None:
                    await consumer.send_pty(data)
            self._maybe_resume_reading()
        # Also the end of this attachment when another process attached (tmux detached ours).
        try:
            reason, code = await database_sync_to_async(why_the_shell_ended)(self.grant.session_id, self.sandbox_id)
        except Exception:
            logger.exception("terminal %s: telling why the shell ended failed", self.grant.terminal_id)
            reason, code = "the shell exited", CLOSE_NORMAL
        # A deleted session took its terminal rows along: no other process can hold this one.
        await self.close(reason, code=code, force=code == CLOSE_SESSION_DELETED)

    async def _keepalive(self) -> None:
        """Keep the session from idling; close on idle; re-check access now and then."""
        idle_s = TERMINAL.idle_timeout_s
        renew_every = attachments.lease_s() / 3
        every = max(min(TERMINAL.keepalive_s, idle_s / 4, renew_every), 0.2)
        next_touch = next_check = next_renew = 0.0
        while not self.closed:
            now = time.monotonic()
            if self.consumer is not None and now >= next_renew:
                next_renew = now + renew_every
                with contextlib.suppress(Exception):  # the database away: the lease runs on a while
                    if not await database_sync_to_async(attachments.renew)(self.grant.terminal_id, self.holder):
                        await self.close(TAKEN_OVER, code=CLOSE_REPLACED, let_go=True)
                        return
            if now - self.last_activity > idle_s:
                await self.close(f"idle for {idle_s} s", code=CLOSE_IDLE)
                return
            if now >= next_touch:
                next_touch = now + TERMINAL.keepalive_s
                with contextlib.suppress(Exception):
                    await database_sync_to_async(touch_session)(self.grant.session_id)
            if now >= next_check:  # detached too: its shell runs on for the grace window
                next_check = now + TERMINAL.keepalive_s
                with contextlib.suppress(Exception):  # the database away: ask again later
                    revocation = await database_sync_to_async(revoked)(self.grant)
                    if revocation is not None:
                        await self.close(revocation.reason, code=revocation.code)
                        return
            await asyncio.sleep(every)
