"""The E2B adapter: sandboxes on E2B cloud or any E2B-compatible control plane.

`settings` declares what it takes from the admins (`SCHEMA`) and its typed options.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""

from .settings import SCHEMA as SCHEMA
from .settings import E2BOptions as E2BOptions
