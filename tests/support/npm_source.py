"""npm package sources of the test's own: tarballs written here, an npm registry serving them
on one address, and a template image with Node.js and npm from Debian packages.

The registry answers `/<name>` with the package document (scoped names arrive as
`@scope%2fname`) and `/-/files/<file>` with a tarball, and records every request. It binds to
the address it is given (a network namespace of the test's, tests/support/netns.py); nothing
here reaches off the machine. The template is built with mmdebstrap from the Debian mirror on
the host, as the base image is, once, and kept for later runs.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest

from tests.support.file_server import PageServer

NODE_IMAGE = "sandbox-console/node-template:latest"
NODE_PACKAGES = ("nodejs", "npm")


def write_npm_tarball(
    folder: Path,
    name: str,
    version: str,
    *,
    dependencies: Mapping[str, str] | None = None,
    scripts: Mapping[str, str] | None = None,
    files: Mapping[str, bytes] | None = None,
    **fields: Any,
) -> Path:
    """An npm tarball as `npm pack` writes it: everything under `package/`."""
    manifest: dict[str, Any] = {"name": name, "version": version, "main": "index.js", **fields}
    if dependencies:
        manifest["dependencies"] = dict(dependencies)
    if scripts:
        manifest["scripts"] = dict(scripts)
    entries = {"package.json": json.dumps(manifest, indent=2).encode()}
    entries.update(files or {"index.js": f"module.exports = {json.dumps(f'{name} {version}')};\n".encode()})
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name.replace('@', '').replace('/', '-')}-{version}.tgz"
    with tarfile.open(target, "w:gz") as archive:
        for path, data in entries.items():
            member = tarfile.TarInfo(f"package/{path}")
            member.size = len(data)
            member.mode = 0o644
            archive.addfile(member, io.BytesIO(data))
    return target


def tarball_manifest(path: Path) -> dict[str, Any]:
    with tarfile.open(path, "r:gz") as archive:
        extracted = archive.extractfile("package/package.json")
        assert extracted is not None
        document: dict[str, Any] = json.loads(extracted.read())
        return document


class NpmRegistry(PageServer):
    """The package documents of the tarballs, with `dist.tarball` on this server."""

    name = "npm-registry"

    def __init__(self, host: str, tarballs: list[Path]) -> None:
        self.tarballs = {path.name: path.read_bytes() for path in tarballs}
        self.manifests = {path.name: tarball_manifest(path) for path in tarballs}
        super().__init__(host)

    def document(self, name: str) -> dict[str, Any] | None:
        versions: dict[str, Any] = {}
        for file, manifest in self.manifests.items():
            if manifest["name"] != name:
                continue
            data = self.tarballs[file]
            versions[manifest["version"]] = {
                **manifest,
                "dist": {
                    "tarball": f"{self.url}-/files/{quote(file)}",
                    "shasum": hashlib.sha1(data, usedforsecurity=False).hexdigest(),
                    "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode(),
                },
            }
        if not versions:
            return None
        latest = max(versions, key=lambda v: tuple(int(part) for part in v.split(".")))
        return {"name": name, "dist-tags": {"latest": latest}, "versions": versions}

    def page(self, path: str) -> tuple[int, str, bytes]:
        if path.startswith("/-/files/"):
            data = self.tarballs.get(unquote(path.removeprefix("/-/files/")))
            return (200, "application/octet-stream", data) if data is not None else (404, "text/plain", b"not found\n")
        document = self.document(unquote(path.lstrip("/")))
        if document is None:
            return 404, "application/json", b'{"error":"not found"}'
        return 200, "application/json", json.dumps(document).encode()


@pytest.fixture(scope="session")
def docker_node_image(docker_base_image: str) -> Iterator[str]:
    """A template with Node.js and npm from Debian's packages (built once, then kept)."""
    import docker

    from sandboxes.backends.docker.image import (
        EXTRA_PACKAGES,
        LABEL_PACKAGES,
        build_rootfs_image,
        image_exists,
        template_labels,
    )

    client = docker.from_env(timeout=600)
    try:
        packages = (*EXTRA_PACKAGES, *NODE_PACKAGES)
        wanted = ",".join(sorted(packages))
        if not image_exists(client, NODE_IMAGE) or client.images.get(NODE_IMAGE).labels.get(LABEL_PACKAGES) != wanted:
            labels = template_labels("node", "the base template with Node.js and npm", {LABEL_PACKAGES: wanted})
            build_rootfs_image(client, NODE_IMAGE, packages=packages, labels=labels)
        yield NODE_IMAGE
    finally:
        client.close()
