"""Who may keep a terminal open: the access check (`can_open_terminals`, `revoked`: the
account, its password, its login session and its role in the space) and what makes open
terminals re-check or close. The per-user channel-layer group and the signals that, once
their transaction has committed, close terminals on logout or make them re-check access (a
membership changed or was removed, the user was deactivated or changed password, their login
sessions were ended). Only these control events cross the channel layer, never PTY bytes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.auth.signals import user_logged_out
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.http import Http404

from console.access import get_space_for_user
from console.models import Membership, Role
from console.signals import login_sessions_ended

from ..models import Session
from .protocol import CLOSE_ACCESS, CLOSE_LOGGED_OUT
from .tickets import Grant

logger = logging.getLogger(__name__)


def user_group(user_id: object) -> str:
    return f"terminals.user.{user_id}"


def can_open_terminals(user: Any, session: Session) -> bool:
    try:
        get_space_for_user(user, session.space_id, Role.MEMBER)
    except (Http404, PermissionDenied):
        return False
    return True


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


@receiver(user_logged_out, dispatch_uid="sandboxes.terminal.access.logout")
def _close_terminals_on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        revoke_user_terminals_on_commit(user.pk, "logged out")


@receiver(login_sessions_ended, dispatch_uid="sandboxes.terminal.access.sessions_ended")
def _close_terminals_on_logout_everywhere(sender: Any, user_id: object, **kwargs: Any) -> None:
    revoke_user_terminals_on_commit(user_id, "logged out everywhere")


@receiver(post_save, sender=Membership, dispatch_uid="sandboxes.terminal.access.membership_saved")
@receiver(post_delete, sender=Membership, dispatch_uid="sandboxes.terminal.access.membership_deleted")
def _recheck_terminals_on_membership_change(sender: Any, instance: Membership, **kwargs: Any) -> None:
    if kwargs.get("created"):
        return  # a new membership cannot take access away
    recheck_user_terminals_on_commit(instance.user_id)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="sandboxes.terminal.access.user_saved")
@receiver(post_delete, sender=settings.AUTH_USER_MODEL, dispatch_uid="sandboxes.terminal.access.user_deleted")
def _recheck_terminals_on_user_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A deactivation or a password change (any save of the user but a login's stamp)."""
    if kwargs.get("created"):
        return
    if set(kwargs.get("update_fields") or ()) == {"last_login"}:
        return
    recheck_user_terminals_on_commit(instance.pk)
