"""HTTP plumbing of the fake server: request parsing (chunked bodies), JSON/bytes replies,
Connect-RPC envelopes and the error shapes of the E2B API and of Connect.
"""

from __future__ import annotations

import contextlib
import json
import struct
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

# Connect envelope flags (https://connectrpc.com/docs/protocol#streaming-response).
FLAG_MESSAGE = 0x00
FLAG_END_STREAM = 0x02

# Connect error code -> HTTP status for unary errors (connectrpc.com/docs/protocol#error-codes).
CONNECT_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


class HttpError(Exception):
    """Answer with ``status`` and the E2B error body ``{"code", "message"}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.extra = extra


class NoRoute(Exception):
    """No route serves the request: answered as the real server's router does (personality)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class ConnectError(Exception):
    """A Connect-RPC error: ``code`` is the string code (``not_found``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StreamDropped(Exception):
    """Raised inside a stream writer to cut the connection without the end envelope."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes
    raw_query: str = ""
    params: dict[str, str] = field(default_factory=dict)  # from the route pattern

    def q(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def json(self) -> Any:
        if not self.body.strip():
            return {}
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise HttpError(400, f"invalid JSON body: {e}") from e


def read_request(handler: BaseHTTPRequestHandler) -> Request:
    """Parse the request line, headers and body (Content-Length or chunked)."""
    parsed = urllib.parse.urlsplit(handler.path)
    headers = {k.lower(): v for k, v in handler.headers.items()}
    if "chunked" in headers.get("transfer-encoding", "").lower():
        # The SDK's Connect client streams request bodies chunked (spec trap: a handler that
        # waits for Content-Length hangs).
        body = _read_chunked(handler)
    else:
        length = int(headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else b""
    return Request(
        method=handler.command,
        path=parsed.path,
        query=urllib.parse.parse_qs(parsed.query, keep_blank_values=True),
        headers=headers,
        body=body,
        raw_query=parsed.query,
    )


def _read_chunked(handler: BaseHTTPRequestHandler) -> bytes:
    body = bytearray()
    while True:
        line = handler.rfile.readline(65537)
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            # Trailer section ends with an empty line.
            while handler.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass
            return bytes(body)
        body.extend(handler.rfile.read(size))
        handler.rfile.readline(3)  # CRLF after each chunk


def envelope(flags: int, payload: Any) -> bytes:
    data = json.dumps(payload, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(data)) + data


def parse_envelopes(body: bytes) -> list[Any]:
    """Decode the envelopes of a streaming request body (usually exactly one)."""
    out: list[Any] = []
    pos = 0
    while pos + 5 <= len(body):
        flags, size = struct.unpack(">BI", body[pos : pos + 5])
        chunk = body[pos + 5 : pos + 5 + size]
        pos += 5 + size
        if flags & FLAG_END_STREAM:
            break
        out.append(json.loads(chunk) if chunk else {})
    return out


class Reply:
    """Writes responses on a BaseHTTPRequestHandler (keep-alive, HTTP/1.1)."""

    def __init__(self, handler: BaseHTTPRequestHandler) -> None:
        self.h = handler
        self.started = False

    def send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.started = True
        self.h.send_response(status)
        if content_type:
            self.h.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.h.send_header(k, v)
        self.h.send_header("Content-Length", str(len(body)))
        self.h.end_headers()
        if body and self.h.command != "HEAD":
            self.h.wfile.write(body)

    def json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self.send(status, json.dumps(payload).encode(), "application/json", headers)

    def empty(self, status: int = 204, headers: dict[str, str] | None = None) -> None:
        self.send(status, b"", None, headers)

    def api_error(self, err: HttpError) -> None:
        # spec/openapi.yml: components/schemas/Error {code: int32, message: string}
        body: dict[str, Any] = {"code": err.status, "message": err.message, **err.extra}
        self.json(err.status, body, err.headers)

    def no_route(self, err: NoRoute, personality: str, style: str = "validator") -> None:
        if personality == "cube":
            # axum (CubeAPI/src/routes.rs): an unknown path is 404, a known path with another
            # method 405, both with an empty body (no {code, message}).
            self.send(err.status, b"", None, {"Allow": ""} if err.status == 405 else None)
        elif style == "validator":
            # e2b-dev/infra packages/api/main.go @54693ff: gin.New() without
            # HandleMethodNotAllowed, so gin serves 404 through the global middlewares; the
            # OpenAPI validator (oapi-codegen gin-middleware over kin-openapi) fails FindRoute
            # and utils.ErrorHandler answers {"code", "message": "validation error: <reason>"}.
            reason = "method not allowed" if err.status == 405 else "no matching operation was found"
            self.json(404, {"code": 404, "message": f"validation error: {reason}"})
        elif style == "gin":
            # gin alone (no validator): its plain-text default bodies.
            text = b"404 page not found" if err.status == 404 else b"405 method not allowed"
            self.send(err.status, text, "text/plain")
        else:
            # A reverse proxy (nginx) that routes only the paths it knows: its HTML page.
            self.send(
                404,
                b"<html><body><center><h1>404 Not Found</h1></center><hr><center>nginx</center></body></html>",
                "text/html",
            )

    def connect_error(self, err: ConnectError) -> None:
        # Connect protocol unary error: {"code": "<string>", "message": ...} and a mapped status.
        self.json(CONNECT_STATUS.get(err.code, 500), {"code": err.code, "message": err.message})

    # -- chunked streaming responses ---------------------------------------------------------

    def start_stream(self, content_type: str) -> None:
        self.started = True
        self.h.send_response(200)
        self.h.send_header("Content-Type", content_type)
        self.h.send_header("Transfer-Encoding", "chunked")
        self.h.end_headers()

    def chunk(self, data: bytes) -> None:
        if data:
            self.h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.h.wfile.flush()

    def end_stream(self) -> None:
        self.h.wfile.write(b"0\r\n\r\n")
        self.h.wfile.flush()

    def drop(self) -> None:
        """Cut the connection mid-response (fault injection: a dropped stream)."""
        self.h.close_connection = True
        self.h.wfile.flush()
        with contextlib.suppress(OSError):
            self.h.connection.shutdown(2)
