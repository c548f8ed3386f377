"""Persistent storage of the fake: E2B team volumes and Cube host-directory mounts.

E2B (personality `e2b`): `/volumes` as in spec/openapi.yml and e2b-dev/infra
packages/api/internal/handlers (volume_create.go, volume_delete.go, sandbox_create.go);
each volume is a Docker named volume labelled with the fake's run, mounted where a create's
`volumeMounts` says. Cube: no `/volumes` (absent in C-May, not modelled for C-later); the
`host-mount` annotation CubeAPI lifts out of the metadata becomes a bind mount of the host
path (CubeMaster pkg/service/sandbox/hostdir_mount.go, Cubelet storage/hostdir.go).
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import uuid
from typing import Any

from tests.fakes.fake_http import HttpError, Reply, Request
from tests.fakes.fake_runtime import MountSpec
from tests.fakes.fake_state import FakeVolume, Store, now

# volume_create.go isValidVolumeName
_VOLUME_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")


class Volumes:
    """The E2B volume registry and its Docker volumes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.runtime = store.runtime

    def named(self, name: str) -> FakeVolume | None:
        with self.store.lock:
            return next((v for v in self.store.volumes.values() if v.name == name), None)

    def create(self, name: str) -> FakeVolume:
        if not _VOLUME_NAME.match(name):
            raise HttpError(400, "Invalid volume name")
        with self.store.lock:
            if self.named(name) is not None:
                # The unique constraint on (team, name) answers 400, not 409 (volume_create.go).
                raise HttpError(400, f"Volume with name '{name}' already exists")
            volume_id = str(uuid.uuid4())
            volume = FakeVolume(
                volume_id=volume_id,
                name=name,
                docker_name=self.runtime.create_volume(volume_id),
                token=secrets.token_urlsafe(24),
                created_at=now(),
            )
            self.store.volumes[volume_id] = volume
        return volume

    def get(self, volume_id: str) -> FakeVolume:
        try:
            uuid.UUID(volume_id)
        except ValueError:
            raise HttpError(400, "Invalid volume ID") from None
        with self.store.lock:
            volume = self.store.volumes.get(volume_id)
        if volume is None:
            raise HttpError(404, "Volume not found")
        return volume

    def delete(self, volume_id: str) -> None:
        """E2B forgets the volume at once and deletes its data in the background, mounted or
        not (volume_delete.go): the Docker volume goes when no container holds it any more."""
        volume = self.get(volume_id)
        with self.store.lock:
            self.store.volumes.pop(volume.volume_id, None)
            self.store.doomed_volumes.add(volume.docker_name)
        self.sweep()

    def sweep(self) -> None:
        """Remove the Docker volumes of deleted volumes that nothing mounts any more."""
        with self.store.lock:
            doomed = sorted(self.store.doomed_volumes)
        for name in doomed:
            if self.runtime.remove_volume(name):
                with self.store.lock:
                    self.store.doomed_volumes.discard(name)

    def drop_all(self) -> None:
        """Reset: every volume goes (their sandboxes are gone by then)."""
        with self.store.lock:
            self.store.doomed_volumes.update(v.docker_name for v in self.store.volumes.values())
            self.store.volumes.clear()
        self.sweep()

    # -- mounts at create -----------------------------------------------------------------------

    def mounts_for(self, body: dict[str, Any], annotations: dict[str, str]) -> list[MountSpec]:
        if self.store.is_cube:
            # CubeAPI sends `volumes: None` to CubeMaster: volumeMounts are ignored.
            return host_mounts(annotations.get("host-mount"))
        return self.volume_mounts(body.get("volumeMounts"))

    def volume_mounts(self, requested: Any) -> list[MountSpec]:
        """sandbox_create.go convertAPIVolumesToOrchestratorVolumes: every mount is checked and
        all problems answered at once as a 400."""
        if not requested:
            return []
        if not isinstance(requested, list) or not all(isinstance(item, dict) for item in requested):
            raise HttpError(400, "Error when parsing request: volumeMounts must be a list of {name, path}")
        mounts: list[MountSpec] = []
        problems: list[str] = []
        used: set[str] = set()
        for index, item in enumerate(requested):
            name, path = str(item.get("name") or ""), str(item.get("path") or "")
            volume = self.named(name)
            if volume is None:
                problems.append(f"\t- volume mount #{index}: volume '{name}' not found")
                continue
            reason = _mount_path_problem(path) or (f"path '{path}' is already used" if path in used else None)
            if reason is not None:
                problems.append(f"\t- volume mount #{index}: {reason}")
                continue
            used.add(path)
            mounts.append(MountSpec("volume", volume.docker_name, path))
        if problems:
            raise HttpError(400, "invalid mounts:\n" + "\n".join(problems))
        return mounts

    # -- routes ---------------------------------------------------------------------------------

    def _e2b_only(self) -> None:
        if self.store.is_cube:
            # Cube C-May has no /volumes (protocol reference 6.1); C-later's is not modelled.
            raise HttpError(404, "no route")

    def post(self, req: Request, reply: Reply) -> None:
        # POST /volumes {name} -> 201 VolumeAndToken {volumeID, name, token}
        self._e2b_only()
        body = req.json()
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise HttpError(400, "Error when parsing request: name is required")
        volume = self.create(name)
        reply.json(201, _with_token(volume))

    def list(self, req: Request, reply: Reply) -> None:
        # GET /volumes -> 200 [Volume {volumeID, name}]
        self._e2b_only()
        with self.store.lock:
            volumes = sorted(self.store.volumes.values(), key=lambda v: v.created_at)
        reply.json(200, [{"volumeID": v.volume_id, "name": v.name} for v in volumes])

    def get_one(self, req: Request, reply: Reply) -> None:
        # GET /volumes/{volumeID} -> 200 VolumeAndToken, 404
        self._e2b_only()
        reply.json(200, _with_token(self.get(req.params["vid"])))

    def delete_one(self, req: Request, reply: Reply) -> None:
        # DELETE /volumes/{volumeID} -> 204, 404
        self._e2b_only()
        self.delete(req.params["vid"])
        reply.empty(204)


def _with_token(volume: FakeVolume) -> dict[str, Any]:
    return {"volumeID": volume.volume_id, "name": volume.name, "token": volume.token}


def _mount_path_problem(path: str) -> str | None:
    # sandbox_create.go isValidMountPath (Go's filepath.Clean also folds a leading "//").
    if not path:
        return "path cannot be empty"
    if not path.startswith("/"):
        return "path must be absolute"
    if posixpath.normpath(path) != path or path.startswith("//"):
        return "path must not contain any '.' or '..' components"
    return None


def host_mounts(raw: str | None) -> list[MountSpec]:
    """Cube's `host-mount` annotation as bind mounts. CubeMaster refuses a bad annotation and
    CubeAPI answers any create failure with 500 (CubeAPI services/sandboxes.rs internal_error)."""
    if raw is None or not raw.strip():
        return []
    try:
        entries = json.loads(raw)
    except ValueError as e:
        raise HttpError(500, f'invalid "host-mount" annotation: {e}') from e
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise HttpError(500, 'invalid "host-mount" annotation: not a list of objects')
    mounts = []
    for index, entry in enumerate(entries):
        host, target = str(entry.get("hostPath") or ""), str(entry.get("mountPath") or "")
        for field, value in (("hostPath", host), ("mountPath", target)):
            if not value.startswith("/"):
                raise HttpError(500, f'"host-mount" entry[{index}]: {field} must be an absolute path, got "{value}"')
        mounts.append(MountSpec("bind", host, target, read_only=bool(entry.get("readOnly", False))))
    return mounts
