"""The console's inbound route: `/inbound/<sandbox id>/<port>/<path>` proxied to that port of
the sandbox, as an ASGI HTTP app in front of Django (console/asgi.py).

A request passes with the session's traffic token in `X-Traffic-Token`, or with the cookie a
signed link set (`?_console_link=…` answers 303 with the cookie, scoped to the URL's path,
expiring with the link). Without a credential that matches, the answer is 404 whatever
exists (no leak of which sandboxes there are); with one, inbound off is a 403 that says so.

Bodies stream both ways (the request in the chunks the server hands over, capped at
INBOUND_MAX_REQUEST_BYTES; the response as the sandbox sends it); hop-by-hop headers and the
console's own cookies are never forwarded; the upstream is the sandbox's own address from
the engine, never a host the request names. On the console's own origin every answer carries
`Content-Security-Policy: sandbox …`, so a sandbox's page runs in an opaque origin and cannot
read or drive the console; on the inbound host of its own (INBOUND_BASE_URL) pages are served
as they are, and that host serves nothing else (docs/inbound.md).
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl

from channels.db import database_sync_to_async

from ..backends.base import ErrorKind, RemoteError
from ..sessions.inbound import (
    COOKIE_NAME,
    LINK_PARAM,
    InboundTarget,
    LinkExpired,
    activity_due,
    check_link,
    inbound_target,
    inbound_upstream,
    touch_inbound_activity,
)
from .common import (
    NOT_FOUND,
    PREFIX,
    TOKEN_HEADER,
    ASGIApp,
    Receive,
    Refused,
    Scope,
    Send,
    cookies,
    header,
    host_name,
    is_secure,
    on_inbound_host,
    plain,
    query_without_link,
    redirect,
    request_headers,
)
from .forward import forward
from .websocket import bridge

_ROUTE = re.compile(r"^/inbound/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/([0-9]{1,5})(/.*)?$", re.DOTALL)
TARGET_TTL_S = 2.0  # how long a looked-up session/switch/address is reused (an off switch: within 2 s)


class InboundRouter:
    """`/inbound/…` HTTP requests to the proxy; everything else to the console's own app,
    except on the inbound host (INBOUND_BASE_URL), which serves nothing but `/inbound/`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(PREFIX):
            await handle(scope, receive, send)
        elif scope["type"] == "websocket" and scope.get("path", "").startswith(PREFIX):
            await bridge(scope, receive, send, _admit_websocket)
        elif scope["type"] == "http" and on_inbound_host(request_headers(scope)):
            await plain(send, 404, "This host serves sandbox ports only (/inbound/…).")
        else:
            await self.app(scope, receive, send)


# --- Looking up the target (cached briefly) ------------------------------------------------

_cache: dict[tuple[str, int], tuple[float, InboundTarget | None]] = {}
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


def _looked_up_target(sandbox_id: str, port: int) -> InboundTarget | None:
    target = inbound_target(sandbox_id, port)
    _keep(_cache, (sandbox_id, port), target)
    return target


def _looked_up_upstream(target: InboundTarget) -> tuple[str, int]:
    address = inbound_upstream(target)
    _keep(_upstreams, (target.sandbox_id, target.port, target.token), address)
    return address


async def _target(sandbox_id: str, port: int) -> InboundTarget | None:
    cached = _peek(_cache, (sandbox_id, port))
    if cached is not _MISS:
        return cached
    return await database_sync_to_async(_looked_up_target)(sandbox_id, port)


def forget_targets() -> None:
    """Drop every cached lookup (tests; a switch change is also seen within TARGET_TTL_S)."""
    with _cache_lock:
        _cache.clear()
        _upstreams.clear()


async def handle(scope: Scope, receive: Receive, send: Send) -> None:
    match = _ROUTE.match(scope.get("path", ""))
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        await plain(send, 404, NOT_FOUND)
        return
    sandbox_id, port, rest = match.group(1), int(match.group(2)), match.group(3)
    prefix = f"{PREFIX}{sandbox_id}/{port}/"
    headers = request_headers(scope)
    if rest is None:  # "/inbound/<id>/<port>": the app's root is "<…>/" (relative links resolve)
        query = scope.get("query_string", b"").decode("latin-1")
        await redirect(send, 308, prefix + (f"?{query}" if query else ""))
        return
    try:
        target, link_cookie = await _authorize(scope, headers, sandbox_id, port, prefix)
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
    await forward(scope, receive, send, headers, address, prefix, rest, sandboxed=not on_inbound_host(headers))


async def _authorize(
    scope: Scope, headers: list[tuple[bytes, bytes]], sandbox_id: str, port: int, prefix: str
) -> tuple[InboundTarget, bytes | None]:
    """The target when the request brings a credential for it (and inbound is on), and the
    cookie to set when it followed a signed link."""
    target = await _target(sandbox_id, port)
    if target is None:
        raise Refused(404, NOT_FOUND)
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
    link = query.get(LINK_PARAM)
    cookie = cookies(headers).get(COOKIE_NAME)
    presented = header(headers, TOKEN_HEADER)
    expired = False
    granted = False
    new_cookie: bytes | None = None
    if presented is not None:
        granted = _token_matches(presented, target.token)
    for value, is_link in ((link, True), (cookie.value if cookie is not None else None, False)):
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
                new_cookie = _link_cookie(value, expires_at, prefix, scope, headers)
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


def _token_matches(presented: bytes, token: str) -> bool:
    return hmac.compare_digest(presented.strip(), token.encode())


def _link_cookie(value: str, expires_at: int, prefix: str, scope: Scope, headers: list[tuple[bytes, bytes]]) -> bytes:
    jar: SimpleCookie = SimpleCookie()
    jar[COOKIE_NAME] = value
    morsel = jar[COOKIE_NAME]
    morsel["path"] = prefix
    morsel["max-age"] = str(max(expires_at - int(time.time()), 1))
    morsel["httponly"] = True
    secure = is_secure(scope, headers)
    if on_inbound_host(headers):
        # A host of its own: an ordinary page, whose parts are same-site requests.
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
    """A websocket handshake to `/inbound/<id>/<port>/…`: the sandbox's address and the path
    to ask it for. The token header counts as for HTTP; the link cookie only when the page
    that opens the socket is of the same origin (a cross-site page never rides on it)."""
    match = _ROUTE.match(scope.get("path", ""))
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise Refused(404, NOT_FOUND)
    sandbox_id, port, rest = match.group(1), int(match.group(2)), match.group(3) or "/"
    prefix = f"{PREFIX}{sandbox_id}/{port}/"
    headers = request_headers(scope)
    origin = (header(headers, b"origin") or b"").decode("latin-1")
    host = (header(headers, b"host") or b"").decode("latin-1")
    scheme = "https" if is_secure(scope, headers) else "http"
    if origin.lower() != f"{scheme}://{host}".lower():
        headers = [(name, value) for name, value in headers if name != b"cookie"]
    target, _ = await _authorize({**scope, "query_string": b""}, headers, sandbox_id, port, prefix)
    address = await _address(target)
    if activity_due(target):
        await database_sync_to_async(touch_inbound_activity)(target)
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    path = raw[len(prefix) - 1 :] if raw.startswith(prefix) else rest
    return address[0], address[1], path + query_without_link(scope)
