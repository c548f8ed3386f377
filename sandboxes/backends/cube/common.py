"""Constants of the Cube adapter: list paging,
housekeeping sandboxes, reserved metadata.
"""

from __future__ import annotations

import re

# Before v0.5.0 Cube kills an idle sandbox at its TTL: the console's idle sweep pauses it first.
NO_IDLE_TTL_MARGIN_S = 900
# Grow a full page this much when asking again (Cube has no cursor).
LIST_GROWTH = 4
# Sandboxes created between counting and listing still fit.
LIST_HEADROOM = 100
# How long the rows of a first page serve the pages that follow it.
LIST_SNAPSHOT_TTL_S = 30.0
MAX_LIST_LIMIT = 64000
ALL_TRAFFIC = "0.0.0.0/0"
RESERVED_METADATA = "host-mount"
DEFAULT_LIST_LIMIT = 1000
TEMPLATE_BUILD_DEADLINE_S = 900.0
# Where a housekeeping sandbox sees the workspace host root, and what it is tagged as (the
# reaper gives a job's sandbox the job grace; its own TTL ends it sooner).
HOUSEKEEPING_MOUNT = "/mnt/console-workspaces"
HOUSEKEEPING_PURPOSE = "workspace-housekeeping"
HOUSEKEEPING_TTL_S = 300
_HOST_PATH = re.compile(r"^[A-Za-z0-9._/-]+$")


def host_root_problem(path: str) -> str | None:
    """What is wrong with `path` as a workspace host root, or None when it will do.

    It goes into Cube's `host-mount` JSON and into housekeeping commands, so it is kept to
    plain characters and one spelling of an absolute path.
    """
    if not path.startswith("/") or path == "/":
        return "an absolute path below / (e.g. /srv/sandbox-workspaces)"
    if not _HOST_PATH.match(path):
        return "letters, digits and . _ - / only"
    if "//" in path or path.endswith("/") or any(part in (".", "..") for part in path.split("/")):
        return "written without '.', '..', '//' or a trailing '/'"
    return None
