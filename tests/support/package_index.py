"""A PEP 503 simple index of local wheels, served by the test itself on one address.

Sandboxes in tests only ever talk to servers the test runs on this machine; this one binds
to the address it is given (the Docker bridge's gateway) and records every request, so a
test can prove pip fetched from it and from nowhere else.
"""

from __future__ import annotations

import hashlib
import html
from pathlib import Path

from .file_server import PageServer


class PackageIndex(PageServer):
    """`/simple/` (projects), `/simple/<project>/` (files with #sha256=), `/files/<wheel>`."""

    name = "package-index"

    def __init__(self, host: str, wheels: list[Path]) -> None:
        self.files = {wheel.name: wheel.read_bytes() for wheel in wheels}
        super().__init__(host)

    @property
    def url(self) -> str:
        return super().url + "simple/"

    def projects(self) -> dict[str, list[str]]:
        """Normalised project name → its file names (a wheel's name is `<project>-<version>-...`)."""
        found: dict[str, list[str]] = {}
        for name in sorted(self.files):
            found.setdefault(name.split("-")[0].lower().replace("_", "-"), []).append(name)
        return found

    def page(self, path: str) -> tuple[int, str, bytes]:
        if path == "/simple/":
            links = [f'<a href="{html.escape(p)}/">{html.escape(p)}</a>' for p in self.projects()]
            return 200, "text/html", _html(links)
        if path.startswith("/simple/") and path.endswith("/"):
            names = self.projects().get(path.removeprefix("/simple/").strip("/"))
            if names is None:
                return 404, "text/plain", b"no such project\n"
            links = [
                f'<a href="/files/{html.escape(n)}#sha256={hashlib.sha256(self.files[n]).hexdigest()}">'
                f"{html.escape(n)}</a>"
                for n in names
            ]
            return 200, "text/html", _html(links)
        data = self.files.get(path.removeprefix("/files/")) if path.startswith("/files/") else None
        if data is None:
            return 404, "text/plain", b"not found\n"
        return 200, "application/octet-stream", data


def _html(links: list[str]) -> bytes:
    return ("<!DOCTYPE html>\n<html><body>\n" + "<br>\n".join(links) + "\n</body></html>\n").encode()
