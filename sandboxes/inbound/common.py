"""What the inbound route's modules share: ASGI types, header and cookie helpers and the
plain answers."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.conf import settings

from .links import COOKIE_NAME, LINK_PARAM

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

PREFIX = "/inbound/"
TOKEN_HEADER = b"x-traffic-token"
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
REPLACED = frozenset({b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"x-forwarded-prefix"})
CSP_SANDBOX = (
    b"sandbox allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads"
)
NOT_FOUND = "No such inbound URL, or no valid traffic token for it."
UPLOAD_PIECE = 256 * 1024


class Refused(Exception):
    """The route's refusal: an HTTP status and the message its body says."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    return [(bytes(name).lower(), bytes(value)) for name, value in scope.get("headers", [])]


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def cookies(headers: list[tuple[bytes, bytes]]) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for key, value in headers:
        if key == b"cookie":
            with contextlib.suppress(Exception):
                jar.load(value.decode("latin-1"))
    return jar


def cookie_values(headers: list[tuple[bytes, bytes]], name: str) -> list[str]:
    """Every value the request's cookies give `name`, in order: a browser sends one per
    (domain, path) it keeps, and one set by a page for a parent domain must not hide the
    visitor's own."""
    values = []
    for key, value in headers:
        if key != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            found, sep, text = part.strip().partition("=")
            if sep and found == name:
                jar: SimpleCookie = SimpleCookie()
                with contextlib.suppress(Exception):
                    jar.load(f"{name}={text.strip()}")
                if name in jar:
                    values.append(jar[name].value)
    return values


def console_cookie_names() -> set[str]:
    return {
        settings.SESSION_COOKIE_NAME,
        settings.CSRF_COOKIE_NAME,
        settings.LANGUAGE_COOKIE_NAME,
        "messages",
        COOKIE_NAME,
    }


def is_secure(scope: Scope, headers: list[tuple[bytes, bytes]]) -> bool:
    if scope.get("scheme") in ("https", "wss"):
        return True
    proxy_header = settings.SECURE_PROXY_SSL_HEADER
    if proxy_header:
        name = proxy_header[0].removeprefix("HTTP_").replace("_", "-").lower().encode()
        return header(headers, name) == proxy_header[1].encode()
    return False


def host_name(headers: list[tuple[bytes, bytes]]) -> str:
    host = (header(headers, b"host") or b"").decode("latin-1")
    return host.rsplit(":", 1)[0] if not host.endswith("]") else host


def host_header(headers: list[tuple[bytes, bytes]]) -> str:
    return (header(headers, b"host") or b"").decode("latin-1")


def query_without_link(scope: Scope) -> str:
    """ "?…" with the link parameter left out ("" when nothing is left); a link is never
    passed on to the sandbox."""
    query: str = scope.get("query_string", b"").decode("latin-1")
    pairs = parse_qsl(query, keep_blank_values=True)
    if all(key != LINK_PARAM for key, _ in pairs):  # as parsed: "%5Fconsole_link" is one too
        return f"?{query}" if query else ""
    kept = [(key, value) for key, value in pairs if key != LINK_PARAM]
    return f"?{urlencode(kept)}" if kept else ""


async def plain(send: Send, status: int, message: str) -> None:
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


async def redirect(send: Send, status: int, location: str, *, cookie: bytes | None = None) -> None:
    headers = [(b"location", location.encode("latin-1")), (b"content-length", b"0"), (b"cache-control", b"no-store")]
    if cookie is not None:
        headers.append((b"set-cookie", cookie))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
