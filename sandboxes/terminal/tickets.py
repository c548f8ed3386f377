"""Web terminals: tickets, access, audit and the revocation signals (the PTY owner is `process`).

The websocket consumer (`sandboxes.terminal.consumer.TerminalConsumer`) is thin; this module holds:

- tickets: `issue_ticket(terminal)` signs {user, terminal, nonce} with a TimestampSigner;
  `admit(user, terminal_id, ticket)` checks signature, age, user, terminal, space role and
  redeems the nonce (single use) in the database;
- what the PTY owner (`process.TerminalProcess`) needs of the database: the audit of
  open and close (once per terminal, however many processes served it), the session's
  activity, opening the PTY through the runtime onto the shell the sandbox keeps (`keeper`);
- the per-user channel-layer group and the signals that, once their transaction has
  committed, close terminals on logout or make them re-check access (a membership changed
  or was removed, the user was deactivated or changed password, their login sessions were
  ended). Only these control events cross the channel layer, never PTY bytes;
Nothing here branches on the backend's kind: only on the capabilities the contract offers.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import Http404
from django.utils import timezone

from console.access import get_space_for_user
from console.models import AuditAction, Membership, Role
from console.services import Actor, record_audit
from console.signals import login_sessions_ended

from ..backends.base import ErrorKind, PtySize, RemoteError
from ..backends.capabilities import PtyHandle
from ..catalog.bridge import get_backend
from ..models import Session, Terminal
from ..sessions.inflight import in_flight
from ..sessions.runtime import Runtime
from . import keeper

logger = logging.getLogger(__name__)

TICKET_SALT = "sandboxes.terminal.ticket"
SHELL = ("bash", "-l")
READ_BYTES = 64 * 1024
QUEUE_CHUNKS = 32  # reader -> sender; at most QUEUE_CHUNKS * READ_BYTES in flight
MAX_PENDING_INPUT = 64 * 1024  # typed before the shell started

# Close codes after accept (before accept a refusal is a 403 on the handshake).
CLOSE_NORMAL = 1000
CLOSE_IDLE = 4000
CLOSE_LOGGED_OUT = 4001
CLOSE_ACCESS = 4003
CLOSE_REPLACED = 4009
CLOSE_UNAVAILABLE = 4010
CLOSE_SERVER_STOPPING = 4012  # (1001 is the server's own: Autobahn refuses it from the app)
# Refusals before accept (seen by test clients; browsers see 1006).
REFUSE_TICKET = 4401
REFUSE_FORBIDDEN = 4403
REFUSE_NOT_FOUND = 4404


def user_group(user_id: object) -> str:
    return f"terminals.user.{user_id}"


# --- Tickets and access ------------------------------------------------------------------------


class Refused(Exception):
    """The websocket handshake is refused (closed before accept) with this code."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class Grant:
    """What an admitted websocket may do."""

    terminal_id: str
    session_id: str
    space_id: str
    user_id: int
    read_only: bool
    # The user's session auth hash when admitted: it changes with the password.
    auth_hash: str = ""
    # The login session the websocket came with: ended by logout or "log out everywhere".
    login_session: str | None = None


def can_open_terminals(user: Any, session: Session) -> bool:
    try:
        get_space_for_user(user, session.space_id, Role.MEMBER)
    except (Http404, PermissionDenied):
        return False
    return True


def create_terminal(user: Any, session: Session) -> Terminal:
    """A terminal row for `user` (a member or admin: the caller checked). Opening is audited
    when its shell starts, not here."""
    return Terminal.objects.create(session=session, user=user)


def issue_ticket(terminal: Terminal) -> str:
    """A new single-use ticket for `terminal`; any earlier unredeemed ticket stops working."""
    nonce = secrets.token_urlsafe(24)
    Terminal.objects.filter(pk=terminal.pk).update(ticket_nonce=nonce)
    terminal.ticket_nonce = nonce
    return signing.TimestampSigner(salt=TICKET_SALT).sign_object(
        {"u": terminal.user_id, "t": str(terminal.id), "n": nonce}
    )


def admit(user: Any, terminal_id: str, ticket: str, login_session: str | None = None) -> Grant:
    """Check everything the handshake needs, then redeem the ticket. Raises Refused."""
    if user is None or not user.is_authenticated or not user.is_active:
        raise Refused(REFUSE_FORBIDDEN, "not logged in")
    if not ticket:
        raise Refused(REFUSE_TICKET, "no ticket")
    try:
        data = signing.TimestampSigner(salt=TICKET_SALT).unsign_object(
            ticket, max_age=settings.TERMINAL_TICKET_MAX_AGE_S
        )
    except signing.SignatureExpired:
        raise Refused(REFUSE_TICKET, "ticket expired") from None
    except signing.BadSignature:
        raise Refused(REFUSE_TICKET, "bad ticket") from None
    if not isinstance(data, dict) or data.get("u") != user.pk or data.get("t") != str(terminal_id):
        raise Refused(REFUSE_FORBIDDEN, "ticket for another user or terminal")
    terminal = Terminal.objects.select_related("session").filter(pk=terminal_id, user=user).first()
    if terminal is None:
        raise Refused(REFUSE_NOT_FOUND, "no such terminal")
    if terminal.closed is not None:
        raise Refused(REFUSE_NOT_FOUND, "terminal closed")
    try:
        get_space_for_user(user, terminal.session.space_id, Role.MEMBER)
    except Http404:
        raise Refused(REFUSE_NOT_FOUND, "no such terminal") from None
    except PermissionDenied:
        raise Refused(REFUSE_FORBIDDEN, "this needs the member role") from None
    nonce = str(data.get("n") or "")
    redeemed = (
        Terminal.objects.filter(pk=terminal.pk, ticket_nonce=nonce).exclude(ticket_nonce="").update(ticket_nonce="")
    )
    if not redeemed:
        raise Refused(REFUSE_TICKET, "ticket already used")
    return Grant(
        str(terminal.pk),
        str(terminal.session_id),
        str(terminal.session.space_id),
        user.pk,
        terminal.read_only,
        auth_hash=user.get_session_auth_hash(),
        login_session=login_session,
    )


@dataclass(frozen=True)
class Revocation:
    """Why an admitted terminal may no longer run, and the close code that says so."""

    reason: str
    code: int


def login_session_ended(user_id: object, session_key: str) -> bool:
    """True when the login session is gone (logout, "log out everywhere", expiry) or is no
    longer this user's. Cookie-only session engines keep no server state to ask."""
    if settings.SESSION_ENGINE.endswith("signed_cookies"):
        return False
    from importlib import import_module

    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    return bool(store.load().get(SESSION_KEY) != str(user_id))


def revoked(grant: Grant) -> Revocation | None:
    """Re-check an admitted terminal against the committed state: the account, its
    password, its login session and its role in the space. None while it may run on."""
    user = get_user_model().objects.filter(pk=grant.user_id).first()
    if user is None or not user.is_active:
        return Revocation("access revoked: the account was deactivated or deleted", CLOSE_ACCESS)
    if grant.auth_hash and user.get_session_auth_hash() != grant.auth_hash:
        return Revocation("logged out: the password was changed", CLOSE_LOGGED_OUT)
    if grant.login_session and login_session_ended(user.pk, grant.login_session):
        return Revocation("logged out: the login session was ended", CLOSE_LOGGED_OUT)
    try:
        get_space_for_user(user, grant.space_id, Role.MEMBER)
    except Http404:
        return Revocation("access revoked: no longer a member of this space", CLOSE_ACCESS)
    except PermissionDenied:
        return Revocation("access revoked: terminals need the member role", CLOSE_ACCESS)
    return None


# --- Audit ---------------------------------------------------------------------------------


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
        found = keeper.probe(backend, sandbox_id, terminal_id) if settings.TERMINAL_KEEP_SHELLS else keeper.NOT_KEPT
        command = keeper.attach_command(terminal_id, size, SHELL) if found.kept else SHELL
        handle = ptys.open(sandbox_id, size, command=command, user="user", cwd="/workspace")
    return OpenedShell(handle, sandbox_id, found.kept, found.exists, found.scrollback)


def end_kept_shell(session_id: str, sandbox_id: str, terminal_id: str) -> None:
    """End the terminal's shell kept by the sandbox (its tmux session)."""
    session = Session.objects.select_related("config").get(pk=session_id)
    keeper.end(get_backend(session.config), sandbox_id, terminal_id)


# --- Control events over the channel layer ----------------------------------------------------


# How long a change waits to tell the user's terminals (then the keepalive re-check is the fallback).
NOTIFY_TIMEOUT_S = 2.0
# Sends in flight, held so the loop does not drop them (state, not a cache).
_notifying: set[asyncio.Task[None]] = set()


def send_to_user_terminals(user_id: object, event: dict[str, Any]) -> None:
    """The one sync helper that sends to a user's terminals (never PTY bytes)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None

    async def send() -> None:
        # Bounded: a layer that accepts but never answers (a hung Redis) held the request
        # that made the change for minutes. A lost event is caught by the keepalive re-check.
        await asyncio.wait_for(layer.group_send(user_group(user_id), event), NOTIFY_TIMEOUT_S)

    try:
        if loop is not None:  # called from async code (a signal fired in the event loop's thread)
            task = loop.create_task(send())
            _notifying.add(task)  # the loop keeps only a weak reference to its tasks
            task.add_done_callback(_notifying.discard)
        else:
            async_to_sync(send)()
    except Exception:
        logger.exception("could not notify the terminals of user %s", user_id)


def revoke_user_terminals_on_commit(user_id: object, reason: str) -> None:
    """Close every terminal of the user once the current transaction commits."""
    event = {"type": "terminal.revoke", "reason": reason}
    transaction.on_commit(lambda: send_to_user_terminals(user_id, event), robust=True)


def recheck_user_terminals_on_commit(user_id: object) -> None:
    """Make the user's terminals re-check their access once the current transaction commits.

    Sent inside the transaction, the terminals' re-check (on another connection) would read
    the state before the change and let the terminal run until its next keepalive."""
    transaction.on_commit(lambda: send_to_user_terminals(user_id, {"type": "terminal.recheck"}), robust=True)


@receiver(user_logged_out, dispatch_uid="sandboxes.terminal.tickets.logout")
def _close_terminals_on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        revoke_user_terminals_on_commit(user.pk, "logged out")


@receiver(login_sessions_ended, dispatch_uid="sandboxes.terminal.tickets.sessions_ended")
def _close_terminals_on_logout_everywhere(sender: Any, user_id: object, **kwargs: Any) -> None:
    revoke_user_terminals_on_commit(user_id, "logged out everywhere")


@receiver(post_save, sender=Membership, dispatch_uid="sandboxes.terminal.tickets.membership_saved")
@receiver(post_delete, sender=Membership, dispatch_uid="sandboxes.terminal.tickets.membership_deleted")
def _recheck_terminals_on_membership_change(sender: Any, instance: Membership, **kwargs: Any) -> None:
    if kwargs.get("created"):
        return  # a new membership cannot take access away
    recheck_user_terminals_on_commit(instance.user_id)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="sandboxes.terminal.tickets.user_saved")
@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="sandboxes.terminal.tickets.user_deleted")
def _recheck_terminals_on_user_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A deactivation or a password change (any save of the user but a login's stamp)."""
    if kwargs.get("created"):
        return
    if set(kwargs.get("update_fields") or ()) == {"last_login"}:
        return
    recheck_user_terminals_on_commit(instance.pk)
