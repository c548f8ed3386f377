"""A terminal's shell: opening it (`open_shell`: the session resolved, never rebuilt, then
the shell the sandbox keeps, `keeper`, or a plain one), ending a kept one, and what the PTY
owner (`process.TerminalProcess`) records of it: the audit of open and close (once per
terminal, however many processes served it) and the session's activity.
Nothing here branches on the backend's kind: only on the capabilities the contract offers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from console.models import AuditAction
from console.services import Actor, record_audit

from ..backends.base import Backend, ErrorKind, ExecRequest, PtySize, RemoteError, SandboxState
from ..backends.capabilities import PtyHandle
from ..catalog.bridge import get_backend
from ..models import Session, Terminal
from ..sessions.inflight import in_flight
from ..sessions.runtime import Runtime
from . import keeper
from .protocol import CLOSE_NORMAL, CLOSE_SESSION_DELETED
from .tickets import Grant
from .tuning import TERMINAL

SHELL = ("bash", "-l")


@transaction.atomic
def record_open(grant: Grant, user: Any, source_ip: str | None, sandbox_id: str) -> bool:
    """Audit the terminal's first shell; False (no audit) when it was opened before: a
    reattach through another process, or a shell that replaced a lost one. Every shell's
    sandbox is recorded on the row (the idle sweep ends a kept shell there; a replaced shell
    may run in a new sandbox). The row's mark and its audit row commit together: a reader
    never sees one without the other."""
    session = Session.objects.select_related("space").get(pk=grant.session_id)
    row = Terminal.objects.filter(pk=grant.terminal_id)
    first = row.filter(opened__isnull=True).update(opened=timezone.now(), sandbox_id=sandbox_id[:128])
    if not first:
        row.filter(closed__isnull=True).exclude(sandbox_id=sandbox_id[:128]).update(sandbox_id=sandbox_id[:128])
        return False
    record_audit(
        Actor(user=user, source_ip=source_ip),
        AuditAction.TERMINAL_OPEN,
        space=session.space,
        target_type="terminal",
        target_id=grant.terminal_id,
        target_name=f"in session {session.key}",
        details={"session": grant.session_id, "sandbox_id": sandbox_id, "read_only": grant.read_only},
    )
    return True


@transaction.atomic
def record_close(grant: Grant, user: Any, source_ip: str | None, reason: str, stats: dict[str, Any]) -> None:
    """Close the row and audit it: only the process that won `attachments.claim_close` calls
    this, once per terminal. `stats` are this process's; the row adds them to the others'.
    One transaction: a closed row is never seen (nor left by a crash) without its audit."""
    session = Session.objects.select_related("space").get(pk=grant.session_id)
    closed = Terminal.objects.filter(pk=grant.terminal_id, closed__isnull=True).update(
        closed=timezone.now(),
        close_reason=reason[:200],
        bytes_in=F("bytes_in") + stats["bytes_in"],
        bytes_out=F("bytes_out") + stats["bytes_out"],
        ticket_nonce="",
        holder="",
        held_until=None,
    )
    if not closed:
        return
    totals = dict(Terminal.objects.filter(pk=grant.terminal_id).values("bytes_in", "bytes_out").first() or {})
    record_audit(
        Actor(user=user, source_ip=source_ip),
        AuditAction.TERMINAL_CLOSE,
        space=session.space,
        target_type="terminal",
        target_id=grant.terminal_id,
        target_name=f"in session {session.key}",
        details={"session": grant.session_id, "reason": reason, **stats, **totals},
    )


def touch_session(session_id: str) -> None:
    Session.objects.filter(pk=session_id).update(last_activity=timezone.now())


@dataclass(frozen=True)
class OpenedShell:
    """A PTY attached to the terminal's shell, and what it found."""

    handle: PtyHandle
    sandbox_id: str
    kept: bool  # the sandbox keeps the shell (tmux): a reconnect anywhere gets it back
    existed: bool  # it is an earlier connection's shell (reattached), not a new one
    scrollback: bytes = b""  # that shell's pane, to show before live output


def open_shell(session_id: str, terminal_id: str, size: PtySize) -> OpenedShell:
    """Resolve the session (resuming a paused sandbox, never rebuilding a stale one: the page
    asks first), then attach to the terminal's shell kept by the sandbox (creating it), or open
    a plain shell where the template cannot keep one. Counted in flight meanwhile, so no pause
    freezes the sandbox while its shell starts."""
    session = Session.objects.select_related("config", "space").get(pk=session_id)
    backend = get_backend(session.config)
    ptys = backend.pty()
    if ptys is None:
        raise RemoteError(ErrorKind.UNSUPPORTED, "this sandbox backend has no interactive terminals")
    with in_flight(session):
        resolved = Runtime().resolve_session(session, own_calls=1, may_rebuild=False)
        sandbox_id = resolved.sandbox.sandbox_id
        found = keeper.probe(backend, sandbox_id, terminal_id) if TERMINAL.keep_shells else keeper.NOT_KEPT
        command = keeper.attach_command(terminal_id, size, SHELL) if found.kept else SHELL
        handle = ptys.open(sandbox_id, size, command=command, user="user", cwd="/workspace")
    return OpenedShell(handle, sandbox_id, found.kept, found.exists, found.scrollback)


def shell_history(session_id: str, sandbox_id: str, terminal_id: str) -> keeper.History | None:
    """The kept shell's pane (history, screen, cursor), for the browser to rebuild its scrollback."""
    session = Session.objects.select_related("config").get(pk=session_id)
    return keeper.history(get_backend(session.config), sandbox_id, terminal_id)


def end_kept_shell(session_id: str, sandbox_id: str, terminal_id: str) -> None:
    """End the terminal's shell kept by the sandbox (its tmux session)."""
    session = Session.objects.select_related("config").get(pk=session_id)
    keeper.end(get_backend(session.config), sandbox_id, terminal_id)


ALIVE_PROBE_S = 5.0
# How long a sandbox whose probe failed is watched for the engine to record it gone.
GOING_WATCH_S = 3.0


def why_the_shell_ended(session_id: str, sandbox_id: str | None) -> tuple[str, int]:
    """The words and close code for a PTY that ended by itself: the session deleted, the
    sandbox paused or gone, else the shell exited.

    A DELETE removes the sandbox first and the row last, all under the lifecycle lock, and
    `Runtime.deleted` waits for that lock: once it returns, a DELETE that ended this shell has
    taken the row (or failed, and the row stays). A shell that exited by itself may meet a
    DELETE that began after that first look: a sandbox found going is asked about again
    (the DELETE removing it holds the lock until its row is gone). One found gone while the
    row stays went another way (a rebuild, a removal on the engine): said at once, never
    after a wait for a row that is not going."""
    session = Session.objects.filter(pk=session_id).select_related("config", "space").first()
    runtime = Runtime()
    if session is None or runtime.deleted(session):
        return "the session was deleted", CLOSE_SESSION_DELETED
    if sandbox_id and _sandbox_gone(session, sandbox_id):
        if runtime.deleted(session):
            return "the session was deleted", CLOSE_SESSION_DELETED
        return "the sandbox is gone", CLOSE_NORMAL
    session.refresh_from_db(fields=["state"])
    if session.state in ("paused", "stopped"):
        return f"the sandbox was {session.get_state_display().lower()}", CLOSE_NORMAL
    return "the shell exited", CLOSE_NORMAL


def _sandbox_gone(session: Session, sandbox_id: str) -> bool:
    """Gone, or on its way out: not found, stopped or going, or still called running while it
    runs no command. A removal kills the shell a moment before the engine records the kill,
    so a running sandbox is asked to run `true` before the shell is said to have exited.

    A `true` that fails is no verdict by itself: a sandbox that runs on may start no command
    (every process slot taken, an engine too slow for the probe). The engine is watched for a
    moment then: gone once it records the sandbox gone or stopped, else running (or paused)."""
    backend = get_backend(session.config)
    try:
        state: SandboxState | None = backend.get(sandbox_id, timeout_s=10).state
    except RemoteError as exc:
        return exc.kind == ErrorKind.NOT_FOUND
    if state != SandboxState.RUNNING:
        return state in (SandboxState.STOPPED, SandboxState.GONE)
    try:
        if backend.exec(sandbox_id, ExecRequest(argv=("true",), timeout_s=ALIVE_PROBE_S)).exit_code == 0:
            return False
    except RemoteError:
        pass
    deadline = time.monotonic() + GOING_WATCH_S
    while state == SandboxState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
        state = _state(backend, sandbox_id)
    return state in (None, SandboxState.STOPPED, SandboxState.GONE)


def _state(backend: Backend, sandbox_id: str) -> SandboxState | None:
    """The sandbox's state; None when the engine has no such sandbox, RUNNING when it does
    not answer in time (nothing is said gone on a failed look)."""
    try:
        return backend.get(sandbox_id, timeout_s=GOING_WATCH_S).state
    except RemoteError as exc:
        return None if exc.kind == ErrorKind.NOT_FOUND else SandboxState.RUNNING
