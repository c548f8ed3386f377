"""Snapshots of Docker sandboxes: `docker commit` images labelled console.kind=snapshot."""

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


class DockerSnapshots(SnapshotsCapability):
    """`docker commit` images labelled console.kind=snapshot; ids are `snap-<12 hex>`."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

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
        changes = [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in marks.items()]
        api = self.backend.api
        try:
            with _engine_call(f"snapshot of sandbox {sandbox_id}"):
                # pause=True freezes the processes for a consistent filesystem copy; the
                # engine unfreezes them when the commit returns.
                result = api.commit(
                    info.sandbox_id,
                    repository=SNAPSHOT_REPOSITORY,
                    tag=secrets.token_hex(8),
                    changes=changes,
                    pause=True,
                )
        except RemoteError:
            # A commit that failed midway may leave the sandbox frozen, which would hang
            # every later exec: make sure it runs again.
            self._ensure_unpaused(info.sandbox_id)
            raise
        # Everything the DTO needs is known here; the size is read by list() when shown.
        return SnapshotInfo(
            snapshot_id=_snapshot_id(str(result["Id"])),
            source_sandbox_id=info.sandbox_id,
            name=name,
            created_at=datetime.now(UTC),
            labels=marks,
        )

    def _blanked_metadata(self, container_id: str) -> dict[str, str]:
        with _engine_call(f"sandbox {container_id}"):
            inherited = self.backend.api.inspect_container(container_id)["Config"].get("Labels") or {}
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
        _remove_image(self.backend, attrs["Id"], f"snapshot {snapshot_id}")


def _remove_image(backend: DockerBackend, image_id: str, what: str) -> None:
    try:
        with _engine_call(f"deleting {what}"):
            # Removing by id with one tag untags and deletes; force would also untag images
            # that still have containers, so it stays off.
            backend.api.remove_image(image_id, force=_tag_count(backend, image_id) > 1)
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
