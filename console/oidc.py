"""Single sign-on with OpenID Connect (mozilla-django-oidc), on when OIDC_RP_CLIENT_ID is set.

Who signs in: the user already linked to the token's subject (OidcIdentity, per issuer);
else the one active user with the claimed email who has no subject at this issuer yet (the
subject is then stored, so the link holds when the email changes); else, with
OIDC_CREATE_USERS, a new user. A user linked to one subject is never signed in as another
subject with the same email: that login fails. Links and creations are audited.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from .models import AuditAction, OidcIdentity
from .services import Actor, record_audit

logger = logging.getLogger(__name__)


def issuer() -> str:
    return str(settings.OIDC_OP_ISSUER)


class ConsoleOIDCBackend(OIDCAuthenticationBackend):
    def verify_claims(self, claims: dict[str, Any]) -> bool:
        if not claims.get("sub") or not claims.get("email"):
            return False
        return claims.get("email_verified", True) is not False

    def filter_users_by_claims(self, claims: dict[str, Any]) -> QuerySet[Any]:
        model = get_user_model()
        linked = OidcIdentity.objects.filter(issuer=issuer(), subject=claims["sub"]).values("user")
        if linked.exists():
            return model.objects.filter(pk__in=linked)
        by_email = model.objects.filter(email__iexact=claims["email"])
        if by_email.filter(oidc_identities__issuer=issuer()).exists():
            # The email belongs to a user signed in by another subject: never merge.
            raise PermissionDenied("this email is linked to another OpenID Connect subject")
        if by_email.count() > 1:
            raise PermissionDenied("several users have this email")
        return by_email

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        if not OidcIdentity.objects.filter(user=user, issuer=issuer()).exists():
            do_link_oidc_identity(user, subject=claims["sub"], source_ip=_ip(self))
        return user

    def create_user(self, claims: dict[str, Any]) -> Any:
        return do_create_oidc_user(claims, source_ip=_ip(self))


# --- Services: the writes a sign-in makes, each audited ------------------------------------


def do_link_oidc_identity(user: Any, *, subject: str, source_ip: str | None) -> OidcIdentity:
    """Link `user` to the token's subject at this issuer (a sign-in matched by email)."""
    with transaction.atomic():
        identity = OidcIdentity.objects.create(user=user, issuer=issuer(), subject=subject)
        record_audit(
            Actor(user=user, source_ip=source_ip),
            AuditAction.USER_OIDC_LINK,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={"username": user.get_username(), "issuer": issuer(), "subject": subject},
        )
    return identity


def do_create_oidc_user(claims: dict[str, Any], *, source_ip: str | None) -> Any:
    """Create the user a first sign-in names (OIDC_CREATE_USERS), linked to its subject."""
    model = get_user_model()
    base = (claims.get("preferred_username") or claims["email"].split("@")[0])[:140]
    username, n = base, 1
    while model.objects.filter(username__iexact=username).exists():
        n += 1
        username = f"{base}-{n}"
    with transaction.atomic():
        user = model(username=username, email=claims["email"], first_name=claims.get("given_name", "")[:150])
        user.last_name = claims.get("family_name", "")[:150]
        user.set_unusable_password()
        user.save()
        OidcIdentity.objects.create(user=user, issuer=issuer(), subject=claims["sub"])
        record_audit(
            Actor(user=user, source_ip=source_ip),
            AuditAction.USER_CREATE,
            target_type="user",
            target_id=user.pk,
            target_name=user.get_username(),
            details={"username": username, "email": user.email, "oidc_subject": claims["sub"], "issuer": issuer()},
        )
    return user


def _ip(backend: Any) -> str | None:
    request = getattr(backend, "request", None)
    return request.META.get("REMOTE_ADDR") if request is not None else None
