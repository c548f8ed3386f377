"""Background commands: start a command in a session's sandbox, read its output from anywhere.

    start_command(runtime, session, *, shell=None, argv=None, actor) -> BackgroundCommand
    read_output(command, after=None, max_bytes=256 KiB) -> CommandOutput
    send_input(command, data, *, actor=SYSTEM, eof=False) -> int
    kill_command(command, *, actor) -> BackgroundCommand

How it runs, through the contract only: the command is opened with the backend's `pty()`
capability as uid 1000 in /workspace, under a small `sh` wrapper that records its pid (the
session and process-group leader of the PTY), turns echo and output CR/LF translation off
(`stty -echo -onlcr`, so output is the command's own bytes), and writes the exit code to a
file when the command ends. A pump thread in the starting process reads the PTY, appends to
a ring buffer (`sandboxes.sessions.streams`), feeds stdin queued by any process, refreshes a
heartbeat, and at the end records exit code and finish time on the row.

Shared state lives in Redis when REDIS_URL is set (output ring, stdin queue, heartbeat,
kill flag), so every process can read, write stdin and kill. Without Redis an in-process
store serves the single-process embedded console only.

Killing runs another exec in the sandbox (from any process) that sends TERM, then KILL, to
the command's whole process group. A command whose pump process died is marked `lost` by
the next reader (no heartbeat), or when that process is found dead (`lose_commands_of`,
answering `console.signals.process_released`), whichever comes first.

Errors: `console.services.ServiceError` for bad input, `RemoteError` from the backend.
Every call with side effects writes one audit row; input bytes are never recorded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from console.models import AuditAction
from console.processes import this_process
from console.services import SYSTEM, Actor, ServiceError, record_audit

from ..backends.base import ErrorKind, ExecRequest, PtySize, RemoteError
from ..backends.capabilities import PtyHandle
from ..catalog.bridge import get_backend
from ..models import BackgroundCommand, CommandStatus, Session
from .inflight import in_flight
from .limits import check_background_commands
from .runtime import HOLDER, Runtime
from .streams import MemoryRingBuffer, RedisRingBuffer, RingBuffer
from .tuning import SESSIONS

logger = logging.getLogger(__name__)

COMMAND_DIR = "/tmp/.console-cmd"  # noqa: S108 - a path inside the sandbox, not on the host
# $1: command id; the rest: the command. The wrapper's pid leads the PTY's session and group.
# It waits (at most 1 s) for the PTY's first resize: a backend may size the PTY just after
# starting it, and a command that ended before then would make that resize fail.
WRAPPER = (
    f'd={COMMAND_DIR}; mkdir -p -m 1777 "$d" 2>/dev/null; echo $$ > "$d/$1.pid"; id=$1; shift; '
    'i=0; while [ "$(stty size 2>/dev/null)" = "0 0" ] && [ $i -lt 50 ]; do sleep 0.02; i=$((i+1)); done; '
    'stty -echo -onlcr 2>/dev/null; "$@"; code=$?; echo "$code" > "$d/$id.exit"; exit "$code"'
)
# $1: command id. TERM the group, give it 2 s, then KILL what is left.
KILL_GROUP = (
    f'f={COMMAND_DIR}/$1.pid; i=0; while [ ! -s "$f" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done; '
    'pid=$(cat "$f" 2>/dev/null) || exit 0; kill -TERM -"$pid" 2>/dev/null; i=0; '
    'while kill -0 -"$pid" 2>/dev/null && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done; '
    'kill -KILL -"$pid" 2>/dev/null; true'
)
PTY_SIZE = PtySize(cols=200, rows=50)
MAX_COMMAND_CHARS = 64 * 1024
MAX_INPUT_BYTES = 64 * 1024
MAX_PAGE_BYTES = 4 * 1024 * 1024
HEARTBEAT_S = 5
HEARTBEAT_TTL_S = 20
INPUT_POLL_S = 0.05


# --- Shared state: Redis, or this process ----------------------------------------------------


class Plumbing:
    """Per command: output ring, stdin queue, pump heartbeat and kill flag."""

    ring: RingBuffer

    def push_input(self, data: bytes) -> None:
        raise NotImplementedError

    def pop_input(self) -> list[bytes]:
        raise NotImplementedError

    def beat(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def mark_killed(self) -> None:
        raise NotImplementedError

    def was_killed(self) -> bool:
        raise NotImplementedError

    def finish(self) -> None:
        raise NotImplementedError


class RedisPlumbing(Plumbing):
    def __init__(self, client: Any, command_id: str) -> None:
        self.client = client
        base = f"console:cmd:{{{command_id}}}"
        self.ring = RedisRingBuffer(client, command_id, prefix="console:cmd-out")
        self.stdin_key, self.beat_key, self.kill_key = f"{base}:stdin", f"{base}:owner", f"{base}:killed"

    def push_input(self, data: bytes) -> None:
        pipe = self.client.pipeline()
        pipe.rpush(self.stdin_key, data)
        pipe.expire(self.stdin_key, 24 * 3600)
        pipe.execute()

    def pop_input(self) -> list[bytes]:
        return [bytes(item) for item in self.client.lpop(self.stdin_key, 64) or []]

    def beat(self) -> None:
        self.client.set(self.beat_key, HOLDER, ex=HEARTBEAT_TTL_S)

    def alive(self) -> bool:
        return bool(self.client.exists(self.beat_key))

    def mark_killed(self) -> None:
        self.client.set(self.kill_key, "1", ex=24 * 3600)

    def was_killed(self) -> bool:
        return bool(self.client.exists(self.kill_key))

    def finish(self) -> None:
        self.client.delete(self.beat_key, self.stdin_key)
        self.client.expire(self.kill_key, SESSIONS.command_output_retention_s)
        self.ring.finish(SESSIONS.command_output_retention_s)


class MemoryPlumbing(Plumbing):
    """Single-process only (the embedded console without Redis)."""

    def __init__(self) -> None:
        self.ring = MemoryRingBuffer(max_bytes=4 * 1024 * 1024, max_chunks=4096)
        self.stdin: deque[bytes] = deque()
        self.running = True
        self.killed = False
        self.finished_at: float | None = None

    def push_input(self, data: bytes) -> None:
        self.stdin.append(data)

    def pop_input(self) -> list[bytes]:
        items: list[bytes] = []
        while self.stdin and len(items) < 64:
            items.append(self.stdin.popleft())
        return items

    def beat(self) -> None:
        return None

    def alive(self) -> bool:
        return self.running

    def mark_killed(self) -> None:
        self.killed = True

    def was_killed(self) -> bool:
        return self.killed

    def finish(self) -> None:
        self.running = False
        self.finished_at = time.monotonic()


# Without Redis, the commands' output lives here (state, not a cache).
_memory: dict[str, MemoryPlumbing] = {}
# Measured (bench/module_caches.py): a Redis call on the kept client 134 us, on a new client 1,629 us.
_redis_clients: dict[str, Any] = {}
_state_lock = threading.Lock()


def plumbing_for(command_id: uuid.UUID | str) -> Plumbing:
    url = settings.REDIS_URL
    key = str(command_id)
    with _state_lock:
        if url:
            client = _redis_clients.get(url)
            if client is None:
                import redis

                client = _redis_clients[url] = redis.Redis.from_url(url)
            return RedisPlumbing(client, key)
        now = time.monotonic()
        for stale in [
            k for k, p in _memory.items() if p.finished_at and now - p.finished_at > SESSIONS.command_output_retention_s
        ]:
            del _memory[stale]
        return _memory.setdefault(key, MemoryPlumbing())


# --- Service functions -----------------------------------------------------------------------


@dataclass(frozen=True)
class CommandOutput:
    """A page of output. Pass `next_after` back as `after`; `finished` means the reader has
    everything (the command ended and this page reaches its last chunk)."""

    chunks: list[tuple[int, bytes]] = field(default_factory=list)
    next_after: int = 0
    fell_behind: bool = False
    finished: bool = False
    exit_code: int | None = None
    status: str = CommandStatus.RUNNING

    @property
    def data(self) -> bytes:
        return b"".join(chunk for _, chunk in self.chunks)


def _command_argv(shell: str | None, argv: Sequence[str] | None) -> tuple[str, ...]:
    if (shell is None) == (argv is None):
        raise ServiceError("Give exactly one of shell or argv.")
    if shell is not None:
        if not isinstance(shell, str) or not shell.strip():
            raise ServiceError("The shell command is empty.")
        if len(shell) > MAX_COMMAND_CHARS or "\x00" in shell:
            raise ServiceError("The shell command is too long or contains NUL.")
        return ("/bin/bash", "-c", shell)
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise ServiceError("argv must be a non-empty list of strings.")
    if sum(len(a) for a in argv) > MAX_COMMAND_CHARS or any("\x00" in a for a in argv):
        raise ServiceError("argv is too long or contains NUL.")
    return tuple(argv)


def start_command(
    runtime: Runtime,
    session: Session,
    *,
    shell: str | None = None,
    argv: Sequence[str] | None = None,
    actor: Actor,
) -> BackgroundCommand:
    """Start a command in the session's sandbox (resumed if paused) and return at once."""
    command_argv = _command_argv(shell, argv)
    check_background_commands(session.space)
    ptys = get_backend(session.config).pty()
    if ptys is None:
        raise RemoteError(ErrorKind.UNSUPPORTED, "this backend cannot run background commands (no pty capability)")
    with runtime.telling_deleted(session):  # a DELETE racing the start: SessionDeleted
        return _start(runtime, session, ptys, command_argv, shell=shell, argv=argv, actor=actor)


def _start(
    runtime: Runtime,
    session: Session,
    ptys: Any,
    command_argv: tuple[str, ...],
    *,
    shell: str | None,
    argv: Sequence[str] | None,
    actor: Actor,
) -> BackgroundCommand:
    command_id = uuid.uuid4()
    with in_flight(session):  # no pause freezes the sandbox while the shell starts
        resolved = runtime.resolve_session(session, own_calls=1)
        handle = ptys.open(
            resolved.sandbox.sandbox_id,
            PTY_SIZE,
            command=("/bin/sh", "-c", WRAPPER, "sh", str(command_id), *command_argv),
            user="user",
            cwd="/workspace",
        )
    try:
        with transaction.atomic():
            check_background_commands(session.space, locked=True)  # counted with this insert
            command = BackgroundCommand.objects.create(
                id=command_id,
                session=session,
                started_by=actor.user,
                shell=shell or "",
                argv=list(argv or []),
                owner=HOLDER,
                owner_process=this_process(),
            )
            record_audit(
                actor,
                AuditAction.COMMAND_START,
                space=session.space,
                target_type="command",
                target_id=command.id,
                target_name=command.display_command,
                details={"session": str(session.id), "command": command.display_command[:500]},
            )
        plumbing = plumbing_for(command_id)
        plumbing.beat()
    except BaseException:
        handle.kill()
        raise
    threading.Thread(
        target=_pump,
        args=(runtime, session.pk, command_id, handle, plumbing),
        name=f"command-{command_id}",
        daemon=True,
    ).start()
    return command


def read_output(command: BackgroundCommand, after: int | None = None, max_bytes: int = 256 * 1024) -> CommandOutput:
    """Output after chunk id `after` (None: from the start), at most about `max_bytes`."""
    if after is not None and (not isinstance(after, int) or isinstance(after, bool) or after < 0):
        raise ServiceError("after must be a chunk id (an integer >= 0).")
    if not isinstance(max_bytes, int) or not 1 <= max_bytes <= MAX_PAGE_BYTES:
        raise ServiceError(f"max_bytes must be between 1 and {MAX_PAGE_BYTES}.")
    plumbing = plumbing_for(command.id)
    with _on_its_session(command):
        _refresh(command)
        if command.status == CommandStatus.RUNNING and not plumbing.alive():
            _mark_lost(command, plumbing)
    # Status first, then output: a final status read before the ring means all output is in.
    result = plumbing.ring.read_after(after, max_bytes)
    return CommandOutput(
        chunks=result.chunks,
        next_after=result.next_after,
        fell_behind=result.fell_behind,
        finished=command.is_finished and result.caught_up,
        exit_code=command.exit_code,
        status=command.status,
    )


def send_input(command: BackgroundCommand, data: bytes | str, *, actor: Actor = SYSTEM, eof: bool = False) -> int:
    """Queue bytes for the command's stdin (from any process); `eof` sends end-of-file after
    them. Input is line-buffered by the PTY (canonical mode). Returns the bytes queued."""
    payload = data.encode() if isinstance(data, str) else data
    if not isinstance(payload, bytes | bytearray):
        raise ServiceError("Input must be bytes or text.")
    if len(payload) > MAX_INPUT_BYTES:
        raise ServiceError(f"Send at most {MAX_INPUT_BYTES} bytes of input at a time.")
    if not payload and not eof:
        raise ServiceError("Nothing to send.")
    with _on_its_session(command):
        _refresh(command)
    if command.is_finished:
        raise ServiceError("The command has finished; it reads no more input.")
    plumbing = plumbing_for(command.id)
    if payload:
        plumbing.push_input(bytes(payload))
    if eof:
        # End-of-file in canonical mode is VEOF at the start of a line.
        plumbing.push_input(b"\x04" if not payload or payload.endswith(b"\n") else b"\x04\x04")
    record_audit(
        actor,
        AuditAction.COMMAND_INPUT,
        space=command.session.space,
        target_type="command",
        target_id=command.id,
        target_name=command.display_command,
        details={"bytes": len(payload), "eof": eof},
    )
    return len(payload)


def kill_command(command: BackgroundCommand, *, actor: Actor) -> BackgroundCommand:
    """Kill the command's process group in the sandbox (from any process). A command that has
    already finished is returned unchanged (no audit row)."""
    with _on_its_session(command):
        _refresh(command)
        if command.is_finished:
            return command
        plumbing = plumbing_for(command.id)
        plumbing.mark_killed()
        session = Session.objects.select_related("config", "space").get(pk=command.session_id)
        result = Runtime().exec(
            session, ExecRequest(argv=("/bin/sh", "-c", KILL_GROUP, "sh", str(command.id)), timeout_s=30)
        )
        if result.exit_code != 0:
            raise RemoteError(ErrorKind.INTERNAL, f"killing the command failed ({result.exit_code})")
        with transaction.atomic():
            BackgroundCommand.objects.filter(pk=command.pk, status=CommandStatus.RUNNING).update(
                status=CommandStatus.KILLED, finished=timezone.now()
            )
            record_audit(
                actor,
                AuditAction.COMMAND_KILL,
                space=session.space,
                target_type="command",
                target_id=command.id,
                target_name=command.display_command,
                details={"session": str(session.id)},
            )
        _refresh(command)  # a DELETE since the kill took the row: SessionDeleted
    return command


# --- Internals -----------------------------------------------------------------------------


@contextlib.contextmanager
def _on_its_session(command: BackgroundCommand) -> Iterator[None]:
    """A call on `command`: its row gone with its session under a DELETE is `SessionDeleted`."""
    with Runtime().telling_deleted(command.session):
        yield


def _refresh(command: BackgroundCommand) -> None:
    command.refresh_from_db(fields=["status", "exit_code", "finished"])


def _mark_lost(command: BackgroundCommand, plumbing: Plumbing) -> None:
    # The heartbeat is written before the pump starts, so a missing one means it is gone.
    BackgroundCommand.objects.filter(pk=command.pk, status=CommandStatus.RUNNING).update(
        status=CommandStatus.LOST, finished=timezone.now()
    )
    plumbing.finish()
    _refresh(command)


def _pump(runtime: Runtime, session_id: Any, command_id: uuid.UUID, handle: PtyHandle, plumbing: Plumbing) -> None:
    """Owner thread: PTY -> ring buffer, stdin queue -> PTY, heartbeat, then the outcome."""
    next_beat = next_poll = 0.0
    try:
        while True:
            try:
                data = handle.read(65536, timeout=INPUT_POLL_S)
            except RemoteError as exc:
                if exc.kind != ErrorKind.TIMEOUT:
                    break
                data = None
            if data == b"":
                break
            if data:
                plumbing.ring.append(data)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + INPUT_POLL_S
                for piece in plumbing.pop_input():
                    with contextlib.suppress(RemoteError):
                        handle.write(piece)
            if now >= next_beat:
                next_beat = now + HEARTBEAT_S
                plumbing.beat()
    except Exception:
        logger.exception("background command %s: pump failed", command_id)
    finally:
        try:
            _finish(runtime, session_id, command_id, plumbing)
        except Exception:
            logger.exception("background command %s: recording its outcome failed", command_id)
        finally:
            handle.kill()
            connection.close()


def _finish(runtime: Runtime, session_id: Any, command_id: uuid.UUID, plumbing: Plumbing) -> None:
    close_old_connections()
    session = Session.objects.select_related("config", "space").get(pk=session_id)
    exit_code: int | None = None
    with contextlib.suppress(RemoteError):
        result = runtime.exec(
            session,
            ExecRequest(
                argv=(
                    "/bin/sh",
                    "-c",
                    'cat "$0.exit" 2>/dev/null; rm -f "$0.exit" "$0.pid"',
                    f"{COMMAND_DIR}/{command_id}",
                ),
                timeout_s=30,
            ),
        )
        text = result.stdout.decode(errors="replace").strip()
        exit_code = int(text) if text.lstrip("-").isdigit() else None
    killed = plumbing.was_killed()
    status = CommandStatus.KILLED if killed else CommandStatus.EXITED if exit_code is not None else CommandStatus.LOST
    now = timezone.now()
    BackgroundCommand.objects.filter(pk=command_id, status=CommandStatus.RUNNING).update(
        status=status, exit_code=exit_code, finished=now
    )
    # A kill that finished first set the status; still record the exit code if one came.
    if exit_code is not None:
        BackgroundCommand.objects.filter(pk=command_id, exit_code__isnull=True).update(exit_code=exit_code)
    BackgroundCommand.objects.filter(pk=command_id, finished__isnull=True).update(finished=now)
    plumbing.finish()


def lose_commands_of(process_id: Any, **_: Any) -> str:
    """The running commands of a dead process: marked lost (nothing pumps their output or
    records their end any more), so they stop counting against the space's limit. Inside
    the transaction of `console.processes.release_process`."""
    lost = list(
        BackgroundCommand.objects.filter(owner_process=process_id, status=CommandStatus.RUNNING).values_list(
            "pk", flat=True
        )
    )
    if not lost:
        return ""
    BackgroundCommand.objects.filter(pk__in=lost, status=CommandStatus.RUNNING).update(
        status=CommandStatus.LOST, finished=timezone.now()
    )

    def finish_plumbing() -> None:
        for command_id in lost:
            with contextlib.suppress(Exception):  # output expiry only; the rows say lost
                plumbing_for(command_id).finish()

    transaction.on_commit(finish_plumbing)
    return f"{len(lost)} background command(s) marked lost"


def running_commands(session: Session, *, since: timedelta | None = None) -> list[BackgroundCommand]:
    """The session's commands still marked running (for pages and the API)."""
    qs = BackgroundCommand.objects.filter(session=session, status=CommandStatus.RUNNING)
    if since is not None:
        qs = qs.filter(started__gte=timezone.now() - since)
    return list(qs)
