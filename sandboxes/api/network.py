"""Agent API routes about the space's network: "would this destination be allowed, and by
which rule?" (`GET spaces/{space_id}/network/explain`), answered through every layer as on
the policy page (sandboxes.egress.explain). Reads only; names are matched, never resolved.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from console.models import Space

from ..catalog.network import network_spec_for
from ..egress.checks import backend_views
from ..egress.explain import explain, parse_target
from ..models import Session
from .views import api_view
from .wire import ApiError


@api_view("GET")
def explain_view(request: HttpRequest, space: Space) -> HttpResponse:
    text = request.GET.get("destination", "")
    try:
        target = parse_target(text)
    except ValueError as exc:
        raise ApiError(400, "invalid", str(exc), field="destination") from None
    session = None
    key = request.GET.get("session", "")
    if key:
        session = Session.objects.filter(space=space, key=key).first()
        if session is None:
            raise ApiError(404, "not_found", f"No session {key!r} in this space.")
    space_spec = network_spec_for(space)
    session_spec = network_spec_for(space, session) if session is not None else None
    grants = tuple(session.egress_grants.values_list("entry", flat=True)) if session is not None else ()
    answer = explain(
        target,
        space_spec,
        session_spec=session_spec,
        grants=grants,
        backends=tuple(backend_views(space, session_spec or space_spec)),
    )
    return JsonResponse(answer.as_json())
