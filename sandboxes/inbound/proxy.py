"""The console's inbound route: a sandbox's port proxied from a URL the console issued, as an
ASGI app in front of Django (console/asgi.py). Two forms:

- `<label>-<port>.<domain>/<path>` when INBOUND_BASE_URL is a wildcard (`https://*.<domain>`):
  a host, and so an origin, per sandbox port, served as ordinary pages (the label is opaque:
  `sandboxes/sessions/inbound_hosts.py`); every name on the domain is the proxy's, and one
  that is no label of ours answers the uniform 404;
- `/inbound/<sandbox id>/<port>/<path>` on the console's own origin, where every answer
  carries `Content-Security-Policy: sandbox …`, so a sandbox's page runs in an opaque origin
  and cannot read or drive the console.

A request passes with the session's traffic token in `X-Traffic-Token`, or with the cookie a
signed link set (`?_console_link=…` answers 303 with the cookie, for that host or URL path,
expiring with the link). Without a credential that matches, the answer is 404 whatever
exists (no leak of which sandboxes there are); with one, inbound off is a 403 that says so.

Bodies stream both ways (the request in the chunks the server hands over, capped at
inbound.max_request_bytes; the response as the sandbox sends it); hop-by-hop headers and the
console's own cookies are never forwarded; the upstream is the sandbox's own address from
the engine, never a host the request names (docs/inbound.md).
"""

from __future__ import annotations

import functools
import hmac
import re
import threading
import time
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ..backends.base import ErrorKind, RemoteError
from .common import (
    NOT_FOUND,
    PREFIX,
    TOKEN_HEADER,
    ASGIApp,
    Receive,
    Refused,
    Scope,
    Send,
    cookie_values,
    header,
    host_header,
    host_name,
    is_secure,
    plain,
    query_without_link,
    redirect,
    request_headers,
)
from .forward import forward
from .hosts import HostRoute, host_route, setting_problem
from .links import (
    COOKIE_NAME,
    LINK_PARAM,
    InboundTarget,
    LinkExpired,
    activity_due,
    check_link,
    inbound_target,
    inbound_target_at,
    inbound_upstream,
    touch_inbound_activity,
)
from .websocket import bridge

_ROUTE = re.compile(r"^/inbound/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/([0-9]{1,5})(/.*)?$", re.DOTALL)
TARGET_TTL_S = 2.0  # how long a looked-up session/switch/address is reused (an off switch: within 2 s)


class InboundRouter:
    """Requests for a sandbox port to the proxy, everything else to the console's own app:
    with a wildcard INBOUND_BASE_URL every request whose Host is on its domain (whatever the
    path: the whole host is the sandbox port's), and on any host `/inbound/<id>/<port>/…`
    (the console's own origin, under CSP sandbox). Refuses to start on an unusable
    INBOUND_BASE_URL, with the reason."""

    def __init__(self, app: ASGIApp) -> None:
        problem = setting_problem(settings.INBOUND_BASE_URL)
        if problem:
            raise ImproperlyConfigured(problem)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        route = host_route(host_header(request_headers(scope))) if kind in ("http", "websocket") else None
        if route is not None and kind == "http":
            await handle_host(scope, receive, send, route)
        elif route is not None:
            await bridge(scope, receive, send, functools.partial(_admit_websocket_at, route))
        elif kind == "http" and scope.get("path", "").startswith(PREFIX):
            await handle(scope, receive, send)
        elif kind == "websocket" and scope.get("path", "").startswith(PREFIX):
            await bridge(scope, receive, send, _admit_websocket)
        else:
            await self.app(scope, receive, send)


# --- Looking up the target (cached briefly) ------------------------------------------------

# Measured (bench/module_caches.py): a hit 5 us; a target lookup 2.1 ms, an upstream 3.8 ms (row and engine).
_cache: dict[tuple[str, str, int], tuple[float, InboundTarget | None]] = {}
_upstreams: dict[tuple[str, int, str], tuple[float, tuple[str, int]]] = {}
_cache_lock = threading.Lock()
_MISS = object()


def _peek(table: dict[Any, tuple[float, Any]], key: Any) -> Any:
    """A fresh cached value, or _MISS (no I/O: asked on the event loop before any hop to the
    single thread the ORM runs in)."""
    with _cache_lock:
        hit = table.get(key)
    return hit[1] if hit is not None and hit[0] > time.monotonic() else _MISS


def _keep(table: dict[Any, tuple[float, Any]], key: Any, value: Any) -> None:
    with _cache_lock:
        if len(table) > 4096:
            table.clear()
        table[key] = (time.monotonic() + TARGET_TTL_S, value)


def _looked_up_target(kind: str, name: str, port: int) -> InboundTarget | None:
    target = inbound_target(name, port) if kind == "path" else inbound_target_at(name, port)
    _keep(_cache, (kind, name, port), target)
    return target


def _looked_up_upstream(target: InboundTarget) -> tuple[str, int]:
    address = inbound_upstream(target)
    _keep(_upstreams, (target.sandbox_id, target.port, target.token), address)
    return address


async def _target(kind: str, name: str, port: int) -> InboundTarget | None:
    """The target of a sandbox id ("path": `/inbound/<id>/<port>/`) or of a host label
    ("host": `<label>-<port>.<inbound domain>`)."""
    cached = _peek(_cache, (kind, name, port))
    if cached is not _MISS:
        return cached
    return await database_sync_to_async(_looked_up_target)(kind, name, port)


def forget_targets() -> None:
    """Drop every cached lookup (tests; a switch change is also seen within TARGET_TTL_S)."""
    with _cache_lock:
        _cache.clear()
        _upstreams.clear()


async def handle(scope: Scope, receive: Receive, send: Send) -> None:
    """`/inbound/<id>/<port>/…` on the console's own origin: served under CSP sandbox."""
    match = _ROUTE.match(scope.get("path", ""))
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        await plain(send, 404, NOT_FOUND)
        return
    sandbox_id, port, rest = match.group(1), int(match.group(2)), match.group(3)
    prefix = f"{PREFIX}{sandbox_id}/{port}/"
    if rest is None:  # "/inbound/<id>/<port>": the app's root is "<…>/" (relative links resolve)
        query = scope.get("query_string", b"").decode("latin-1")
        await redirect(send, 308, prefix + (f"?{query}" if query else ""))
        return
    await _serve(scope, receive, send, ("path", sandbox_id, port), prefix, rest, own_host=False)


async def handle_host(scope: Scope, receive: Receive, send: Send, route: HostRoute) -> None:
    """A request to `<label>-<port>.<inbound domain>`: the whole path is the sandbox port's,
    served as an ordinary page on an origin of its own. A name on the domain that is no
    label of ours answers the same 404 as a missing credential."""
    if not route.valid:
        await plain(send, 404, NOT_FOUND)
        return
    await _serve(scope, receive, send, ("host", route.label, route.port), "/", scope.get("path", "/"), own_host=True)


async def _serve(
    scope: Scope, receive: Receive, send: Send, key: tuple[str, str, int], prefix: str, rest: str, *, own_host: bool
) -> None:
    headers = request_headers(scope)
    try:
        target, link_cookie = await _authorize(scope, headers, key, prefix, own_host=own_host)
        if link_cookie is not None:
            raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
            await redirect(send, 303, raw_path + query_without_link(scope), cookie=link_cookie)
            return
        address = await _address(target)
        if activity_due(target):
            await database_sync_to_async(touch_inbound_activity)(target)
    except Refused as exc:
        await plain(send, exc.status, exc.message)
        return
    await forward(scope, receive, send, headers, address, prefix, rest, sandboxed=not own_host)


async def _authorize(
    scope: Scope, headers: list[tuple[bytes, bytes]], key: tuple[str, str, int], prefix: str, *, own_host: bool
) -> tuple[InboundTarget, bytes | None]:
    """The target when the request brings a credential for it (and inbound is on), and the
    cookie to set when it followed a signed link."""
    target = await _target(*key)
    if target is None:
        raise Refused(404, NOT_FOUND)
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
    cookie_counts = not own_host or _from_own_pages(scope, headers)
    offered = [(value, False) for value in cookie_values(headers, COOKIE_NAME)] if cookie_counts else []
    if query.get(LINK_PARAM):
        offered.insert(0, (query[LINK_PARAM], True))
    presented = header(headers, TOKEN_HEADER)
    expired = False
    granted = False
    new_cookie: bytes | None = None
    if presented is not None:
        granted = _token_matches(presented, target.token)
    for value, is_link in offered:
        if granted or not value:
            continue
        try:
            expires_at = check_link(value, target)
        except LinkExpired:
            expired = True
            continue
        if expires_at is not None:
            granted = True
            if is_link:
                new_cookie = _link_cookie(value, expires_at, prefix, scope, headers, own_host=own_host)
    if not granted:
        if expired:
            raise Refused(403, "This signed link has expired: ask the session's page or API for a new one.")
        raise Refused(404, NOT_FOUND)
    if not target.inbound_on:
        raise Refused(
            403,
            f"Inbound traffic is off for space {target.space_name}: an admin turns it on in the "
            "space's network policy (and rebuilds sessions made while it was off).",
        )
    return target, new_cookie


def _from_own_pages(scope: Scope, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the link cookie counts on a host of its own: for the host's own pages and for
    top-level navigations (GET, HEAD), as SameSite=Lax has it between sites. Every sandbox
    host is one site with the others (one registrable domain), so Lax alone would let a page
    of another sandbox's host send the visitor's cookie here (a form POST, a `<script src>`);
    the browser's Fetch Metadata tells those apart (a browser that sends none: counted)."""
    site = (header(headers, b"sec-fetch-site") or b"").lower()
    if site in (b"", b"same-origin", b"none"):
        return True
    mode = (header(headers, b"sec-fetch-mode") or b"").lower()
    dest = (header(headers, b"sec-fetch-dest") or b"").lower()
    return mode == b"navigate" and dest == b"document" and scope.get("method") in ("GET", "HEAD")


def _token_matches(presented: bytes, token: str) -> bool:
    return hmac.compare_digest(presented.strip(), token.encode())


def _link_cookie(
    value: str, expires_at: int, prefix: str, scope: Scope, headers: list[tuple[bytes, bytes]], *, own_host: bool
) -> bytes:
    jar: SimpleCookie = SimpleCookie()
    jar[COOKIE_NAME] = value
    morsel = jar[COOKIE_NAME]
    morsel["path"] = prefix
    morsel["max-age"] = str(max(expires_at - int(time.time()), 1))
    morsel["httponly"] = True
    secure = is_secure(scope, headers)
    if own_host:
        # A host of its own (no Domain: that host only): an ordinary page, whose parts are
        # same-origin requests.
        morsel["samesite"] = "Lax"
        if secure:
            morsel["secure"] = True
    elif secure or host_name(headers) in ("localhost", "127.0.0.1", "[::1]"):
        # Under CSP sandbox the page's own parts are requests from an opaque origin, which
        # carry only SameSite=None cookies (and those must be Secure; browsers take that on
        # http://localhost). On other plain-http hosts, Lax: the page's parts then fail.
        morsel["secure"] = True
        morsel["samesite"] = "None"
    else:
        morsel["samesite"] = "Lax"
    return morsel.OutputString().encode("latin-1")


async def _address(target: InboundTarget) -> tuple[str, int]:
    cached = _peek(_upstreams, (target.sandbox_id, target.port, target.token))
    if cached is not _MISS:
        return cached
    try:
        return await database_sync_to_async(_looked_up_upstream)(target)
    except RemoteError as exc:
        if exc.kind == ErrorKind.CONFLICT:
            raise Refused(503, f"The session's sandbox is not running ({exc.message}): resume the session.") from None
        if exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
            raise Refused(404, "The sandbox is gone (the session was rebuilt): ask for its new URL.") from None
        raise Refused(502, f"The sandbox cannot be reached: {exc.message}") from None


async def _admit_websocket(scope: Scope) -> tuple[str, int, str]:
    """A websocket handshake to `/inbound/<id>/<port>/…` on the console's own origin."""
    match = _ROUTE.match(scope.get("path", ""))
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise Refused(404, NOT_FOUND)
    sandbox_id, port, rest = match.group(1), int(match.group(2)), match.group(3) or "/"
    return await _admit(scope, ("path", sandbox_id, port), f"{PREFIX}{sandbox_id}/{port}/", rest, own_host=False)


async def _admit_websocket_at(route: HostRoute, scope: Scope) -> tuple[str, int, str]:
    """A websocket handshake to `<label>-<port>.<inbound domain>`: the whole path is the port's."""
    if not route.valid:
        raise Refused(404, NOT_FOUND)
    return await _admit(scope, ("host", route.label, route.port), "/", scope.get("path") or "/", own_host=True)


async def _admit(
    scope: Scope, key: tuple[str, str, int], prefix: str, rest: str, *, own_host: bool
) -> tuple[str, int, str]:
    """The sandbox's address and the path to ask it for. The token header counts as for
    HTTP; the link cookie only when the page that opens the socket is of the same origin (a
    page of another site, or of another sandbox's host, never rides on it)."""
    headers = request_headers(scope)
    origin = (header(headers, b"origin") or b"").decode("latin-1")
    scheme = "https" if is_secure(scope, headers) else "http"
    if origin.lower() != f"{scheme}://{host_header(headers)}".lower():
        headers = [(name, value) for name, value in headers if name != b"cookie"]
    target, _ = await _authorize({**scope, "query_string": b""}, headers, key, prefix, own_host=own_host)
    address = await _address(target)
    if activity_due(target):
        await database_sync_to_async(touch_inbound_activity)(target)
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    path = raw[len(prefix) - 1 :] if raw.startswith(prefix) else rest
    return address[0], address[1], path + query_without_link(scope)
