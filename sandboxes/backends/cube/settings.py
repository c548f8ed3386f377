"""What a Cube backend takes from the admins (`SCHEMA`: E2B's settings plus the workspace host
root and disk limits) and the typed options its adapter reads (`CubeOptions`); no Django."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..e2b.settings import (
    ALLOW_SPACE_API_KEY,
    API_KEY,
    DOMAIN_SETTING,
    ENDPOINT,
    OWN_API_KEY,
    SANDBOX_URL,
    E2BOptions,
    check,
    protocol_pin,
)
from ..settings import Setting, SettingsSchema, disk_settings
from .common import host_root_problem
from .releases import RELEASES

# The protocols Cube's adapter speaks, one per release family (`releases.RELEASES`), newest first.
PROTOCOL_LABELS = {release.protocol: f"Cube {release.name}" for release in reversed(RELEASES)}


@dataclass(frozen=True, kw_only=True)
class CubeOptions(E2BOptions):
    """E2B's options plus Cube's (docs/backends.md)."""

    cube_version: str = ""  # what to assume before health() has probed the cluster (pins)
    list_limit: int | None = None  # page size asked of CubeAPI
    workspace_host_root: str = ""  # shared storage of the Cube nodes; empty: no workspaces
    workspace_template: str = ""  # what housekeeping sandboxes start from
    housekeeping_metadata: dict[str, str] = field(default_factory=dict)  # stamped on them


def _host_root_problem(path: str) -> str | None:
    problem = host_root_problem(path)
    return f"The workspace host root must be {problem}." if problem else None


MAX_DISK, DISK = disk_settings("Cube sizes each template's writable layer.")

SCHEMA = SettingsSchema(
    label="Cube",
    options=CubeOptions,
    check=check,
    settings=(
        ENDPOINT,
        DOMAIN_SETTING,
        SANDBOX_URL,
        API_KEY,
        ALLOW_SPACE_API_KEY,
        Setting(
            "workspace_host_root",
            "Workspace host root",
            help="A directory on storage shared by every Cube node (e.g. /srv/sandbox-workspaces); each "
            "session's /workspace is a directory under it, mounted from the node. Empty: no persistent "
            "/workspace. Changing it leaves existing workspaces under the old root.",
            validate=_host_root_problem,
        ),
        MAX_DISK,
        OWN_API_KEY,
        protocol_pin(PROTOCOL_LABELS),
        DISK,
    ),
)
