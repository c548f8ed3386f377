"""API tokens: the services that create and revoke a space's tokens, each audited.

A token's plaintext is shown once and only its SHA-256 is stored; `sandboxes.api.auth`
authenticates calls against it. The deactivate page reads and revokes a user's tokens
through `api_tokens_made_by` and `revoke_api_tokens_made_by` (registered in apps.py).
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from console.models import AuditAction, Space
from console.services import Actor, ServiceError, record_audit
from console.tuning import LIMITS
from console.users import HeldCredential

from ..models import ApiToken, TokenScope

TOKEN_PREFIX = "sck_"  # noqa: S105 - a public marker, not a secret

# What each scope may call, by HTTP method: read-only the GET routes (every read: the session,
# files, artifacts, commands and their output, inbound, network explain); run adds the POST
# and PUT routes within a session (resolve, pause, turns, exec, background commands, file and
# input uploads, artifact collection, inbound links); full adds DELETE (deleting a session).
SCOPE_METHODS: dict[str, frozenset[str]] = {
    TokenScope.READ: frozenset({"GET", "HEAD"}),
    TokenScope.RUN: frozenset({"GET", "HEAD", "POST", "PUT", "PATCH"}),
    TokenScope.FULL: frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"}),
}
SCOPE_SAYS: dict[str, str] = {
    TokenScope.READ: "reads only (GET)",
    TokenScope.RUN: "reads, and runs within sessions (GET, POST, PUT, PATCH): no session deletion",
    TokenScope.FULL: "every route, deleting sessions included",
}


class TokenExpired(Exception):
    """A token past its expiry (the API answers 401 token_expired)."""

    def __init__(self, token: ApiToken) -> None:
        super().__init__(f"API token {token.name} ({token.prefix}…) expired; make a new one.")
        self.token = token


class OutOfScope(Exception):
    """A call its token's scope does not allow (the API answers 403 out_of_scope)."""

    def __init__(self, token: ApiToken, method: str) -> None:
        super().__init__(
            f"API token {token.name} is {token.get_scope_display()}: it may call {SCOPE_SAYS[token.scope]},"
            f" not {method}. Use a token of a wider scope."
        )
        self.token, self.method = token, method


def check_token_use(token: ApiToken, method: str, now: datetime) -> None:
    """Raise `TokenExpired` or `OutOfScope` when `token` may not make a `method` call at `now`."""
    if token.expires is not None and token.expires <= now:
        raise TokenExpired(token)
    if method.upper() not in SCOPE_METHODS.get(token.scope, frozenset()):
        raise OutOfScope(token, method.upper())


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def do_create_api_token(
    space: Space,
    *,
    name: str,
    actor: Actor,
    scope: str = TokenScope.FULL,
    expires: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token of `scope` (a `TokenScope`), refused from `expires` on (never when None);
    the plaintext is returned once and never stored. A space holds at most
    limits.api_tokens_per_space tokens in force (revoked ones do not count)."""
    name = name.strip()
    if not name:
        raise ServiceError("Give the token a name.", field_errors={"name": ["required"]})
    if scope not in TokenScope.values:
        choices = ", ".join(TokenScope.values)
        raise ServiceError(f"Choose a scope: one of {choices}.", field_errors={"scope": [f"one of {choices}"]})
    if expires is not None and expires <= timezone.now():
        raise ServiceError("The expiry must be in the future.", field_errors={"expires": ["in the past"]})
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    maximum = LIMITS.api_tokens_per_space
    with transaction.atomic():
        # The space row's lock makes two creations at once count each other.
        Space.objects.select_for_update().filter(pk=space.pk).first()
        in_force = ApiToken.objects.filter(space=space, revoked__isnull=True).count()
        if ApiToken.objects.filter(space=space, revoked__isnull=True, name__iexact=name[:100]).exists():
            message = f"A token named {name[:100]!r} is in force in this space: choose another name or revoke it."
            raise ServiceError(message, field_errors={"name": [message]})
        if in_force >= maximum:
            raise ServiceError(
                f"This space already has {in_force} API tokens in force, the most a space may hold "
                f"({maximum}); revoke one it no longer uses first.",
                field_errors={"name": [f"at most {maximum} tokens in force per space"]},
            )
        token = ApiToken.objects.create(
            space=space,
            name=name[:100],
            prefix=plaintext[: len(TOKEN_PREFIX) + 6],
            token_hash=hash_token(plaintext),
            created_by=actor.user,
            scope=scope,
            expires=expires,
        )
        record_audit(
            actor,
            AuditAction.API_TOKEN_CREATE,
            space=space,
            target_type="api_token",
            target_id=token.id,
            target_name=token.name,
            details={
                "name": token.name,
                "prefix": token.prefix,
                "scope": token.scope,
                "expires": expires.isoformat() if expires else None,
            },
        )
    return token, plaintext


def do_revoke_api_token(token: ApiToken, *, actor: Actor, reason: str = "") -> ApiToken:
    if token.revoked is not None:
        raise ServiceError("This token is already revoked.")
    details = {"name": token.name, "prefix": token.prefix, **({"reason": reason} if reason else {})}
    with transaction.atomic():
        token.revoked = timezone.now()
        token.save(update_fields=["revoked"])
        record_audit(
            actor,
            AuditAction.API_TOKEN_REVOKE,
            space=token.space,
            target_type="api_token",
            target_id=token.id,
            target_name=token.name,
            details=details,
        )
    return token


def api_tokens_made_by(user: Any) -> list[HeldCredential]:
    """The tokens in force `user` made, for the deactivate page (console.users)."""
    tokens = ApiToken.objects.filter(created_by=user, revoked__isnull=True).select_related("space")
    return [HeldCredential("API token", f"{t.name} ({t.prefix}…)", t.space.name) for t in tokens.order_by("created")]


def revoke_api_tokens_made_by(user: Any, actor: Actor) -> int:
    """Revoke the tokens in force `user` made, each audited, as their maker is deactivated."""
    tokens = ApiToken.objects.select_for_update().filter(created_by=user, revoked__isnull=True).select_related("space")
    revoked = 0
    for token in tokens:
        do_revoke_api_token(token, actor=actor, reason=f"{user.get_username()} was deactivated")
        revoked += 1
    return revoked
