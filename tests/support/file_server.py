"""HTTP servers a test runs itself on one address, recording every request.

Sandboxes in tests only ever talk to servers the test runs on this machine. `RecordingServer`
binds to the address it is given (a test namespace's, tests/support/netns.py) and keeps
(client address, path) of each request, so a test can prove what a sandbox fetched and from
where. `FileServer` serves a folder (an apt mirror's shape); `PageServer` answers from a
method, as `package_index.PackageIndex` and `npm_source.NpmRegistry` do.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self


class RecordingServer:
    """A threaded server on `host`, a free port; `requests` is filled by its handler."""

    name = "recording-server"

    def __init__(self, host: str, handler: Callable[..., BaseHTTPRequestHandler]) -> None:
        self.host = host
        self.requests: list[tuple[str, str]] = []  # (client address, path)
        self._server = ThreadingHTTPServer((host, 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.name, daemon=True)

    @property
    def url(self) -> str:
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


class PageServer(RecordingServer):
    """GETs answered by `page(path)` (query and fragment cut off)."""

    def __init__(self, host: str) -> None:
        super().__init__(host, self._handler())

    def page(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body)."""
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


class FileServer(RecordingServer):
    """GET of the folder's files under `/`."""

    name = "file-server"

    def __init__(self, host: str, folder: Path) -> None:
        requests: list[tuple[str, str]] = []  # filled by the handler, which gets the list itself
        super().__init__(host, functools.partial(_Recording, directory=str(folder), requests=requests))
        self.requests = requests


class _Recording(SimpleHTTPRequestHandler):
    def __init__(self, *args: Any, requests: list[tuple[str, str]], **kwargs: Any) -> None:
        self.recorded = requests
        super().__init__(*args, **kwargs)

    def send_head(self) -> Any:  # every GET and HEAD passes here
        self.recorded.append((self.client_address[0], self.path.split("?", 1)[0]))
        return super().send_head()

    def log_message(self, format: str, *args: object) -> None:  # the hook's signature
        return  # the test reads `requests`, not stderr
