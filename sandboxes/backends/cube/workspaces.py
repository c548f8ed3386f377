"""Persistent workspaces on Cube: directories on the nodes' host root, mounted through
`host-mount`, made and removed by housekeeping sandboxes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capabilities import VolumesCapability
from ..e2b.common import check_volume_name, translating
from .common import HOUSEKEEPING_MOUNT

if TYPE_CHECKING:
    from .backend import CubeBackend


class CubeWorkspaceDirs(VolumesCapability):
    """Persistent workspaces as directories `<host root>/<name>` on the Cube nodes, mounted
    at /workspace through `host-mount`. Made and removed by housekeeping sandboxes."""

    def __init__(self, backend: CubeBackend) -> None:
        self.backend = backend

    def _path(self, name: str) -> str:
        return f"{HOUSEKEEPING_MOUNT}/{check_volume_name(name)}"

    def check(self) -> str:
        # The one way to learn whether the nodes can mount the root: mount it once.
        self.backend.run_housekeeping(("test", "-d", HOUSEKEEPING_MOUNT), "mounting the workspace host root")
        return f"host directories under {self.backend.host_root} mount"

    def make(self, name: str) -> None:
        self.backend.run_housekeeping(("mkdir", "-p", "--", self._path(name)), f"making workspace {name}")

    def delete(self, name: str) -> None:
        """Idempotent (`rm -rf`). A sandbox still mounting the directory would be left on a
        deleted one: delete the sandboxes first."""
        self.backend.run_housekeeping(("rm", "-rf", "--", self._path(name)), f"deleting workspace {name}")


translating(CubeWorkspaceDirs, "make", "delete")
