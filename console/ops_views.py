"""/metrics: the Prometheus text format of console/metrics.py, for allowed scrapers only.

A scraper is allowed by either setting (docs/operations.md, "Metrics"):
- METRICS_TOKEN: `Authorization: Bearer <token>` (compared in constant time);
- METRICS_ALLOWED_NETWORKS: the client's address (console.security.client_ip, which honours
  FORWARDED_FOR_PROXIES) lies in one of these CIDRs.
With neither set, /metrics is refused (403), except from loopback when METRICS_ALLOW_LOOPBACK
is on (the development settings) and the request came through no proxy. Reached through
console.health.OpsEndpointsMiddleware, before ALLOWED_HOSTS and TLS redirects.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from . import metrics
from .security import client_ip

logger = logging.getLogger(__name__)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _token_ok(request: HttpRequest) -> bool:
    expected = settings.METRICS_TOKEN
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return (
        bool(expected) and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected.encode())
    )


def _address(request: HttpRequest) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(client_ip(request) or "")
    except ValueError:
        return None


def _network_ok(request: HttpRequest) -> bool:
    address = _address(request)
    if address is None:
        return False
    for network in settings.METRICS_ALLOWED_NETWORKS:
        try:
            if address in ipaddress.ip_network(network, strict=False):
                return True
        except ValueError:
            logger.warning("METRICS_ALLOWED_NETWORKS: %r is not a network", network)
    return False


def _loopback_ok(request: HttpRequest) -> bool:
    """Development: a scrape from this host itself, not relayed by a proxy on this host."""
    if not getattr(settings, "METRICS_ALLOW_LOOPBACK", False) or settings.FORWARDED_FOR_PROXIES:
        return False
    if "HTTP_X_FORWARDED_FOR" in request.META or "HTTP_FORWARDED" in request.META:
        return False
    address = _address(request)
    return address is not None and address.is_loopback


def metrics_allowed(request: HttpRequest) -> bool:
    return _token_ok(request) or _network_ok(request) or _loopback_ok(request)


def metrics_response(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        if settings.METRICS_TOKEN:
            response = JsonResponse({"error": "a bearer token is required"}, status=401)
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
        return JsonResponse({"error": "metrics are not enabled for this address"}, status=403)
    return HttpResponse(metrics.render(), content_type=CONTENT_TYPE)
