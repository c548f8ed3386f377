"""Request-level security helpers: the Content-Security-Policy, the websocket Origin check and
the client address.

Content-Security-Policy: every page carries a strict, nonce-based policy. Each request gets a
fresh nonce (`request.csp_nonce`, `{{ csp_nonce }}` in templates); a script runs only if its
tag carries it (`<script nonce="{{ csp_nonce }}">`, inline or not) or if such a script added
it ('strict-dynamic': HTMX re-creating the scripts of a swapped fragment, uPlot). Styles come
from the console's own stylesheets (no inline style attributes or `<style>` without the
nonce; HTMX's own indicator styles are off, console.css has them), except on the terminal
page (`csp_inline_styles`: xterm.js writes styles of its own); no plugins, no <base>, no
framing, forms post to the console only. A page that needs less (a response that already set
its own policy, such as the inbound proxy's `sandbox`) keeps its own. Violations are what the
browser tests listen for (tests/e2e/test_csp_e2e.py).

The websocket Origin check follows Django's CSRF origin check: a handshake is accepted when
its Origin is the console's own origin as the request names it (scheme, host and port of
the Host header, the host in ALLOWED_HOSTS) or one of WEBSOCKET_ALLOWED_ORIGINS (default:
CSRF_TRUSTED_ORIGINS). Scheme, host and port are all compared; a missing Origin is refused.
"""

from __future__ import annotations

import functools
import re
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http import HttpRequest, HttpResponse
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


# --- Content-Security-Policy ------------------------------------------------------------------

CSP_HEADER = "Content-Security-Policy"
ADMIN_PREFIX = "/django-admin/"  # console/urls.py mounts Django's admin here


def new_nonce() -> str:
    return secrets.token_urlsafe(18)


def content_security_policy(
    nonce: str, *, inline_styles: bool = False, own_scripts: bool = False, websocket_host: str = ""
) -> str:
    """The policy of a page whose scripts carry `nonce`. `inline_styles`: the page runs a
    library that styles with <style> elements and style attributes of its own making (xterm.js
    sizes and colours its cells so); its scripts stay as strict. `own_scripts`: Django's admin,
    whose templates load the console's own script files without a nonce (still no inline
    script, no eval)."""
    scripts = "'self'" if own_scripts else f"'nonce-{nonce}' 'strict-dynamic'"
    inline_styles = inline_styles or own_scripts
    style_elements = "'self' 'unsafe-inline'" if inline_styles else f"'self' 'nonce-{nonce}'"
    directives = [
        "default-src 'self'",
        f"script-src {scripts}",
        f"style-src 'self' 'nonce-{nonce}'",
        f"style-src-elem {style_elements}",
        "style-src-attr 'unsafe-inline'" if inline_styles else "style-src-attr 'none'",
        "img-src 'self' data:",
        "font-src 'self'",
        # 'self' covers ws:/wss: of the same host in CSP3 browsers; named too for the others.
        f"connect-src 'self' ws://{websocket_host} wss://{websocket_host}" if websocket_host else "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ]
    return "; ".join(directives)


def csp_inline_styles(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A view whose page runs a library that writes styles of its own (xterm.js's DOM renderer:
    <style> elements for its cell size and theme, style attributes for true colours)."""

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        request.csp_inline_styles = True  # type: ignore[attr-defined]
        return view(request, *args, **kwargs)

    return wrapped


def _host(request: HttpRequest) -> str:
    """The host:port the page was asked for, when Django accepts it (the terminal's websocket
    goes there); empty otherwise."""
    try:
        host = request.get_host()
    except Exception:  # DisallowedHost: the answer is an error page, with 'self' only
        return ""
    return host if _PLAIN_HOST.match(host) else ""


_PLAIN_HOST = re.compile(r"^[A-Za-z0-9.\-]+(:\d{1,5})?$|^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")


class ContentSecurityPolicyMiddleware:
    """Gives each request a nonce and each response the policy that goes with it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        nonce = new_nonce()
        request.csp_nonce = nonce  # type: ignore[attr-defined]
        response = self.get_response(request)
        if CSP_HEADER not in response:
            inline_styles = getattr(request, "csp_inline_styles", False)
            admin = request.path_info.startswith(ADMIN_PREFIX)
            response[CSP_HEADER] = content_security_policy(
                nonce, inline_styles=inline_styles, own_scripts=admin, websocket_host=_host(request)
            )
        return response
