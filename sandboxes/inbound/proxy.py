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

import asyncio
import contextlib
import hmac
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import httpx
from channels.db import database_sync_to_async
from django.conf import settings

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

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

PREFIX = "/inbound/"
TOKEN_HEADER = b"x-traffic-token"
_ROUTE = re.compile(r"^/inbound/([A-Za-z0-9][A-Za-z0-9_.-]{0,127})/([0-9]{1,5})(/.*)?$", re.DOTALL)
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Set by the proxy itself from what it knows, never passed on from the request.
_REPLACED = frozenset({b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-prefix"})
CSP_SANDBOX = (
    b"sandbox allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads"
)
NOT_FOUND = "No such inbound URL, or no valid traffic token for it."
UPLOAD_PIECE = 256 * 1024
TARGET_TTL_S = 2.0  # how long a looked-up session/switch/address is reused (an off switch: within 2 s)


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class InboundRouter:
    """`/inbound/…` HTTP requests to the proxy; everything else to the console's own app,
    except on the inbound host (INBOUND_BASE_URL), which serves nothing but `/inbound/`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith(PREFIX):
            await handle(scope, receive, send)
        elif scope["type"] == "http" and _on_inbound_host(_headers(scope)):
            await _plain(send, 404, "This host serves sandbox ports only (/inbound/…).")
        else:
            await self.app(scope, receive, send)


def _inbound_host() -> str:
    """host[:port] of INBOUND_BASE_URL, lower-cased ("" when inbound URLs use the console's)."""
    return urlsplit(settings.INBOUND_BASE_URL).netloc.lower() if settings.INBOUND_BASE_URL else ""


def _on_inbound_host(headers: list[tuple[bytes, bytes]]) -> bool:
    inbound_host = _inbound_host()
    return bool(inbound_host) and (_header(headers, b"host") or b"").decode("latin-1").lower() == inbound_host


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


# --- The request ---------------------------------------------------------------------------


def _headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    return [(bytes(name).lower(), bytes(value)) for name, value in scope.get("headers", [])]


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _cookies(headers: list[tuple[bytes, bytes]]) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for key, value in headers:
        if key == b"cookie":
            with contextlib.suppress(Exception):
                jar.load(value.decode("latin-1"))
    return jar


def _console_cookie_names() -> set[str]:
    return {
        settings.SESSION_COOKIE_NAME,
        settings.CSRF_COOKIE_NAME,
        settings.LANGUAGE_COOKIE_NAME,
        "messages",
        COOKIE_NAME,
    }


def _is_secure(scope: Scope, headers: list[tuple[bytes, bytes]]) -> bool:
    if scope.get("scheme") == "https":
        return True
    proxy_header = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        name = proxy_header[0].removeprefix("HTTP_").replace("_", "-").lower().encode()
        return _header(headers, name) == proxy_header[1].encode()
    return False


def _host_name(headers: list[tuple[bytes, bytes]]) -> str:
    host = (_header(headers, b"host") or b"").decode("latin-1")
    return host.rsplit(":", 1)[0] if not host.endswith("]") else host


async def handle(scope: Scope, receive: Receive, send: Send) -> None:
    match = _ROUTE.match(scope.get("path", ""))
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        await _plain(send, 404, NOT_FOUND)
        return
    sandbox_id, port, rest = match.group(1), int(match.group(2)), match.group(3)
    prefix = f"{PREFIX}{sandbox_id}/{port}/"
    headers = _headers(scope)
    if rest is None:  # "/inbound/<id>/<port>": the app's root is "<…>/" (relative links resolve)
        query = scope.get("query_string", b"").decode("latin-1")
        await _redirect(send, 308, prefix + (f"?{query}" if query else ""))
        return
    try:
        target, link_cookie = await _authorize(scope, headers, sandbox_id, port, prefix)
        if link_cookie is not None:
            raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
            await _redirect(send, 303, raw_path + _query_without_link(scope), cookie=link_cookie)
            return
        address = await _address(target)
        if activity_due(target):
            await database_sync_to_async(touch_inbound_activity)(target)
    except Refused as exc:
        await _plain(send, exc.status, exc.message)
        return
    await _proxy(scope, receive, send, headers, address, prefix, rest, sandboxed=not _on_inbound_host(headers))


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
    cookie = _cookies(headers).get(COOKIE_NAME)
    presented = _header(headers, TOKEN_HEADER)
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
    secure = _is_secure(scope, headers)
    if _on_inbound_host(headers):
        # A host of its own: an ordinary page, whose parts are same-site requests.
        morsel["samesite"] = "Lax"
        if secure:
            morsel["secure"] = True
    elif secure or _host_name(headers) in ("localhost", "127.0.0.1", "[::1]"):
        # Under CSP sandbox the page's own parts are requests from an opaque origin, which
        # carry only SameSite=None cookies (and those must be Secure; browsers take that on
        # http://localhost). On other plain-http hosts, Lax: the page's parts then fail.
        morsel["secure"] = True
        morsel["samesite"] = "None"
    else:
        morsel["samesite"] = "Lax"
    return morsel.OutputString().encode("latin-1")


def _query_without_link(scope: Scope) -> str:
    """ "?…" with the link parameter left out ("" when nothing is left); a link is never
    passed on to the sandbox."""
    query: bytes = scope.get("query_string", b"")
    if LINK_PARAM.encode() not in query:
        return f"?{query.decode('latin-1')}" if query else ""
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    kept = [(key, value) for key, value in pairs if key != LINK_PARAM]
    return f"?{urlencode(kept)}" if kept else ""


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


# --- Proxying -------------------------------------------------------------------------------

_client: httpx.AsyncClient | None = None
_client_loop: asyncio.AbstractEventLoop | None = None


def _http_client() -> httpx.AsyncClient:
    """One pooled client per event loop; never through a proxy from the environment, never
    following redirects (the browser does)."""
    global _client, _client_loop
    loop = asyncio.get_running_loop()
    if _client is None or _client_loop is not loop:
        _client = httpx.AsyncClient(
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(
                connect=settings.INBOUND_CONNECT_TIMEOUT_S,
                read=settings.INBOUND_READ_TIMEOUT_S,
                write=settings.INBOUND_READ_TIMEOUT_S,
                pool=settings.INBOUND_CONNECT_TIMEOUT_S,
            ),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        _client_loop = loop
    return _client


def _request_headers(scope: Scope, headers: list[tuple[bytes, bytes]], prefix: str) -> list[tuple[bytes, bytes]]:
    connection_listed = {
        name.strip().lower() for value in (v for k, v in headers if k == b"connection") for name in value.split(b",")
    }
    drop = HOP_BY_HOP | _REPLACED | connection_listed | {TOKEN_HEADER, b"cookie"}
    forwarded = [(name, value) for name, value in headers if name not in drop]
    jar = _cookies(headers)
    console = _console_cookie_names()
    kept = "; ".join(f"{name}={morsel.coded_value}" for name, morsel in jar.items() if name not in console)
    if kept:
        forwarded.append((b"cookie", kept.encode("latin-1")))
    client = (scope.get("client") or ("", 0))[0] or ""
    previous = _header(headers, b"x-forwarded-for")
    chain = f"{previous.decode('latin-1')}, {client}" if previous and settings.FORWARDED_FOR_PROXIES else client
    forwarded += [
        (b"x-forwarded-for", chain.encode("latin-1")),
        (b"x-forwarded-proto", b"https" if _is_secure(scope, headers) else b"http"),
        (b"x-forwarded-prefix", prefix.rstrip("/").encode()),
    ]
    host = _header(headers, b"host")
    if host:
        forwarded.append((b"x-forwarded-host", host))
    return forwarded


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


async def _proxy(
    scope: Scope,
    receive: Receive,
    send: Send,
    headers: list[tuple[bytes, bytes]],
    address: tuple[str, int],
    prefix: str,
    rest: str,
    *,
    sandboxed: bool,
) -> None:
    limit = settings.INBOUND_MAX_REQUEST_BYTES
    length = _header(headers, b"content-length")
    if length is not None and (not length.strip().isdigit() or int(length) > limit):
        await _plain(send, 413, f"The request body is over the limit of {limit} bytes.")
        return
    first = await receive()
    if first["type"] == "http.disconnect":
        return
    first_body, more = first.get("body", b""), first.get("more_body", False)

    async def body() -> AsyncIterator[bytes]:
        # Daphne hands a body over in 8 KiB messages: passed on in pieces of up to 256 KiB.
        total = len(first_body)
        buffered = [first_body] if first_body else []
        size = total
        pending = more
        while pending:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                raise _TooLarge
            if chunk:
                buffered.append(chunk)
                size += len(chunk)
            pending = message.get("more_body", False)
            if size >= UPLOAD_PIECE:
                yield b"".join(buffered)
                buffered, size = [], 0
        if buffered:
            yield b"".join(buffered)

    if len(first_body) > limit:
        await _plain(send, 413, f"The request body is over the limit of {limit} bytes.")
        return
    has_body = bool(first_body) or more or length is not None
    raw = scope.get("raw_path") or scope["path"].encode()
    raw_prefix = prefix.encode()
    upstream_path = raw[len(raw_prefix) - 1 :] if raw.startswith(raw_prefix) else quote(rest, safe="/").encode()
    url = httpx.URL(f"http://{address[0]}:{address[1]}").copy_with(
        raw_path=upstream_path + _query_without_link(scope).encode("latin-1")
    )
    if ":" in address[0]:  # an IPv6 address
        url = httpx.URL(f"http://[{address[0]}]:{address[1]}").copy_with(raw_path=url.raw_path)
    client = _http_client()
    request = client.build_request(
        scope["method"],
        url,
        headers=_request_headers(scope, headers, prefix),
        content=body() if has_body else None,
    )
    started = False
    try:
        async with asyncio.timeout(settings.INBOUND_MAX_DURATION_S):
            response = await client.send(request, stream=True)
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": _response_headers(response, prefix, sandboxed=sandboxed),
                    }
                )
                started = True
                await _stream_response(response, receive, send, reading_done=not more)
            finally:
                await response.aclose()
    except _TooLarge:
        if not started:
            await _plain(send, 413, f"The request body is over the limit of {limit} bytes.")
        return
    except _ClientGone:
        return
    except (httpx.ConnectError, httpx.ConnectTimeout):
        if not started:
            await _plain(send, 502, f"Nothing answers on port {address[1]} in the sandbox.")
        return
    except (TimeoutError, httpx.TimeoutException):
        if not started:
            await _plain(send, 504, "The sandbox did not answer in time.")
            return
        raise  # cut midway: the connection is dropped so the client sees a truncated answer
    except httpx.HTTPError as exc:
        if not started:
            await _plain(send, 502, f"The sandbox's answer was not valid HTTP ({type(exc).__name__}).")
            return
        raise


async def _stream_response(response: httpx.Response, receive: Receive, send: Send, *, reading_done: bool) -> None:
    """The body as it comes; stops early when the client goes away."""
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    watcher = asyncio.ensure_future(watch()) if reading_done else None
    try:
        async for chunk in response.aiter_raw():
            if gone.is_set():
                return
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher


def _response_headers(response: httpx.Response, prefix: str, *, sandboxed: bool) -> list[tuple[bytes, bytes]]:
    connection_listed = {
        name.strip().lower()
        for key, value in response.headers.raw
        if key.lower() == b"connection"
        for name in value.split(b",")
    }
    out: list[tuple[bytes, bytes]] = []
    console = _console_cookie_names()
    for key, value in response.headers.raw:
        name = key.lower()
        if name in HOP_BY_HOP or name in connection_listed:
            continue
        if name == b"set-cookie":
            scoped = _scoped_cookie(value, prefix, console)
            if scoped is not None:
                out.append((b"set-cookie", scoped))
            continue
        out.append((name, value))
    if sandboxed:
        # On the console's own origin. Next to any policy of the sandbox's own: both hold.
        out.append((b"content-security-policy", CSP_SANDBOX))
    return out


def _scoped_cookie(value: bytes, prefix: str, console: set[str]) -> bytes | None:
    """A sandbox's cookie kept under its own URL path: Domain dropped, Path forced below the
    prefix, and never one of the console's cookie names."""
    parts = [part.strip() for part in value.decode("latin-1").split(";")]
    name = parts[0].split("=", 1)[0].strip()
    if not name or name in console:
        return None
    path = "/"
    attributes = []
    for part in parts[1:]:
        key = part.split("=", 1)[0].strip().lower()
        if key == "domain":
            continue
        if key == "path":
            path = part.split("=", 1)[1].strip() if "=" in part else "/"
            continue
        attributes.append(part)
    scoped_path = prefix + path.lstrip("/")
    return "; ".join([parts[0], f"Path={scoped_path}", *attributes]).encode("latin-1")


async def _plain(send: Send, status: int, message: str) -> None:
    body = (message + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _redirect(send: Send, status: int, location: str, *, cookie: bytes | None = None) -> None:
    headers = [(b"location", location.encode("latin-1")), (b"content-length", b"0"), (b"cache-control", b"no-store")]
    if cookie is not None:
        headers.append((b"set-cookie", cookie))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
