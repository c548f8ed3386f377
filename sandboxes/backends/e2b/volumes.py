"""E2B volumes as persistent workspaces (one per session)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..base import ErrorKind, RemoteError
from ..capabilities import VolumesCapability
from .common import _q, check_volume_name, translating

if TYPE_CHECKING:
    from .backend import E2BBackend


# ---------------------------------------------------------------------------------------
# Volumes


class E2BVolumes(VolumesCapability):
    """E2B team volumes as persistent workspaces: `POST /volumes {name}`, `GET /volumes`,
    `DELETE /volumes/{id}` (e2b SDK 2.63 api/client/api/volumes). E2B addresses a volume by id;
    the console knows its workspaces by name, so both calls look the name up first."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def check(self) -> str:
        with self._no_volumes_is_unsupported():
            response = self.backend._api("GET", "/volumes", "listing volumes", idempotent=True)
        return f"team volumes available ({len(response.json())} on the team)"

    def ensure(self, name: str) -> None:
        """The volume exists afterwards (created when missing)."""
        if self._find(name) is not None:
            return
        try:
            with self._no_volumes_is_unsupported():
                self.backend._api("POST", "/volumes", f"creating volume {name}", idempotent=False, json={"name": name})
        except RemoteError as exc:
            # A name taken meanwhile is a 400 "already exists" (infra volume_create.go): look again.
            if exc.kind != ErrorKind.INVALID or self._find(name) is None:
                raise

    def delete(self, name: str) -> None:
        """Idempotent. E2B deletes a mounted volume too (its data goes in the background)."""
        volume_id = self._find(check_volume_name(name))
        if volume_id is None:
            return
        try:
            self.backend._api("DELETE", f"/volumes/{_q(volume_id)}", f"deleting volume {name}", idempotent=True)
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise

    @staticmethod
    @contextmanager
    def _no_volumes_is_unsupported() -> Iterator[None]:
        try:
            yield
        except RemoteError as exc:
            if exc.kind in (ErrorKind.FORBIDDEN, ErrorKind.UNSUPPORTED):
                # 403 "use of volumes is not enabled", 501 volume tokens not configured.
                raise RemoteError(
                    ErrorKind.UNSUPPORTED,
                    f"this E2B team has no volumes ({exc.message}); turn the persistent /workspace off",
                ) from None
            raise

    def _find(self, name: str) -> str | None:
        with self._no_volumes_is_unsupported():
            response = self.backend._api("GET", "/volumes", "listing volumes", idempotent=True)
        ids = [str(row["volumeID"]) for row in response.json() if row.get("name") == name]
        return ids[0] if ids else None


translating(E2BVolumes, "check", "ensure", "delete")
