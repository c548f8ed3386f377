"""Skill images on Kubernetes (`KubernetesSnapshots`, the contract's `SnapshotsCapability`):
an OCI image pushed to the registry the platform admin configures (`registry_url`,
`registry_username`, `registry_password`), and a `SandboxTemplate` per image whose pod runs it,
so a session on the new image is a claim from that template (its name is the snapshot id,
`snap-…`, which the contract lets callers use as a template id).

What a snapshot holds is what a `docker commit` of the build sandbox holds (the Docker
adapter's snapshots): every file the skill pipeline changed on the pod's root file system
(skills/install/build.py: /opt/skills, Debian, pip and npm packages, the ledger, a restored
home), as one new layer on top of the image the build pod runs. Read through exec:

1. one listing of the root file system (`find -xdev`: device, change time, path). Paths on
   another device are mount points (/proc, /workspace's volume, the runtime's /etc/hosts)
   and kept out, as is /workspace itself. Changed = a change time at or after the pod
   started (the image's files were unpacked before it; a margin covers the API's whole
   seconds), with every parent directory so the layer carries their modes;
2. what went: the template image's paths (read from its layers in the registry, whiteouts
   applied) that the listing no longer has become whiteouts (`.wh.<name>`, the OCI layer
   format), the topmost of each removed tree only;
3. `tar` of the changed paths in the pod, read back in chunks (`dd`), rewritten into the
   layer with the whiteouts, gzipped and hashed as it streams (never whole in memory), and
   uploaded chunk by chunk.

Then the template image's config gets the layer's diff id and a history entry, the manifest
(the template image's type, Docker v2 or OCI) gets the layer and is put under the snapshot id
as its tag, and the SandboxTemplate copies the build claim's template with the main
container's image pinned by digest (`host/repository@sha256:…`).

The template image must live in that registry (its layers are the new image's lower
layers): one elsewhere is refused in words (`Registry.holds`). The pod's image needs
`find`, `tar` and `dd` (GNU findutils, tar and coreutils, as in Debian).

Wire facts read at kubernetes-sigs/agent-sandbox 2fd412d5: `SandboxTemplate` (group
`extensions.agents.x-k8s.io`, v1beta1) carries `spec.podTemplate` (the Sandbox blueprint) and
network policy fields; a `SandboxClaim` names a warm pool (`spec.warmPoolRef`), whose
`spec.sandboxTemplateRef` is the template: the adapter writes that template's name on each
claim it makes (annotation `console.sandbox-console/sandbox-template`).

May import: the contract (`..base`, `..capabilities`) and `.registry`; the Kubernetes client is
handed in (`custom`, `call`) by the backend.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import posixpath
import re
import secrets
import shlex
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from ..base import WORKSPACE, Backend, ErrorKind, ExecRequest, RemoteError, SnapshotInfo
from ..capabilities import SnapshotsCapability
from .registry import CHUNK_BYTES, LAYER_TYPES, ImageRef, Registry, parse_reference

GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
TEMPLATES = "sandboxtemplates"
CLAIMS = "sandboxclaims"
MANAGED_LABEL = "console.sandbox-console/managed"
KIND_LABEL = "console.sandbox-console/kind"
KIND_SNAPSHOT = "snapshot"
ANNOTATION_LABELS = "console.sandbox-console/snapshot-labels"
ANNOTATION_NAME = "console.sandbox-console/snapshot-name"
ANNOTATION_SOURCE = "console.sandbox-console/snapshot-source"
ANNOTATION_BASE = "console.sandbox-console/base-template"
ANNOTATION_SIZE = "console.sandbox-console/image-bytes"
SANDBOX_TEMPLATE = "console.sandbox-console/sandbox-template"  # claims.SANDBOX_TEMPLATE

STARTED_MARGIN_S = 2.0  # the API's times are whole seconds
EXEC_TIMEOUT_S = 600.0
LISTING_MAX_BYTES = 512 * 2**20
# Label syntax (a name without a prefix; values the same or empty).
_LABEL = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class KubernetesSnapshots(SnapshotsCapability):
    """Skill images as OCI images and SandboxTemplates (module docstring).

    `backend` runs the exec calls (the contract's `Backend.exec`, `get`); `custom` is the
    official client's `CustomObjectsApi` and `call(what, function, *args)` calls it with
    failures as RemoteError; `registry` is None when the admin configured none (then
    `create` says so); `namespace` is where templates named by id live (the backend's own
    namespace in either namespace mode), so the snapshots' templates go there."""

    def __init__(
        self,
        backend: Backend,
        *,
        custom: Any,
        call: Callable[..., Any],
        registry: Registry | None,
        namespace: str,
        started: Callable[[str], datetime | None] | None = None,
    ) -> None:
        self.backend = backend
        self.custom = custom
        self.call = call
        self.registry = registry
        self.namespace = namespace
        self.started = started

    # --- the contract --------------------------------------------------------------------

    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        registry = self._registry()
        namespace, claim = split_sandbox_id(sandbox_id)
        info = self.backend.connect(sandbox_id)  # the contract snapshots a running sandbox
        source = self._source_template(namespace, claim)
        container = main_container(source)
        base = registry.holds(str(container.get("image", "")))
        snapshot_id = f"snap-{secrets.token_hex(6)}"
        # When the pod's container started (its image was unpacked before), else the sandbox's
        # own start; with neither, every file (a layer as big as the image, but whole).
        began = (self.started(sandbox_id) if self.started else None) or info.started_at
        started = began.timestamp() - STARTED_MARGIN_S if began else 0.0
        image, size = push_skill_image(
            registry, base, self.backend, sandbox_id, since=started, tag=snapshot_id, name=name
        )
        marks = dict(labels or {})
        body = snapshot_template(source, snapshot_id, image, marks, name=name, source_sandbox=sandbox_id, size=size)
        self.call(
            f"the skill image's SandboxTemplate {snapshot_id}",
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            TEMPLATES,
            body,
        )
        return SnapshotInfo(
            snapshot_id=snapshot_id,
            source_sandbox_id=sandbox_id,
            name=name,
            created_at=datetime.now(UTC),
            size_bytes=size,
            labels=marks,
        )

    def list(self) -> list[SnapshotInfo]:
        answer = self.call(
            f"the skill images of namespace {self.namespace}",
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            TEMPLATES,
            label_selector=f"{KIND_LABEL}={KIND_SNAPSHOT}",
        )
        return [snapshot_info(item) for item in answer.get("items") or []]

    def delete(self, snapshot_id: str) -> None:
        namespace = self.namespace
        try:
            template = self._template(namespace, snapshot_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        if (template.get("metadata", {}).get("labels") or {}).get(KIND_LABEL) != KIND_SNAPSHOT:
            raise RemoteError(ErrorKind.INVALID, f"{snapshot_id} in {namespace} is not a skill image")
        try:
            self.call(
                f"the skill image's SandboxTemplate {snapshot_id}",
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                TEMPLATES,
                snapshot_id,
            )
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
        self._delete_image(str(main_container(template).get("image", "")))

    # --- the pieces ----------------------------------------------------------------------

    def _registry(self) -> Registry:
        if self.registry is None:
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "skill images on Kubernetes are OCI images pushed to a registry: the platform admin sets the "
                "backend's registry URL (and its credentials) first",
            )
        return self.registry

    def _template(self, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            self.call(
                f"SandboxTemplate {namespace}/{name}",
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                TEMPLATES,
                name,
            )
        )

    def _source_template(self, namespace: str, claim: str) -> dict[str, Any]:
        """The template the build sandbox's claim was made from."""
        body = self.call(
            f"SandboxClaim {namespace}/{claim}",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            CLAIMS,
            claim,
        )
        # A v1beta1 claim names a warm pool, not a template: the adapter writes the template
        # its pool makes sandboxes from on the claim (`claims.SANDBOX_TEMPLATE`).
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        template = annotations.get(SANDBOX_TEMPLATE) or ((body.get("spec") or {}).get("sandboxTemplateRef") or {}).get(
            "name"
        )
        if not template:
            raise RemoteError(ErrorKind.INVALID, f"the claim {namespace}/{claim} names no SandboxTemplate")
        return self._template(namespace, template)

    def _delete_image(self, image: str) -> None:
        if self.registry is None or "@sha256:" not in image:
            return
        ref = parse_reference(image)
        if ref.host != self.registry.host:
            return
        try:
            self.registry.delete_manifest(ref.repository, ref.reference)
        except RemoteError as exc:
            # A registry that allows no deletes keeps it (its garbage collection is the admin's).
            if exc.kind != ErrorKind.UNSUPPORTED:
                raise


def push_skill_image(
    registry: Registry, base: ImageRef, backend: Backend, sandbox_id: str, *, since: float, tag: str, name: str = ""
) -> tuple[str, int]:
    """The sandbox's changes since `since` (unix time) as a layer on `base`, pushed under
    `tag` in base's repository: (the new image's reference by digest, its compressed size)."""
    manifest, media = registry.manifest(base)
    config = json.loads(registry.blob(base.repository, manifest["config"]["digest"]))
    lower = base_paths(registry, base.repository, manifest)
    pod = PodTree(backend, sandbox_id)
    changed, whiteouts = layer_plan(pod.listing(), lower, since)
    try:
        layer = LayerStream(pod.chunks(pod.archive(changed)), whiteouts)
        digest, size = registry.upload_blob(base.repository, layer.chunks())
    finally:
        pod.clean()
    config = with_layer(config, layer.diff_id, name)
    config_bytes = json.dumps(config, separators=(",", ":")).encode()
    config_digest = registry.upload_bytes(base.repository, config_bytes)
    layers: list[dict[str, Any]] = [
        *manifest["layers"],
        {"mediaType": LAYER_TYPES[media], "size": size, "digest": digest},
    ]
    new_manifest = {
        "schemaVersion": 2,
        "mediaType": media,
        "config": {"mediaType": manifest["config"]["mediaType"], "size": len(config_bytes), "digest": config_digest},
        "layers": layers,
    }
    pinned = registry.put_manifest(base.repository, tag, new_manifest)
    total = sum(int(entry["size"]) for entry in layers)
    return ImageRef(registry.host, base.repository, pinned).text, total


# --- The build pod's file system ----------------------------------------------------------


class PodTree:
    """The root file system of a running pod, read through exec as root."""

    def __init__(self, backend: Backend, sandbox_id: str) -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        # In the pod (root only, a name nobody guesses), not on the console's host.
        self.scratch = f"/var/tmp/console-layer-{secrets.token_hex(6)}"  # noqa: S108

    def _run(
        self, script: str, *, stdin: bytes | None = None, max_bytes: int = 1 << 20, ok: tuple[int, ...] = (0,)
    ) -> bytes:
        result = self.backend.exec(
            self.sandbox_id,
            ExecRequest(shell=script, user="root", stdin=stdin, timeout_s=EXEC_TIMEOUT_S, max_output_bytes=max_bytes),
        )
        if result.exit_code not in ok or result.truncated or result.timed_out:
            why = result.stderr.decode(errors="replace").strip()[-300:] or f"exit {result.exit_code}"
            if result.truncated:
                why = "its output was cut"
            raise RemoteError(ErrorKind.INTERNAL, f"reading the build sandbox's files failed: {why}")
        return result.stdout

    def listing(self) -> list[tuple[int, float, str]]:
        """(device, change time, path) of every entry `find -xdev` sees from /."""
        out = self._run(r"find / -xdev -printf '%D %C@ %p\0'", max_bytes=LISTING_MAX_BYTES)
        rows = []
        for record in out.split(b"\0"):
            if not record:
                continue
            device, ctime, path = record.split(b" ", 2)
            rows.append((int(device), float(ctime), path.decode("utf-8", "surrogateescape")))
        return rows

    def archive(self, paths: Iterable[str]) -> int:
        """`tar` of `paths` (relative to /, not recursing) into the scratch folder; its size.
        A path gone since the listing is left out; GNU tar's exit 1 (a file changed as it was
        read) still wrote every entry."""
        names = b"\0".join(p.encode("utf-8", "surrogateescape") for p in paths)
        folder = shlex.quote(self.scratch)
        out = self._run(
            f"mkdir -m 0700 -p {folder} && tar --null --no-recursion --ignore-failed-read --numeric-owner"
            f" -C / -cf {folder}/layer.tar -T -"
            f"; code=$?; if [ $code -gt 1 ]; then exit $code; fi; stat -c %s {folder}/layer.tar",
            stdin=names + b"\0" if names else b"",
        )
        return int(out.split()[-1])

    def chunks(self, size: int) -> Iterator[bytes]:
        """The archive, read back in chunks."""
        blocks = CHUNK_BYTES // 2**20
        for index in range(0, (size + CHUNK_BYTES - 1) // CHUNK_BYTES):
            chunk = self._run(
                f"dd if={shlex.quote(self.scratch)}/layer.tar bs=1048576"
                f" skip={index * blocks} count={blocks} status=none",
                max_bytes=CHUNK_BYTES + 1,
            )
            yield chunk

    def clean(self) -> None:
        with contextlib.suppress(RemoteError):  # the build sandbox is deleted next anyway
            self._run(f"rm -rf -- {shlex.quote(self.scratch)}")


def layer_plan(listing: list[tuple[int, float, str]], lower: set[str], since: float) -> tuple[list[str], list[str]]:
    """(paths for the layer, whiteout paths) from the pod's listing and the image's paths."""
    root_device = next((device for device, _, path in listing if path == "/"), None)
    if root_device is None:
        raise RemoteError(ErrorKind.INTERNAL, "the build sandbox's listing has no /")
    kept_out = [WORKSPACE.strip("/")]
    current: set[str] = set()
    changed: set[str] = set()
    for device, ctime, path in listing:
        relative = path.strip("/")
        if not relative:
            continue
        if device != root_device:
            kept_out.append(relative)  # a mount point: the runtime's, not the image's
            continue
        if _under(relative, kept_out[:1]):
            continue
        current.add(relative)
        if ctime >= since:
            changed.add(relative)
    for path in list(changed):
        parent = path.rpartition("/")[0]
        while parent and parent not in changed:
            changed.add(parent)
            parent = parent.rpartition("/")[0]
    gone = sorted(p for p in lower - current if not _under(p, kept_out))
    whiteouts: list[str] = []
    for path in gone:
        if whiteouts and _under(path, whiteouts[-1:]):
            continue  # its removed parent's whiteout covers it
        whiteouts.append(path)
    wh = [f"{p.rpartition('/')[0]}/.wh.{p.rpartition('/')[2]}".lstrip("/") for p in whiteouts]
    return sorted(changed), wh


def _under(path: str, prefixes: Iterable[str]) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in prefixes)


# --- The image's own paths -----------------------------------------------------------------


def base_paths(registry: Registry, repository: str, manifest: Mapping[str, Any]) -> set[str]:
    """Every path of the image (its layers applied in order, whiteouts honoured)."""
    paths: set[str] = set()
    for layer in manifest["layers"]:
        if not str(layer.get("mediaType", "")).endswith(("gzip", "tar")):
            raise RemoteError(ErrorKind.UNSUPPORTED, f"a layer of type {layer.get('mediaType')!r} cannot be read")
        stream = ChunkReader(registry.blob_chunks(repository, layer["digest"]))
        with tarfile.open(fileobj=stream, mode="r|*") as archive:
            for member in archive:
                apply_entry(paths, member.name)
    return paths


def apply_entry(paths: set[str], name: str) -> None:
    """One layer entry on the set of paths below it (the OCI whiteout rules)."""
    relative = posixpath.normpath("/" + name).lstrip("/")  # "./usr/" and "usr" alike; "." is ""
    parent, _, base = relative.rpartition("/")
    if base == ".wh..wh..opq":
        prefix = f"{parent}/" if parent else ""
        for path in [p for p in paths if p.startswith(prefix) and p != parent]:
            paths.discard(path)
    elif base.startswith(".wh."):
        target = f"{parent}/{base[4:]}" if parent else base[4:]
        for path in [p for p in paths if p == target or p.startswith(target + "/")]:
            paths.discard(path)
    elif relative:
        paths.add(relative)


class ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (what tarfile's stream mode reads)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


# --- The layer ----------------------------------------------------------------------------


class LayerStream:
    """The pod's archive rewritten as the layer (entries, then whiteouts), gzipped as it
    streams; `diff_id` (the uncompressed tar's digest) is known once `chunks` is spent."""

    def __init__(self, archive: Iterator[bytes], whiteouts: list[str]) -> None:
        self.archive = archive
        self.whiteouts = whiteouts
        self.diff_id = ""

    def chunks(self) -> Iterator[bytes]:
        sink = _GzipSink()
        with (
            tarfile.open(fileobj=ChunkReader(self.archive), mode="r|") as source,
            tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out,
        ):
            for member in source:
                out.addfile(member, source.extractfile(member) if member.isreg() else None)
                if sink.pending >= CHUNK_BYTES:
                    yield sink.take()
            for path in self.whiteouts:
                entry = tarfile.TarInfo(path)
                entry.mode, entry.mtime = 0o600, int(datetime.now(UTC).timestamp())
                out.addfile(entry)
        sink.finish()
        self.diff_id = "sha256:" + sink.uncompressed.hexdigest()
        yield sink.take()


class _GzipSink(io.RawIOBase):
    """Where the layer's tar is written: hashed, then gzipped into a buffer taken in chunks."""

    def __init__(self) -> None:
        self.uncompressed = hashlib.sha256()
        self._gzip = zlib.compressobj(6, zlib.DEFLATED, 31)  # 31: a gzip member
        self._buffer = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        data = bytes(data)
        self.uncompressed.update(data)
        self._buffer += self._gzip.compress(data)
        return len(data)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def take(self) -> bytes:
        taken, self._buffer = bytes(self._buffer), bytearray()
        return taken

    def finish(self) -> None:
        self._buffer += self._gzip.flush()


def with_layer(config: dict[str, Any], diff_id: str, name: str) -> dict[str, Any]:
    """The image config with one more layer (and its history entry, when it keeps history)."""
    config = copy.deepcopy(config)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(diff_id)
    if "history" in config:
        config["history"].append({"created": now, "created_by": "sandbox-console: skill image", "comment": name})
    config["created"] = now
    return config


# --- SandboxTemplates ---------------------------------------------------------------------


def split_sandbox_id(sandbox_id: str) -> tuple[str, str]:
    namespace, _, claim = sandbox_id.partition(".")
    if not namespace or not claim:
        raise RemoteError(ErrorKind.INVALID, f"{sandbox_id!r} is not a Kubernetes sandbox id (namespace.claim)")
    return namespace, claim


def main_container(template: Mapping[str, Any]) -> dict[str, Any]:
    containers = (((template.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        name = (template.get("metadata") or {}).get("name", "?")
        raise RemoteError(ErrorKind.INVALID, f"the SandboxTemplate {name} has no container")
    return dict(containers[0])


def snapshot_template(
    source: Mapping[str, Any],
    snapshot_id: str,
    image: str,
    labels: Mapping[str, str],
    *,
    name: str,
    source_sandbox: str,
    size: int,
) -> dict[str, Any]:
    """The SandboxTemplate of a skill image: the source template's spec, its first container
    running `image`; the snapshot's labels kept whole in an annotation (label syntax is
    narrower) and those that fit as labels too."""
    spec = copy.deepcopy(dict(source.get("spec") or {}))
    spec["podTemplate"]["spec"]["containers"][0]["image"] = image
    fitting = {k: v for k, v in labels.items() if _LABEL.match(k) and (not v or _LABEL.match(v))}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxTemplate",
        "metadata": {
            "name": snapshot_id,
            "labels": {**fitting, MANAGED_LABEL: "1", KIND_LABEL: KIND_SNAPSHOT},
            "annotations": {
                ANNOTATION_LABELS: json.dumps(dict(labels), sort_keys=True),
                ANNOTATION_NAME: name,
                ANNOTATION_SOURCE: source_sandbox,
                ANNOTATION_BASE: str((source.get("metadata") or {}).get("name", "")),
                ANNOTATION_SIZE: str(size),
            },
        },
        "spec": spec,
    }


def snapshot_info(template: Mapping[str, Any]) -> SnapshotInfo:
    meta = template.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        labels = json.loads(notes.get(ANNOTATION_LABELS) or "{}")
    except ValueError:
        labels = {}
    created = meta.get("creationTimestamp")
    size = notes.get(ANNOTATION_SIZE, "")
    return SnapshotInfo(
        snapshot_id=str(meta.get("name", "")),
        source_sandbox_id=notes.get(ANNOTATION_SOURCE) or None,
        name=notes.get(ANNOTATION_NAME, ""),
        created_at=datetime.fromisoformat(created.replace("Z", "+00:00")) if isinstance(created, str) else None,
        size_bytes=int(size) if size.isdigit() else None,
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
    )
