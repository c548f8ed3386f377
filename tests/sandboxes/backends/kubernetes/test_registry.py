"""The OCI distribution client of skill images (`registry.Registry`) against registries that
misbehave: a blob redirected to another host, an index that never ends in an image, a
manifest far larger than any image's — each refused in words, the credentials kept home."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandboxes.backends.base import ErrorKind, RemoteError
from sandboxes.backends.kubernetes.registry import OCI_INDEX, ImageRef, Registry, sha256_digest

Answer = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def serving(answer: Answer) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server on loopback answering every GET with `answer`; its URL and each request's headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()} | {"path": self.path})
            answer(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def reply(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", **headers: str) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def manifest_refused(url: str) -> RemoteError:
    """What reading the manifest of skills/base:latest from the registry at `url` raises."""
    registry = Registry(url, allow_private=True)
    try:
        with pytest.raises(RemoteError) as caught:
            registry.manifest(ImageRef(url.removeprefix("http://"), "skills/base", "latest"))
    finally:
        registry.close()
    return caught.value


def test_a_blob_redirected_to_another_host_is_fetched_without_the_credentials() -> None:
    data = b'{"config": true}'
    digest = sha256_digest(data)
    with serving(lambda h: reply(h, 200, data)) as (storage, stored_seen):

        def registry_answer(handler: BaseHTTPRequestHandler) -> None:
            if "authorization" not in {k.lower() for k in handler.headers}:
                reply(handler, 401, WWW_Authenticate='Basic realm="registry"')
            else:
                reply(handler, 307, Location=f"{storage}/blob-store/{digest}")

        with serving(registry_answer) as (url, _):
            registry = Registry(url, username="console", password="s3cret", allow_private=True)
            try:
                assert registry.blob("skills/base", digest) == data
            finally:
                registry.close()
    assert [seen["path"] for seen in stored_seen] == [f"/blob-store/{digest}"]
    assert "authorization" not in stored_seen[0]
    assert base64.b64encode(b"console:s3cret").decode() not in json.dumps(stored_seen)


def test_an_index_pointing_at_indexes_is_refused_not_followed_forever() -> None:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        index = {"mediaType": OCI_INDEX, "manifests": [{"digest": "sha256:" + "a" * 64}]}
        reply(handler, 200, json.dumps(index).encode(), Content_Type=OCI_INDEX)

    with serving(answer) as (url, seen):
        caught = manifest_refused(url)
    assert caught.kind == ErrorKind.INVALID
    assert len(seen) <= 3


@pytest.mark.parametrize(
    "index",
    [
        {"mediaType": OCI_INDEX, "manifests": [{"platform": {"os": "linux"}}]},
        {"mediaType": OCI_INDEX, "manifests": ["sha256:00"]},
        {"mediaType": OCI_INDEX, "manifests": {"digest": "x"}},
    ],
)
def test_an_index_of_garbage_is_refused_in_words(index: dict[str, object]) -> None:
    with serving(lambda h: reply(h, 200, json.dumps(index).encode(), Content_Type=OCI_INDEX)) as (url, _):
        caught = manifest_refused(url)
    assert caught.kind == ErrorKind.INVALID


def test_a_manifest_larger_than_any_image_s_is_refused_before_it_is_read_whole() -> None:
    chunk = b" " * 2**20

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", OCI_INDEX)
        handler.end_headers()  # no length: read until the server closes
        try:
            for _ in range(64):
                handler.wfile.write(chunk)
        except OSError:
            pass
        handler.close_connection = True

    with serving(answer) as (url, _):
        caught = manifest_refused(url)
    assert caught.kind == ErrorKind.INVALID
    assert "MiB" in caught.message


def test_a_config_blob_larger_than_any_image_s_is_refused_before_it_is_read_whole() -> None:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(64):
                handler.wfile.write(b" " * 2**20)
        handler.close_connection = True

    with serving(answer) as (url, _):
        registry = Registry(url, allow_private=True)
        try:
            with pytest.raises(RemoteError) as caught:
                registry.blob("skills/base", "sha256:" + "0" * 64)
        finally:
            registry.close()
    assert caught.value.kind == ErrorKind.INVALID
    assert "MiB" in caught.value.message
