"""The OCI distribution API, as much of it as skill images need (`Registry`): read an image's
manifest, config and layers, upload blobs in chunks, put a manifest, delete one.

The registry is the platform admin's (`registry_url`, `registry_username`,
`registry_password` of the backend's settings): a tenant-controlled URL, so every request
goes through the guarded transport (`guard.GuardedTransport`, private addresses only with the
config's opt-in), and so does the token service a registry may send us to. Authentication
as registries ask for it on a 401: HTTP Basic with the credentials, or a bearer token from
the realm its `WWW-Authenticate: Bearer` names (the distribution token protocol), fetched
with the credentials for the repository's pull and push scope.

Wire facts (OCI distribution spec v1.1, CNCF distribution 2.8 as Debian ships it): blobs are
uploaded by POST /v2/<name>/blobs/uploads/, then PATCH chunks with Content-Range to the
Location it answered, then PUT ?digest=; a manifest by PUT /v2/<name>/manifests/<tag> with
its media type; a registry that does not allow deletes answers 405 (`unsupported`).

May import: the contract (`..base`), `..guard` and httpx.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx

from ..base import ErrorKind, RemoteError
from ..guard import GuardedTransport, Resolver, shown_url, split_endpoint, system_resolver

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST_TYPES = (DOCKER_MANIFEST, OCI_MANIFEST, DOCKER_LIST, OCI_INDEX)
# The gzip layer and config types that go with each manifest type.
LAYER_TYPES = {
    DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar.gzip",
    OCI_MANIFEST: "application/vnd.oci.image.layer.v1.tar+gzip",
}
CHUNK_BYTES = 8 * 2**20
# distribution refuses to store a manifest over 4 MiB; no larger manifest or config is read.
MAX_MANIFEST_BYTES = 4 * 2**20
_STATUS_KINDS = {
    400: ErrorKind.INVALID,
    401: ErrorKind.UNAUTHORIZED,
    403: ErrorKind.FORBIDDEN,
    404: ErrorKind.NOT_FOUND,
    405: ErrorKind.UNSUPPORTED,
    409: ErrorKind.CONFLICT,
    429: ErrorKind.RATE_LIMITED,
}
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class ImageRef:
    """An image reference in this registry: `host/repository` with a tag or a digest."""

    host: str
    repository: str
    reference: str  # a tag or "sha256:…"

    @property
    def text(self) -> str:
        joiner = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.host}/{self.repository}{joiner}{self.reference}"


def parse_reference(image: str) -> ImageRef:
    """`host[:port]/repo[:tag|@digest]`; an image without a registry host (Docker Hub's
    short names) gets `docker.io`, which is never the admin's registry."""
    name, digest = image.split("@", 1) if "@" in image else (image, "")
    first, _, rest = name.partition("/")
    if not rest or not ("." in first or ":" in first or first == "localhost"):
        first, rest = "docker.io", name
    tag = ""
    if ":" in rest.rsplit("/", 1)[-1]:
        rest, tag = rest.rsplit(":", 1)
    return ImageRef(host=first, repository=rest, reference=digest or tag or "latest")


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """One registry at `url` with its credentials; the connection pool lives with the object."""

    def __init__(
        self,
        url: str,
        *,
        username: str = "",
        password: str = "",
        allow_private: bool = False,
        resolver: Resolver = system_resolver,
        timeout_s: float = 120.0,
    ) -> None:
        scheme, host, _ = split_endpoint(url)
        if scheme not in ("http", "https"):
            raise RemoteError(ErrorKind.INVALID, f"the registry URL {shown_url(url)!r} starts with https:// or http://")
        self.url = f"{scheme}://{urlsplit(url).netloc}"
        # How image references name this registry: its host, and its port unless the default.
        self.host = urlsplit(url).netloc if urlsplit(url).port else host
        self._credentials = (username, password) if username else None
        self._tokens: dict[str, str] = {}  # scope -> bearer token
        self._http = httpx.Client(
            transport=GuardedTransport(allow_private=allow_private, resolver=resolver),
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            follow_redirects=False,
            headers={"User-Agent": "sandbox-console"},
        )

    def close(self) -> None:
        self._http.close()

    def holds(self, image: str) -> ImageRef:
        """`image` as a reference in this registry; RemoteError(invalid) when it lives elsewhere."""
        ref = parse_reference(image)
        if ref.host != self.host:
            raise RemoteError(
                ErrorKind.INVALID,
                f"the template's image {image} is not in the registry {self.host} this backend pushes skill "
                "images to: a skill image is a layer on the template's image, so the platform admin pushes "
                "the template's image to that registry first and names it there in the SandboxTemplate "
                "(docs/kubernetes.md, skill images)",
            )
        return ref

    # --- reads ---------------------------------------------------------------------------

    def manifest(self, ref: ImageRef, *, platform: tuple[str, str] = ("linux", "amd64")) -> tuple[dict[str, Any], str]:
        """The image manifest (an index resolved to `platform`'s entry) and its media type."""
        document, media = self._manifest_document(ref)
        if media in (DOCKER_LIST, OCI_INDEX):
            entries = document.get("manifests")
            if not isinstance(entries, list) or not all(
                isinstance(m, dict) and isinstance(m.get("digest"), str) for m in entries
            ):
                raise RemoteError(ErrorKind.INVALID, f"{ref.text} is an index whose entries name no digest")

            def platform_of(entry: dict[str, Any]) -> tuple[Any, Any]:
                found = entry.get("platform")
                return (found.get("os"), found.get("architecture")) if isinstance(found, dict) else (None, None)

            chosen = next((m for m in entries if platform_of(m) == platform), entries[0] if entries else None)
            if chosen is None:
                raise RemoteError(ErrorKind.INVALID, f"{ref.text} is an index with no image")
            # An index names images, never another index (a registry could chain them forever).
            document, media = self._manifest_document(ImageRef(ref.host, ref.repository, chosen["digest"]))
            if media in (DOCKER_LIST, OCI_INDEX):
                raise RemoteError(ErrorKind.INVALID, f"{ref.text} is an index of indexes, not of images")
        if media not in LAYER_TYPES:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"{ref.text} has a manifest of type {media!r}, not an image")
        return document, media

    def _manifest_document(self, ref: ImageRef) -> tuple[dict[str, Any], str]:
        """A manifest or index as JSON and its media type, refused past `MAX_MANIFEST_BYTES`."""
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        response = self._stream("GET", ref.repository, f"manifests/{ref.reference}", headers=headers)
        body = self._bounded(response, MAX_MANIFEST_BYTES, f"the manifest of {ref.text}")
        document = _json_object(body, f"manifest of {ref.text}")
        media = document.get("mediaType") or response.headers.get("content-type", "").split(";")[0]
        return document, str(media)

    def _bounded(self, response: httpx.Response, limit: int, what: str) -> bytes:
        """A streamed answer's body, refused (unread) past `limit` bytes."""
        try:
            body = bytearray()
            for chunk in response.iter_bytes(64 * 1024):
                body += chunk
                if len(body) > limit:
                    raise RemoteError(
                        ErrorKind.INVALID, f"{what} is over {limit // 2**20} MiB, more than the console reads"
                    )
        except httpx.TransportError as exc:
            raise RemoteError(ErrorKind.UNAVAILABLE, f"the registry {self.host} did not answer ({exc})") from None
        finally:
            response.close()
        return bytes(body)

    def blob(self, repository: str, digest: str) -> bytes:
        """A small blob (an image's config) whole, refused past `MAX_MANIFEST_BYTES`."""
        response = self._stream("GET", repository, f"blobs/{digest}")
        data = self._bounded(response, MAX_MANIFEST_BYTES, f"blob {digest} of {repository}")
        if sha256_digest(data) != digest:
            raise RemoteError(ErrorKind.INTERNAL, f"blob {digest} of {repository} does not match its digest")
        return data

    def blob_chunks(self, repository: str, digest: str) -> Iterator[bytes]:
        """A blob as it streams (a layer, whole in memory never)."""
        response = self._stream("GET", repository, f"blobs/{digest}")
        try:
            yield from response.iter_bytes(CHUNK_BYTES)
        finally:
            response.close()

    # --- writes --------------------------------------------------------------------------

    def upload_blob(self, repository: str, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Upload a blob from its chunks (each PATCHed as it comes); its (digest, size)."""
        started = self._send("POST", repository, "blobs/uploads/", expect=(202,))
        location = self._location(started)
        digest, size = hashlib.sha256(), 0
        for chunk in chunks:
            if not chunk:
                continue
            headers = {
                "Content-Type": "application/octet-stream",
                "Content-Range": f"{size}-{size + len(chunk) - 1}",
                "Content-Length": str(len(chunk)),
            }
            patched = self._send("PATCH", repository, location, content=chunk, headers=headers, expect=(202,))
            location = self._location(patched)
            digest.update(chunk)
            size += len(chunk)
        done = f"sha256:{digest.hexdigest()}"
        joiner = "&" if "?" in location else "?"
        self._send(
            "PUT", repository, f"{location}{joiner}digest={done}", headers={"Content-Length": "0"}, expect=(201,)
        )
        return done, size

    def upload_bytes(self, repository: str, data: bytes) -> str:
        """A small blob (a config), unless the registry has it already; its digest."""
        digest = sha256_digest(data)
        if not self._exists(repository, digest):
            self.upload_blob(repository, [data])
        return digest

    def put_manifest(self, repository: str, tag: str, manifest: dict[str, Any]) -> str:
        """Put `manifest` under `tag`; its digest (what a pod pins its image by)."""
        body = json.dumps(manifest, separators=(",", ":")).encode()
        self._send(
            "PUT",
            repository,
            f"manifests/{tag}",
            content=body,
            headers={"Content-Type": manifest["mediaType"]},
            expect=(201,),
        )
        return sha256_digest(body)

    def delete_manifest(self, repository: str, digest: str) -> None:
        """Delete a manifest (idempotent); `unsupported` when the registry allows no deletes."""
        try:
            self._send("DELETE", repository, f"manifests/{digest}", expect=(202, 200))
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise

    # --- the wire ------------------------------------------------------------------------

    def _exists(self, repository: str, digest: str) -> bool:
        try:
            self._send("HEAD", repository, f"blobs/{digest}", follow=True)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return False
            raise
        return True

    def _url(self, repository: str, path: str) -> str:
        if path.startswith(("http://", "https://", "/")):
            return urljoin(self.url, path)
        return f"{self.url}/v2/{repository}/{path}"

    def _location(self, response: httpx.Response) -> str:
        location = response.headers.get("location")
        if not location:
            raise RemoteError(ErrorKind.INTERNAL, "the registry started an upload without a Location")
        target = urljoin(self.url, location)
        if urlsplit(target).netloc != urlsplit(self.url).netloc:
            raise RemoteError(ErrorKind.FORBIDDEN, "the registry sent the upload to another host")
        return target

    def _send(
        self,
        method: str,
        repository: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        content: bytes | None = None,
        expect: tuple[int, ...] = (200,),
        follow: bool = False,
    ) -> httpx.Response:
        url = self._url(repository, path)
        for _ in range(4):
            response = self._request(method, url, repository, headers, content)
            if follow and response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                # Blob storage behind a redirect: the guarded transport checks where it goes.
                url = urljoin(url, response.headers["location"])
                continue
            break
        if response.status_code not in expect:
            raise _status_error(response, f"{method} {path.split('?')[0]} of {repository}")
        return response

    def _stream(
        self, method: str, repository: str, path: str, *, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        url = self._url(repository, path)
        response = self._request(method, url, repository, headers, None, stream=True)
        if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
            response.close()
            response = self._request(
                method, urljoin(url, response.headers["location"]), repository, headers, None, stream=True
            )
        if response.status_code != 200:
            response.read()
            response.close()
            raise _status_error(response, f"GET {path} of {repository}")
        return response

    def _request(
        self,
        method: str,
        url: str,
        repository: str,
        headers: dict[str, str] | None,
        content: bytes | None,
        *,
        stream: bool = False,
    ) -> httpx.Response:
        """One request, authenticated as the registry asks (once more after a 401)."""
        # The credentials go to the registry alone, never to where it redirects a blob (storage
        # elsewhere signs its URLs), as Docker and containerd do.
        home = urlsplit(url).netloc == urlsplit(self.url).netloc
        for attempt in range(2):
            sent = self._auth(repository, headers) if home else dict(headers or {})
            request = self._http.build_request(method, url, headers=sent, content=content)
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TimeoutException as exc:
                raise RemoteError(
                    ErrorKind.TIMEOUT, f"the registry {self.host} did not answer in time ({exc})"
                ) from None
            except httpx.TransportError as exc:
                raise RemoteError(ErrorKind.UNAVAILABLE, f"the registry {self.host} did not answer ({exc})") from None
            if response.status_code != 401 or attempt or not self._credentials or not home:
                return response
            challenge = response.headers.get("www-authenticate", "")
            response.close()
            self._authenticate(repository, challenge)
        return response

    def _auth(self, repository: str, headers: dict[str, str] | None) -> dict[str, str]:
        merged = dict(headers or {})
        token = self._tokens.get(repository)
        if token is not None:
            merged["Authorization"] = token
        return merged

    def _authenticate(self, repository: str, challenge: str) -> None:
        assert self._credentials is not None
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "basic":
            pair = ":".join(self._credentials).encode()
            self._tokens[repository] = "Basic " + base64.b64encode(pair).decode()
            return
        if scheme != "bearer":
            raise RemoteError(
                ErrorKind.UNAUTHORIZED, f"the registry {self.host} asks for {challenge or 'no'} authentication"
            )
        params = dict(_CHALLENGE_PARAM.findall(challenge))
        realm = params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise RemoteError(ErrorKind.UNAUTHORIZED, f"the registry {self.host} names no token service")
        query = {"service": params.get("service", ""), "scope": f"repository:{repository}:pull,push"}
        try:
            answer = self._http.get(realm, params=query, auth=self._credentials)
        except httpx.TransportError as exc:
            raise RemoteError(ErrorKind.UNAVAILABLE, f"the registry's token service did not answer ({exc})") from None
        if answer.status_code != 200:
            raise _status_error(answer, "a token from the registry's token service")
        body = _json(answer, "the token service's answer")
        token = body.get("token") or body.get("access_token")
        if not token:
            raise RemoteError(ErrorKind.UNAUTHORIZED, "the registry's token service gave no token")
        self._tokens[repository] = f"Bearer {token}"


def _json(response: httpx.Response, what: str) -> dict[str, Any]:
    return _json_object(response.content, what)


def _json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        raise RemoteError(ErrorKind.INTERNAL, f"{what} is not JSON") from None
    if not isinstance(document, dict):
        raise RemoteError(ErrorKind.INTERNAL, f"{what} is not a JSON object")
    return document


def _status_error(response: httpx.Response, what: str) -> RemoteError:
    """A registry's error answer in words: its `errors[].message` (distribution's error body)."""
    try:
        errors = response.json().get("errors") or []
        detail = "; ".join(f"{e.get('code', '')}: {e.get('message', '')}" for e in errors if isinstance(e, dict))
    except (ValueError, AttributeError, httpx.ResponseNotRead):
        detail = ""
    status = response.status_code
    kind = _STATUS_KINDS.get(status, ErrorKind.UNAVAILABLE if status >= 500 else ErrorKind.INTERNAL)
    return RemoteError(kind, f"{what}: the registry answered {status}{f' ({detail})' if detail else ''}")
