"""Request-level security helpers: the websocket Origin check and the client address.

The websocket Origin check follows Django's CSRF origin check: a handshake is accepted when
its Origin is the console's own origin as the request names it (scheme, host and port of
the Host header, the host in ALLOWED_HOSTS) or one of WEBSOCKET_ALLOWED_ORIGINS (default:
CSRF_TRUSTED_ORIGINS). Scheme, host and port are all compared; a missing Origin is refused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]


def parse_origin(value: str) -> Origin | None:
    """(scheme, host, port) of an http(s) origin, with the scheme's default port filled in."""
    try:
        parts = urlsplit(value.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return parts.scheme, parts.hostname, port or DEFAULT_PORTS[parts.scheme]


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    return {name.decode("latin1").lower(): value.decode("latin1") for name, value in scope.get("headers", [])}


def _scheme(scope: dict[str, Any], headers: dict[str, str]) -> str:
    """http or https for the handshake, honouring SECURE_PROXY_SSL_HEADER as Django does."""
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, secure_value = proxy_header
        header = name.removeprefix("HTTP_").replace("_", "-").lower()
        if header in headers:
            return "https" if headers[header].split(",")[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def origin_allowed(scope: dict[str, Any]) -> bool:
    headers = _headers(scope)
    origin = parse_origin(headers.get("origin", ""))
    if origin is None:
        return False
    trusted = {parsed for value in settings.WEBSOCKET_ALLOWED_ORIGINS if (parsed := parse_origin(value))}
    if origin in trusted:
        return True
    host = headers.get("host", "")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    return origin == parse_origin(f"{_scheme(scope, headers)}://{host}")


class OriginValidator:
    """ASGI middleware: websocket handshakes from another origin are refused (closed)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("OriginValidator only guards websocket connections")
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)


def client_ip(request: HttpRequest) -> str | None:
    """The client's address for login throttling: REMOTE_ADDR, or, behind FORWARDED_FOR_PROXIES
    trusted proxies, the address the outermost of them saw (X-Forwarded-For)."""
    proxies = settings.FORWARDED_FOR_PROXIES
    remote: str | None = request.META.get("REMOTE_ADDR")
    if proxies <= 0:
        return remote
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    # Each trusted proxy appends the address it was reached from; earlier entries are the client's say.
    return hops[-proxies] if len(hops) >= proxies else remote
