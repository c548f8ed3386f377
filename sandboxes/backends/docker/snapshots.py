"""Snapshots of Docker sandboxes: images labelled console.kind=snapshot, made by `docker
commit`, or flattened by `docker export | docker import` once the image would be too deep.

Why flatten, and when. Each commit adds one layer on the sandbox's image, and the engine
refuses a 126th ("max depth exceeded"), so a space that installs skill after skill hits a
wall. Measured on the real engine (overlay2, 2 cores, the 115 MB base template):

- `docker commit`: 0.2 s. A container from a 124-layer image starts 0.6 s slower than from
  a 1-layer one (1.76 s against 1.14 s for run, exec, remove): depth costs every session.
- export and import of the whole file system: 2.2 s from the base, 5.9 s from a 124-layer
  image. The result is one layer that no longer shares the base's; an older flattened
  generation frees its disk when deleted instead of living on as a parent.
- rebuilding from the template (what uninstall does) reinstalls every skill and its
  packages: seconds per skill, and it depends on the package sources still serving the
  same versions. Not used for this.

So a snapshot is a commit while the result stays within `snapshot_max_layers` (option,
default 32: a flatten every ~30 generations, amortised under 0.1 s a generation, and
sessions never start from a deep image), and a flatten otherwise. The flattened image
keeps what a commit keeps: the container's Env, Cmd, Entrypoint, WorkingDir, User,
ExposedPorts, Volumes, StopSignal and labels.
"""

from __future__ import annotations

import builtins
import json
import secrets
from collections.abc import Mapping
from contextlib import suppress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, RemoteError, SnapshotInfo
from ..capabilities import SnapshotsCapability
from .common import (
    DOCKER_MAX_LAYERS,
    KIND_SNAPSHOT,
    LABEL_META_KEYS,
    LABEL_META_PREFIX,
    LABEL_SNAPSHOT_NAME,
    LABEL_SNAPSHOT_SOURCE,
    SNAPSHOT_REPOSITORY,
    _engine_call,
    _parse_time,
    _snapshot_id,
)
from .image import (
    LABEL_KIND,
    LABEL_MANAGED,
)
from .inbound import LABEL_TRAFFIC_TOKEN

if TYPE_CHECKING:
    from .backend import DockerBackend


# ---------------------------------------------------------------------------------------
# Snapshots


DEFAULT_SNAPSHOT_MAX_LAYERS = 32


def snapshot_max_layers(value: int | None) -> int:
    """The `snapshot_max_layers` option: 2 to the engine's limit, default 32."""
    layers = DEFAULT_SNAPSHOT_MAX_LAYERS if value is None else value
    if not 2 <= layers <= DOCKER_MAX_LAYERS:
        raise RemoteError(
            ErrorKind.INVALID, f"option 'snapshot_max_layers' must be a whole number from 2 to {DOCKER_MAX_LAYERS}"
        )
    return layers


class DockerSnapshots(SnapshotsCapability):
    """Snapshot images labelled console.kind=snapshot; ids are `snap-<12 hex>`.

    Committed, or flattened when a commit would pass `max_layers` (module docstring).
    """

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend
        self.max_layers = snapshot_max_layers(backend.options.snapshot_max_layers)

    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        info = self.backend.connect(sandbox_id)  # the contract snapshots a running sandbox
        marks = {
            # A commit keeps the source container's labels, and containers started from the
            # image inherit them; the engine cannot drop a label, so the source's metadata
            # (a build's purpose and job, say) is blanked and sessions carry only their own.
            **self._blanked_metadata(info.sandbox_id),
            **(labels or {}),
            LABEL_MANAGED: "1",
            LABEL_KIND: KIND_SNAPSHOT,
            LABEL_SNAPSHOT_SOURCE: info.sandbox_id,
            LABEL_SNAPSHOT_NAME: name,
            # The image would inherit the sandbox's inbound credential, shown with its labels.
            LABEL_TRAFFIC_TOKEN: "",
        }
        api = self.backend.api
        tag = secrets.token_hex(8)
        try:
            if self.layers_of(info.sandbox_id) + 1 > self.max_layers:
                image_id = self._flatten(info.sandbox_id, tag, marks)
            else:
                changes = [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in marks.items()]
                with _engine_call(f"snapshot of sandbox {sandbox_id}"):
                    # pause=True freezes the processes for a consistent filesystem copy; the
                    # engine unfreezes them when the commit returns.
                    result = api.commit(
                        info.sandbox_id, repository=SNAPSHOT_REPOSITORY, tag=tag, changes=changes, pause=True
                    )
                image_id = str(result["Id"])
        except RemoteError:
            # A commit that failed midway may leave the sandbox frozen, which would hang
            # every later exec: make sure it runs again.
            self._ensure_unpaused(info.sandbox_id)
            raise
        # Everything the DTO needs is known here; the size is read by list() when shown.
        return SnapshotInfo(
            snapshot_id=_snapshot_id(image_id),
            source_sandbox_id=info.sandbox_id,
            name=name,
            created_at=datetime.now(UTC),
            labels=marks,
        )

    def layers_of(self, container_id: str) -> int:
        """How many layers the container's image has (a commit adds one)."""
        return self.backend.engine.layer_count(container_id)

    def _flatten(self, container_id: str, tag: str, marks: Mapping[str, str]) -> str:
        """The container's whole file system as a one-layer image, with a commit's config.

        Paused for the copy, like a commit, and unpaused after (the caller also makes sure).
        """
        api = self.backend.api
        with _engine_call(f"sandbox {container_id}"):
            config = api.inspect_container(container_id)["Config"]
        changes = [*_config_changes(config), *_label_changes({**(config.get("Labels") or {}), **marks})]
        with _engine_call(f"flattened snapshot of sandbox {container_id}"):
            api.pause(container_id)
            try:
                # Streamed: the export's chunks go to the import as they come, never whole in memory.
                api.import_image(
                    src=api.export(container_id),
                    repository=SNAPSHOT_REPOSITORY,
                    tag=tag,
                    changes=changes,
                    stream_src=True,
                )
            finally:
                api.unpause(container_id)
            return str(api.inspect_image(f"{SNAPSHOT_REPOSITORY}:{tag}")["Id"])

    def _blanked_metadata(self, container_id: str) -> dict[str, str]:
        """Blanks for the source's metadata labels, read from the connect's look (labels
        never change); inspected only if the sandbox was forgotten meanwhile."""
        engine = self.backend.engine
        inherited = engine.labels_of(container_id)
        if inherited is None:
            engine.inspect_sandbox(container_id)
            inherited = engine.labels_of(container_id) or {}
        return {key: "" for key in inherited if key.startswith(LABEL_META_PREFIX) or key == LABEL_META_KEYS}

    def _ensure_unpaused(self, container_id: str) -> None:
        with suppress(RemoteError), _engine_call("unpausing after commit"):
            if self.backend.api.inspect_container(container_id)["State"]["Status"] == "paused":
                self.backend.api.unpause(container_id)

    @staticmethod
    def _info(attrs: dict[str, Any]) -> SnapshotInfo:
        labels = dict(attrs["Config"].get("Labels") or {})
        return SnapshotInfo(
            snapshot_id=_snapshot_id(attrs["Id"]),
            source_sandbox_id=labels.get(LABEL_SNAPSHOT_SOURCE) or None,
            name=labels.get(LABEL_SNAPSHOT_NAME, ""),
            created_at=_parse_time(attrs.get("Created")),
            size_bytes=attrs.get("Size"),
            labels=labels,
        )

    def list(self) -> builtins.list[SnapshotInfo]:
        with _engine_call("listing snapshots"):
            rows = self.backend.api.images(filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SNAPSHOT}"]})
        rows.sort(key=lambda row: row["Created"])
        return [
            SnapshotInfo(
                snapshot_id=_snapshot_id(row["Id"]),
                source_sandbox_id=(row.get("Labels") or {}).get(LABEL_SNAPSHOT_SOURCE) or None,
                name=(row.get("Labels") or {}).get(LABEL_SNAPSHOT_NAME, ""),
                created_at=_parse_time(int(row["Created"])),
                size_bytes=row.get("Size"),
                labels=dict(row.get("Labels") or {}),
            )
            for row in rows
        ]

    def get(self, snapshot_id: str) -> SnapshotInfo:
        return self._info(self.backend.snapshot_image(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """Idempotent; conflict while a sandbox still runs from the snapshot."""
        try:
            attrs = self.backend.snapshot_image(snapshot_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        _remove_image(self.backend, attrs["Id"], f"snapshot {snapshot_id}", tags=len(attrs.get("RepoTags") or []))


def _quoted(value: str) -> str:
    """A Dockerfile word in double quotes: backslash, quote and `$` escaped (no expansion)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _config_changes(config: Mapping[str, Any]) -> builtins.list[str]:
    """Dockerfile lines that give an imported image the container's config, as a commit would."""
    changes = []
    for entry in config.get("Env") or []:
        key, _, value = str(entry).partition("=")
        changes.append(f"ENV {key}={_quoted(value)}")
    if config.get("Entrypoint"):
        changes.append(f"ENTRYPOINT {json.dumps(list(config['Entrypoint']))}")
    if config.get("Cmd"):
        changes.append(f"CMD {json.dumps(list(config['Cmd']))}")
    if config.get("WorkingDir"):
        changes.append(f"WORKDIR {config['WorkingDir']}")
    if config.get("User"):
        changes.append(f"USER {config['User']}")
    for port in config.get("ExposedPorts") or {}:
        changes.append(f"EXPOSE {port}")
    if config.get("Volumes"):
        changes.append(f"VOLUME {json.dumps(sorted(config['Volumes']))}")
    if config.get("StopSignal"):
        changes.append(f"STOPSIGNAL {config['StopSignal']}")
    return changes


def _label_changes(labels: Mapping[str, str]) -> builtins.list[str]:
    return [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in labels.items()]


def _remove_image(backend: DockerBackend, image_id: str, what: str, *, tags: int | None = None) -> None:
    """Removed, or untagged while a newer snapshot builds on it; `tags`: how many names the
    caller's inspect just read (else asked here)."""
    if tags is None:
        tags = _tag_count(backend, image_id)
    try:
        with _engine_call(f"deleting {what}"):
            # Removing by id with one tag untags and deletes; force would also untag images
            # that still have containers, so it stays off.
            backend.api.remove_image(image_id, force=tags > 1)
    except RemoteError as exc:
        if exc.kind == ErrorKind.NOT_FOUND:
            return
        if exc.kind == ErrorKind.CONFLICT and "dependent child images" in exc.message:
            # A newer snapshot was committed on top of it: untagged, it leaves every listing
            # and its layers go with its last child (the engine prunes untagged parents).
            _untag(backend, image_id, what)
            return
        if exc.kind == ErrorKind.CONFLICT:
            raise RemoteError(ErrorKind.CONFLICT, f"{what} is still in use: {exc.message}") from exc
        raise


def _untag(backend: DockerBackend, image_id: str, what: str) -> None:
    with _engine_call(f"image tags of {what}"):
        tags = _real_tags(backend.api.inspect_image(image_id))
    for tag in tags:
        try:
            with _engine_call(f"untagging {what}"):
                backend.api.remove_image(tag)
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise RemoteError(ErrorKind.CONFLICT, f"{what} is still in use: {exc.message}") from exc


def _real_tags(row: Mapping[str, Any]) -> builtins.list[str]:
    return [tag for tag in row.get("RepoTags") or [] if tag != "<none>:<none>"]


def _tag_count(backend: DockerBackend, image_id: str) -> int:
    with _engine_call("image tags"):
        return len(backend.api.inspect_image(image_id).get("RepoTags") or [])
