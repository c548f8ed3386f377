"""Pages of a space's API tokens: list, create, revoke."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.access import get_space_for_user
from console.models import Role
from console.panels import SpaceAction
from console.services import ServiceError, actor_from_request
from console.tuning import LIMITS

from ..models import ApiToken
from .tokens import do_create_api_token, do_revoke_api_token

# --- API tokens --------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def token_list(request: HttpRequest, space_id: str) -> HttpResponse:
    """A space's agent API tokens. A new token's secret is shown on this response only."""
    space = get_space_for_user(request.user, space_id, Role.ADMIN)
    created_secret = name_error = name_value = ""
    if request.method == "POST":
        try:
            _, created_secret = do_create_api_token(
                space, name=request.POST.get("name", ""), actor=actor_from_request(request)
            )
        except ServiceError as exc:
            if "name" in exc.field_errors:  # shown at the field, with what was typed
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
        "name_error": name_error,
        "name_value": name_value,
        "section": "spaces",
    }
    response = render(request, "sandboxes/token_list.html", context)
    if created_secret:
        response["Cache-Control"] = "no-store"
    return response


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
