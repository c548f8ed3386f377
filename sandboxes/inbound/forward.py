"""Forwarding one HTTP exchange to a sandbox port: the request body streamed in (capped),
the answer streamed out, hop-by-hop headers and the console's cookies left behind, the
sandbox's cookies kept on its own host and under its own URL path (the prefix: "/" on a host
of its own), CSP sandbox on the console's own origin."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
from django.conf import settings

from .common import (
    CSP_SANDBOX,
    HOP_BY_HOP,
    REPLACED,
    TOKEN_HEADER,
    UPLOAD_PIECE,
    Receive,
    Scope,
    Send,
    console_cookie_names,
    cookies,
    header,
    is_secure,
    plain,
    query_without_link,
)
from .tuning import INBOUND

# Headers that act on the whole origin, not the answer: on the console's own origin a sandbox
# would clear the console's cookies (Clear-Site-Data ignores CSP sandbox), pin HSTS or move
# the origin elsewhere (Alt-Svc).
ORIGIN_WIDE = frozenset({b"clear-site-data", b"strict-transport-security", b"alt-svc"})
# And on a host of its own too: Clear-Site-Data "cookies" clears the cookies of the whole
# registrable domain, every other sandbox host's (and a same-site console's) included.
SITE_WIDE = frozenset({b"clear-site-data"})

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
                connect=INBOUND.connect_timeout_s,
                read=INBOUND.read_timeout_s,
                write=INBOUND.read_timeout_s,
                pool=INBOUND.connect_timeout_s,
            ),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        _client_loop = loop
    return _client


def _requestrequest_headers(scope: Scope, headers: list[tuple[bytes, bytes]], prefix: str) -> list[tuple[bytes, bytes]]:
    connection_listed = {
        name.strip().lower() for value in (v for k, v in headers if k == b"connection") for name in value.split(b",")
    }
    drop = HOP_BY_HOP | REPLACED | connection_listed | {TOKEN_HEADER, b"cookie"}
    forwarded = [(name, value) for name, value in headers if name not in drop]
    jar = cookies(headers)
    console = console_cookie_names()
    kept = "; ".join(f"{name}={morsel.coded_value}" for name, morsel in jar.items() if name not in console)
    if kept:
        forwarded.append((b"cookie", kept.encode("latin-1")))
    client = (scope.get("client") or ("", 0))[0] or ""
    previous = header(headers, b"x-forwarded-for")
    chain = f"{previous.decode('latin-1')}, {client}" if previous and settings.FORWARDED_FOR_PROXIES else client
    forwarded += [
        (b"x-forwarded-for", chain.encode("latin-1")),
        (b"x-forwarded-proto", b"https" if is_secure(scope, headers) else b"http"),
    ]
    if prefix != "/":  # on a host of its own the app is at the root
        forwarded.append((b"x-forwarded-prefix", prefix.rstrip("/").encode()))
    host = header(headers, b"host")
    if host:
        forwarded.append((b"x-forwarded-host", host))
    return forwarded


class _TooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


async def forward(
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
    limit = INBOUND.max_request_bytes
    length = header(headers, b"content-length")
    if length is not None and (not length.strip().isdigit() or int(length) > limit):
        await plain(send, 413, f"The request body is over the limit of {limit} bytes.")
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
        await plain(send, 413, f"The request body is over the limit of {limit} bytes.")
        return
    has_body = bool(first_body) or more or length is not None
    raw = scope.get("raw_path") or scope["path"].encode()
    raw_prefix = prefix.encode()
    upstream_path = raw[len(raw_prefix) - 1 :] if raw.startswith(raw_prefix) else quote(rest, safe="/").encode()
    url = httpx.URL(f"http://{address[0]}:{address[1]}").copy_with(
        raw_path=upstream_path + query_without_link(scope).encode("latin-1")
    )
    if ":" in address[0]:  # an IPv6 address
        url = httpx.URL(f"http://[{address[0]}]:{address[1]}").copy_with(raw_path=url.raw_path)
    client = _http_client()
    request = client.build_request(
        scope["method"],
        url,
        headers=_requestrequest_headers(scope, headers, prefix),
        content=body() if has_body else None,
    )
    started = False
    try:
        async with asyncio.timeout(INBOUND.max_duration_s):
            response = await client.send(request, stream=True)
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": _responserequest_headers(response, prefix, sandboxed=sandboxed),
                    }
                )
                started = True
                await _stream_response(response, receive, send, reading_done=not more)
            finally:
                await response.aclose()
    except _TooLarge:
        if not started:
            await plain(send, 413, f"The request body is over the limit of {limit} bytes.")
        return
    except _ClientGone:
        return
    except (httpx.ConnectError, httpx.ConnectTimeout):
        if not started:
            await plain(send, 502, f"Nothing answers on port {address[1]} in the sandbox.")
        return
    except (TimeoutError, httpx.TimeoutException):
        if not started:
            await plain(send, 504, "The sandbox did not answer in time.")
            return
        raise  # cut midway: the connection is dropped so the client sees a truncated answer
    except httpx.HTTPError as exc:
        if not started:
            await plain(send, 502, f"The sandbox's answer was not valid HTTP ({type(exc).__name__}).")
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


def _responserequest_headers(response: httpx.Response, prefix: str, *, sandboxed: bool) -> list[tuple[bytes, bytes]]:
    connection_listed = {
        name.strip().lower()
        for key, value in response.headers.raw
        if key.lower() == b"connection"
        for name in value.split(b",")
    }
    out: list[tuple[bytes, bytes]] = []
    console = console_cookie_names()
    for key, value in response.headers.raw:
        name = key.lower()
        if name in HOP_BY_HOP or name in connection_listed:
            continue
        if name in SITE_WIDE or (sandboxed and name in ORIGIN_WIDE):
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
