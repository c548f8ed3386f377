"""The Cube adapter: the E2B adapter plus Cube's differences.

`settings` declares what it takes from the admins (`SCHEMA`) and its typed options.

Imports nothing of the project but `sandboxes.backends` (the contract, the guard, the E2B adapter).
"""

from .settings import SCHEMA as SCHEMA
from .settings import CubeOptions as CubeOptions
