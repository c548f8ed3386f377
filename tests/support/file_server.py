"""A folder served over plain HTTP by the test itself on one address (an apt mirror's shape).

Binds to the address it is given (a test namespace's, tests/support/netns.py) and records
every request, so a test can prove what a sandbox fetched and from where.
"""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any


class FileServer:
    """GET of the folder's files under `/`; `requests` holds (client address, path)."""

    def __init__(self, host: str, folder: Path) -> None:
        self.host = host
        self.requests: list[tuple[str, str]] = []
        handler = functools.partial(_Recording, directory=str(folder), requests=self.requests)
        self._server = ThreadingHTTPServer((host, 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="file-server", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._server.server_port}/"

    @property
    def paths(self) -> list[str]:
        return [path for _, path in self.requests]

    def __enter__(self) -> FileServer:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class _Recording(SimpleHTTPRequestHandler):
    def __init__(self, *args: Any, requests: list[tuple[str, str]], **kwargs: Any) -> None:
        self.recorded = requests
        super().__init__(*args, **kwargs)

    def send_head(self) -> Any:  # every GET and HEAD passes here
        self.recorded.append((self.client_address[0], self.path.split("?", 1)[0]))
        return super().send_head()

    def log_message(self, format: str, *args: object) -> None:  # the hook's signature
        return  # the test reads `requests`, not stderr
