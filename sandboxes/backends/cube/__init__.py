"""The Cube adapter: the E2B adapter plus Cube's differences.

Imports nothing of the project but `sandboxes.backends` (the contract, the guard, the E2B adapter).
"""

import dataclasses

from ..e2b import DESCRIPTION as E2B_DESCRIPTION
from .common import host_root_problem

# Cube takes a disk size per template (writableLayerSize), sent when the console builds one.
DESCRIPTION = dataclasses.replace(
    E2B_DESCRIPTION, label="Cube", workspace_host_root_problem=host_root_problem, limits_disk=True
)
