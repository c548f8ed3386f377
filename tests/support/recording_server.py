"""A small HTTP server of the test's own that answers GETs from `page(path)` and records every
request, so a test can prove what a sandbox fetched and from where. Package sources
(tests/support/package_index.py, npm_source.py) build on it; each binds to the address it is
given (a network namespace of the test's), never anything off the machine."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self


class RecordingServer:
    """Serves `page(path)` on `host` (a free port) in a thread, while used as a context manager."""

    name = "recording-server"

    def __init__(self, host: str) -> None:
        self.host = host
        self.requests: list[tuple[str, str]] = []  # (client address, path)
        self._server = ThreadingHTTPServer((host, 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.name, daemon=True)

    @property
    def root(self) -> str:
        return f"http://{self.host}:{self._server.server_port}/"

    @property
    def paths(self) -> list[str]:
        return [path for _, path in self.requests]

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def page(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for a GET of `path` (query and fragment cut off)."""
        raise NotImplementedError

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        served = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the http.server hook's name
                path = self.path.split("?", 1)[0].split("#", 1)[0]
                served.requests.append((self.client_address[0], path))
                status, content_type, body = served.page(path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # the hook's signature
                return  # the test reads `requests`, not stderr

        return Handler
