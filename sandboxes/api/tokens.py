"""API tokens: the services that create and revoke a space's tokens, each audited.

A token's plaintext is shown once and only its SHA-256 is stored; `sandboxes.api.auth`
authenticates calls against it. The deactivate page reads and revokes a user's tokens
through `api_tokens_made_by` and `revoke_api_tokens_made_by` (registered in apps.py).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import transaction
from django.utils import timezone

from console.models import AuditAction, Space
from console.services import Actor, ServiceError, record_audit
from console.tuning import LIMITS
from console.users import HeldCredential

from ..models import ApiToken

TOKEN_PREFIX = "sck_"  # noqa: S105 - a public marker, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def do_create_api_token(space: Space, *, name: str, actor: Actor) -> tuple[ApiToken, str]:
    """Create a token; the plaintext is returned once and never stored. A space holds at most
    limits.api_tokens_per_space tokens in force (revoked ones do not count)."""
    name = name.strip()
    if not name:
        raise ServiceError("Give the token a name.", field_errors={"name": ["required"]})
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
        )
        record_audit(
            actor,
            AuditAction.API_TOKEN_CREATE,
            space=space,
            target_type="api_token",
            target_id=token.id,
            target_name=token.name,
            details={"name": token.name, "prefix": token.prefix},
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
