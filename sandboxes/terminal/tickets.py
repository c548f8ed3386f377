"""A terminal's tickets: the row a member's terminal is (`create_terminal`), the single-use
ticket its websocket comes with (`issue_ticket`: {user, terminal, nonce} signed with a
TimestampSigner) and the handshake that checks and redeems it (`admit`: signature, age, user,
terminal, the space role, then the nonce in the database). What an admitted websocket may do
is its `Grant`; whether it still may is `access`, its shell `shells`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Q
from django.http import Http404
from django.utils import timezone

from console.access import get_space_for_user
from console.models import Role

from ..models import Session, Terminal
from .protocol import REFUSE_FORBIDDEN, REFUSE_NOT_FOUND, REFUSE_TICKET
from .tuning import TERMINAL

TICKET_SALT = "sandboxes.terminal.ticket"


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


class TooManyShells(Exception):
    """The session holds `terminal.max_per_session` terminals already."""

    def __init__(self) -> None:
        most = TERMINAL.max_per_session
        super().__init__(f"This session has at most {most} shells open at once: close one first.")


def create_terminal(user: Any, session: Session) -> Terminal:
    """A terminal row for `user` (a member or admin: the caller checked), within the session's
    bound (`TooManyShells`). Opening is audited when its shell starts, not here."""
    with transaction.atomic():
        Session.objects.select_for_update().filter(pk=session.pk).values_list("pk", flat=True).first()
        check_room_for(session)
        return Terminal.objects.create(session=session, user=user)


def check_room_for(session: Session, terminal: Terminal | None = None) -> None:
    """`TooManyShells` unless the session has room for one more terminal (or for `terminal`,
    one whose unredeemed ticket ran out: its place was given up). A terminal holds a place
    from its creation until it closes, except one never opened once its ticket ran out."""
    fresh = timezone.now() - timedelta(seconds=TERMINAL.ticket_max_age_s)
    holding = Terminal.objects.filter(session=session, closed__isnull=True).filter(
        Q(opened__isnull=False) | Q(created__gte=fresh)
    )
    if terminal is not None:
        holding = holding.exclude(pk=terminal.pk)
    if holding.count() >= TERMINAL.max_per_session:
        raise TooManyShells()


def reticket_room(terminal: Terminal) -> None:
    """Before a new ticket for `terminal`: one never opened holds its place for the new
    ticket's age (its `created` moves on; `TooManyShells` when its place was given up and
    none is free). An opened one holds its place until it closes."""
    if terminal.opened is not None:
        return
    with transaction.atomic():
        Session.objects.select_for_update().filter(pk=terminal.session_id).values_list("pk", flat=True).first()
        check_room_for(terminal.session, terminal)
        Terminal.objects.filter(pk=terminal.pk).update(created=timezone.now())


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
        data = signing.TimestampSigner(salt=TICKET_SALT).unsign_object(ticket, max_age=TERMINAL.ticket_max_age_s)
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
