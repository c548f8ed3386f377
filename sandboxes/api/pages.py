"""Pages of a space's API tokens: list, create, revoke."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from console.access import get_space_for_user
from console.models import Role
from console.panels import SpaceAction
from console.services import ServiceError, actor_from_request
from console.tuning import LIMITS

from ..models import ApiToken, TokenScope
from .tokens import SCOPE_SAYS, do_create_api_token, do_revoke_api_token

# The expiries the form offers, in days ("" is never).
EXPIRY_DAYS = (1, 7, 30, 90, 365)

# --- API tokens --------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest, space_id: str) -> HttpResponse:
    """A space's agent API tokens. A new token's secret is shown on this response only."""
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    created_secret = name_error = name_value = ""
    created: ApiToken | None = None
    typed = {
        "scope": request.POST.get("scope", TokenScope.RUN),
        "expires_in_days": request.POST.get("expires_in_days", ""),
    }
    if request.method == "POST":
        try:
            created, created_secret = do_create_api_token(
                space,
                name=request.POST.get("name", ""),
                actor=actor_from_request(request),
                scope=typed["scope"],
                expires=_expiry(typed["expires_in_days"]),
            )
        except ServiceError as exc:
            if exc.field_errors:  # shown at the form, with what was typed
                name_error, name_value = exc.message, request.POST.get("name", "")[:100]
            else:
                messages.error(request, exc.message)
    tokens = list(ApiToken.objects.filter(space=space).select_related("created_by").order_by("-created"))
    context = {
        "space": space,
        "tokens": tokens,
        "tokens_in_force": sum(1 for t in tokens if t.revoked is None),
        "token_limit": LIMITS.api_tokens_per_space,
        "created_secret": created_secret,
        "created": created,
        "curl_example": _curl_example(request, space.id, created, created_secret) if created else "",
        "scopes": [(value, label, SCOPE_SAYS[value]) for value, label in TokenScope.choices],
        "expiry_days": EXPIRY_DAYS,
        "typed": typed,
        "now": timezone.now(),
        "name_error": name_error,
        "name_value": name_value,
        "section": "spaces",
    }
    response = render(request, "sandboxes/token_list.html", context)
    if created_secret:
        response["Cache-Control"] = "no-store"
    return response


def _expiry(days: str) -> Any:
    """The moment `days` (one of EXPIRY_DAYS, or "" for never) from now."""
    if not days:
        return None
    if not days.isdigit() or int(days) not in EXPIRY_DAYS:
        offered = ", ".join(str(d) for d in EXPIRY_DAYS)
        raise ServiceError(f"Choose an expiry of {offered} days, or never.", field_errors={"expires": ["not offered"]})
    return timezone.now() + timedelta(days=int(days))


def _curl_example(request: HttpRequest, space_id: Any, token: ApiToken, secret: str) -> str:
    """A command that works as pasted: this console's address, the space, the new token; a
    call its scope allows (a read for read-only, a resolve otherwise)."""
    base = request.build_absolute_uri("/").rstrip("/")
    url = f"{base}/api/v1/spaces/{space_id}/sessions/demo"
    if token.scope == TokenScope.READ:
        return f"curl -sS -H 'Authorization: Bearer {secret}' '{url}'"
    return f"curl -sS -X POST -H 'Authorization: Bearer {secret}' '{url}/resolve'"


@login_required
@require_http_methods(["GET", "POST"])
def token_revoke(request: HttpRequest, space_id: str, token_id: str) -> HttpResponse:
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    token = get_object_or_404(ApiToken, pk=token_id, space=space)
    back = reverse("sandboxes:token_list", kwargs={"space_id": space.id})
    if request.method == "POST":
        try:
            do_revoke_api_token(token, actor=actor_from_request(request))
        except ServiceError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"Token {token.name} revoked; agents using it get 401 from now on.")
        return redirect(back)
    return render(
        request,
        "inc/confirm_delete.html",
        {
            "object_label": f"API token {token.name} ({token.prefix}…)",
            "action_label": "Revoke",
            "consequences": ["Agents using it are refused at once. This cannot be undone."],
            "cancel_url": back,
            "section": "spaces",
        },
    )


# The space page's API tokens button (registered in SandboxesConfig.ready()).
SPACE_ACTION = SpaceAction("API tokens", lambda space: reverse("sandboxes:token_list", args=[space.id]), order=30)
