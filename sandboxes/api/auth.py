"""Authentication of the agent API: a space API token (`Authorization: Bearer sck_…`) for the
space the route names, and the space's request rate.

A token of another space answers 404, exactly like an unknown space: it never learns that the
space exists. The caller (`ApiCaller`) is what the views get: the space, and the token for the
audit trail (API calls are recorded under the token's name and its maker).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from console.models import Space
from console.services import Actor

from ..models import ApiToken
from ..sessions.limits import check_api_rate
from .tokens import TOKEN_PREFIX, hash_token
from .wire import ApiError

LAST_USED_WRITE_INTERVAL = timedelta(minutes=1)


@dataclass(frozen=True)
class ApiCaller:
    space: Space
    token: ApiToken
    source_ip: str | None

    @property
    def actor(self) -> Actor:
        return Actor(user=self.token.created_by, source_ip=self.source_ip, token_name=self.token.name)


def authenticate(request: HttpRequest, space_id: Any) -> tuple[Space, ApiToken]:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.startswith(TOKEN_PREFIX):
        raise ApiError(401, "unauthorized", "Send 'Authorization: Bearer sck_…' with a space API token.")
    token = ApiToken.objects.select_related("space").filter(token_hash=hash_token(value.strip())).first()
    if token is None or token.revoked is not None:
        raise ApiError(401, "unauthorized", "Unknown or revoked API token.")
    if str(token.space_id) != str(space_id):
        raise ApiError(404, "not_found", "No such space.")  # never reveal another space
    now = timezone.now()
    if token.last_used is None or now - token.last_used > LAST_USED_WRITE_INTERVAL:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token.space, token


class SpaceToken(HttpBearer):
    """A space API token for the route's space, then the space's request rate (429)."""

    def __call__(self, request: HttpRequest) -> ApiCaller:
        match = request.resolver_match
        space, token = authenticate(request, match.kwargs.get("space_id") if match else None)
        check_api_rate(space)
        return ApiCaller(space=space, token=token, source_ip=request.META.get("REMOTE_ADDR"))

    def authenticate(self, request: HttpRequest, token: str) -> ApiCaller:  # pragma: no cover - see __call__
        return self(request)


def caller(request: HttpRequest) -> ApiCaller:
    """The authenticated caller of an API view."""
    found = getattr(request, "auth", None)
    if not isinstance(found, ApiCaller):
        raise ApiError(401, "unauthorized", "Send 'Authorization: Bearer sck_…' with a space API token.")
    return found
