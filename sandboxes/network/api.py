"""Agent API routes about the space's network: "would this destination be allowed, and by
which rule, and what would a refusal of it offer?" (`GET spaces/{space_id}/network/explain`),
answered as on the policy page (`advice.explain_for`). Reads only; names are
matched, never resolved.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from console.models import Space
from netpolicy import PolicyError, parse_destination

from ..api.views import api_view
from ..api.wire import ApiError
from ..models import Session
from .advice import explain_for


@api_view("GET")
def explain_view(request: HttpRequest, space: Space) -> HttpResponse:
    text = request.GET.get("destination", "")
    try:
        target = parse_destination(text)
    except PolicyError as exc:
        raise ApiError(400, "invalid", str(exc), field="destination") from None
    session = None
    key = request.GET.get("session", "")
    if key:
        session = Session.objects.filter(space=space, key=key).first()
        if session is None:
            raise ApiError(404, "not_found", f"No session {key!r} in this space.")
    return JsonResponse(explain_for(space, target, session).as_json())
