"""The agent API's inbound routes: the URL of a port of the session's sandbox (with the
traffic token and the header it goes in), and signed links for browsers."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from console.crypto import decrypt
from console.models import Space

from ..inbound.links import do_issue_inbound_link, inbound_on, inbound_url
from .views import actor, api_view, existing_session
from .wire import ApiError, field_of, int_param, json_body


def _port(value: int | None) -> int:
    if value is None:
        raise ApiError(400, "invalid", "'port' is required.", field="port")
    if not 1 <= value <= 65535:
        raise ApiError(400, "invalid", "'port' is from 1 to 65535.", field="port")
    return value


@api_view("GET")
def inbound_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    port = _port(int_param(request, "port"))
    url = inbound_url(session, port)
    return JsonResponse(
        {
            "port": port,
            "url": request.build_absolute_uri(url.url),
            "token_header": url.token_header or None,
            "traffic_token": decrypt(session.traffic_token_encrypted) or None,
            "signed_links": url.signed_links,
            "inbound_on": inbound_on(space.pk),
        }
    )


@api_view("POST")
def inbound_link_view(request: HttpRequest, space: Space, key: str) -> HttpResponse:
    session = existing_session(space, key)
    data = json_body(request)
    port = _port(field_of(data, "port", int, required=True))
    ttl_s = field_of(data, "ttl_s", int)
    link, expires_at = do_issue_inbound_link(
        session, port, settings.INBOUND_LINK_DEFAULT_TTL_S if ttl_s is None else ttl_s, actor=actor(request)
    )
    return JsonResponse({"port": port, "url": request.build_absolute_uri(link), "expires_at": expires_at}, status=201)
