"""Writes with side effects for user accounts: create and invite, accept an invitation,
deactivate and reactivate. Platform admins call these (the views check); each records one
audit event.

An invitation is a one-time link: its token is random, only its SHA-256 is stored, it works
once and until users.invite_link_hours have passed. Deactivating a user ends their login sessions
and (once committed) closes their terminals, as "log out everywhere" does, and revokes the
credentials they made (each audited) unless the platform admin keeps them: the apps that
issue credentials (sandboxes: the agent API's tokens) register a `CredentialSource`, since
this app imports nothing of them.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import UNUSABLE_PASSWORD_PREFIX
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from .models import AuditAction, Invitation, users_with_email
from .services import Actor, ServiceError, end_login_sessions, record_audit
from .tuning import USERS

logger = logging.getLogger(__name__)


class UserStatus:
    ACTIVE = "active"
    INVITED = "invited"
    DEACTIVATED = "deactivated"
    CHOICES = ((ACTIVE, "Active"), (INVITED, "Invited"), (DEACTIVATED, "Deactivated"))


def _invited_q() -> Q:
    """Active, has never logged in and has no password yet: waiting for their invitation."""
    return Q(is_active=True, last_login__isnull=True, password__startswith=UNUSABLE_PASSWORD_PREFIX)


def filter_by_status(users: QuerySet[Any], status: str) -> QuerySet[Any]:
    if status == UserStatus.DEACTIVATED:
        return users.filter(is_active=False)
    if status == UserStatus.INVITED:
        return users.filter(_invited_q())
    if status == UserStatus.ACTIVE:
        return users.filter(is_active=True).exclude(_invited_q())
    return users


def user_status(user: Any) -> str:
    if not user.is_active:
        return UserStatus.DEACTIVATED
    if user.last_login is None and not user.has_usable_password():
        return UserStatus.INVITED
    return UserStatus.ACTIVE


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invite_lifetime() -> timedelta:
    return timedelta(hours=float(USERS.invite_link_hours))


@dataclass(frozen=True)
class IssuedInvite:
    invitation: Invitation
    token: str
    emailed: bool = False

    def path(self) -> str:
        return reverse("console:invite_accept", kwargs={"token": self.token})


def _issue(user: Any, actor: Actor) -> tuple[Invitation, str]:
    """A new invitation for `user`; any earlier unused one stops working. In a transaction."""
    now = timezone.now()
    Invitation.objects.filter(user=user, used__isnull=True, revoked__isnull=True).update(revoked=now)
    token = secrets.token_urlsafe(32)
    invitation = Invitation.objects.create(
        user=user, token_hash=hash_token(token), created_by=actor.user, expires=now + invite_lifetime()
    )
    return invitation, token


def _email_invite(user: Any, link: str, expires: Any) -> bool:
    """Send the link through Django's email backend when email is configured (INVITE_EMAIL)."""
    if not settings.INVITE_EMAIL or not user.email:
        return False
    try:
        send_mail(
            "Your Sandbox Console account",
            f"You have been invited to Sandbox Console as {user.get_username()}.\n\n"
            f"Choose your password here (the link works once, until {expires:%Y-%m-%d %H:%M} UTC):\n{link}\n",
            None,
            [user.email],
        )
    except Exception:
        logger.warning("could not email the invitation of %s", user.get_username(), exc_info=True)
        return False
    return True


def _refuse_taken(model: Any, username: str, email: str) -> None:
    """A field error when another user has `username` or `email` (both ignoring case)."""
    if model.objects.filter(username__iexact=username).exists():
        message = f"There is already a user named {username!r}."
        raise ServiceError(message, field_errors={"username": [message]})
    if email and users_with_email(email).exists():
        # Sign-in by email (OIDC) and adding members by email need one user per address.
        message = f"Another user has the email {email!r}."
        raise ServiceError(message, field_errors={"email": [message]})


def do_create_user(
    *,
    username: str,
    email: str = "",
    first_name: str = "",
    last_name: str = "",
    platform_admin: bool = False,
    actor: Actor,
    base_url: str = "",
) -> IssuedInvite:
    """Create a user without a password and invite them. `base_url` ("https://host") makes
    the emailed link absolute."""
    model = get_user_model()
    username = username.strip()
    email = email.strip()
    if not username:
        raise ServiceError("Give the user a username.", field_errors={"username": ["Give the user a username."]})
    _refuse_taken(model, username, email)
    user = model(
        username=username,
        email=email,
        first_name=first_name.strip(),
        last_name=last_name.strip(),
        is_superuser=platform_admin,
        is_staff=False,
    )
    try:
        user.full_clean(exclude=["password"])
    except ValidationError as exc:
        raise ServiceError("The user is not valid.", field_errors=exc.message_dict) from None
    user.set_unusable_password()
    with transaction.atomic():
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:
            # Another request created this name or address between the check and the save:
            # the database's unique indexes decide (console migration 0014 for emails), and
            # the answer is the check's.
            _refuse_taken(model, username, email)
            raise
        invitation, token = _issue(user, actor)
        record_audit(
            actor,
            AuditAction.USER_CREATE,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={
                "username": user.get_username(),
                "email": email,
                "platform_admin": platform_admin,
                "invitation": str(invitation.id),
                "invitation_expires": invitation.expires.isoformat(),
            },
        )
    issued = IssuedInvite(invitation, token)
    emailed = _email_invite(user, base_url + issued.path(), invitation.expires)
    return IssuedInvite(invitation, token, emailed)


def do_reissue_invite(user: Any, *, actor: Actor, base_url: str = "") -> IssuedInvite:
    """A new link for a user still waiting for theirs (the earlier link stops working)."""
    if user_status(user) != UserStatus.INVITED:
        raise ServiceError(f"{user.get_username()} has already set a password or is deactivated.")
    with transaction.atomic():
        invitation, token = _issue(user, actor)
        record_audit(
            actor,
            AuditAction.USER_INVITE,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={
                "username": user.get_username(),
                "invitation": str(invitation.id),
                "invitation_expires": invitation.expires.isoformat(),
            },
        )
    issued = IssuedInvite(invitation, token)
    emailed = _email_invite(user, base_url + issued.path(), invitation.expires)
    return IssuedInvite(invitation, token, emailed)


def usable_invitation(token: str) -> Invitation | None:
    """The invitation `token` opens, if it is unused, unrevoked, unexpired and its user active."""
    invitation = (
        Invitation.objects.select_related("user")
        .filter(token_hash=hash_token(token), used__isnull=True, revoked__isnull=True, expires__gt=timezone.now())
        .first()
    )
    if invitation is None or not invitation.user.is_active:
        return None
    return invitation


def do_accept_invite(token: str, *, password: str, source_ip: str | None = None) -> Any:
    """Set the invited user's password (validated by the caller's SetPasswordForm) and use up
    the link. Returns the user. Raises ServiceError when the link no longer works."""
    with transaction.atomic():
        invitation = (
            Invitation.objects.select_for_update().select_related("user").filter(token_hash=hash_token(token)).first()
        )
        if (
            invitation is None
            or invitation.used is not None
            or invitation.revoked is not None
            or invitation.expires <= timezone.now()
            or not invitation.user.is_active
        ):
            raise ServiceError("This invitation link has expired or was already used. Ask an admin for a new one.")
        user = invitation.user
        user.set_password(password)
        user.save(update_fields=["password"])
        invitation.used = timezone.now()
        invitation.save(update_fields=["used"])
        record_audit(
            Actor(user=user, source_ip=source_ip),
            AuditAction.USER_INVITE_ACCEPT,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={"username": user.get_username(), "invitation": str(invitation.id)},
        )
    return user


# --- Credentials a user made (revoked with them) ------------------------------------------


@dataclass(frozen=True)
class HeldCredential:
    """One credential in force that a user made, as the deactivate page lists it."""

    kind: str  # "API token"
    label: str  # its name and recognisable prefix
    space_name: str = ""


@dataclass(frozen=True)
class CredentialSource:
    """How an app lists the credentials in force a user made, and revokes them (each with its
    own audit event, inside the caller's transaction); `revoke` returns how many went."""

    held_by: Callable[[Any], list[HeldCredential]]
    revoke: Callable[[Any, Actor], int]


# A registry each app fills when ready (not a cache: nothing to measure).
_credential_sources: dict[str, CredentialSource] = {}


def register_credential_source(name: str, source: CredentialSource) -> None:
    _credential_sources[name] = source


def credentials_held_by(user: Any) -> list[HeldCredential]:
    return [credential for source in _credential_sources.values() for credential in source.held_by(user)]


@dataclass(frozen=True)
class Deactivated:
    sessions_ended: int
    credentials_revoked: int
    credentials_kept: int


def do_deactivate_user(user: Any, *, actor: Actor, keep_credentials: bool = False) -> Deactivated:
    """Deactivate `user`: they cannot log in, their login sessions end and their terminals
    close (the terminals' signals, once committed); the credentials they made (API tokens) are
    revoked, each audited, unless `keep_credentials` (the agents using them keep working)."""
    if actor.user is not None and actor.user.pk == user.pk:
        raise ServiceError("You cannot deactivate yourself.")
    if not user.is_active:
        raise ServiceError(f"{user.get_username()} is already deactivated.")
    model = get_user_model()
    with transaction.atomic():
        locked = model.objects.select_for_update().get(pk=user.pk)
        if locked.is_superuser and not model.objects.filter(is_superuser=True, is_active=True).exclude(pk=user.pk):
            raise ServiceError("The platform keeps at least one active platform admin.")
        locked.is_active = False
        locked.save(update_fields=["is_active"])
        Invitation.objects.filter(user=locked, used__isnull=True, revoked__isnull=True).update(revoked=timezone.now())
        ended = end_login_sessions(locked)
        revoked = kept = 0
        if keep_credentials:
            kept = len(credentials_held_by(locked))
        else:
            revoked = sum(source.revoke(locked, actor) for source in _credential_sources.values())
        record_audit(
            actor,
            AuditAction.USER_DEACTIVATE,
            target_type="user",
            target_id=locked.pk,
            target_name=locked.get_username(),
            details={
                "username": locked.get_username(),
                "sessions_ended": ended,
                "credentials_revoked": revoked,
                "credentials_kept": kept,
            },
        )
    return Deactivated(sessions_ended=ended, credentials_revoked=revoked, credentials_kept=kept)


def do_reactivate_user(user: Any, *, actor: Actor) -> None:
    if user.is_active:
        raise ServiceError(f"{user.get_username()} is already active.")
    model = get_user_model()
    with transaction.atomic():
        locked = model.objects.select_for_update().get(pk=user.pk)
        locked.is_active = True
        locked.save(update_fields=["is_active"])
        record_audit(
            actor,
            AuditAction.USER_REACTIVATE,
            target_type="user",
            target_id=locked.pk,
            target_name=locked.get_username(),
            details={"username": locked.get_username()},
        )
