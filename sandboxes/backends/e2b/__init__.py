"""The E2B adapter: sandboxes on E2B cloud or any E2B-compatible control plane.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""

from ..base import KindDescription

DESCRIPTION = KindDescription(
    label="E2B",
    endpoint_schemes=("https://", "http://"),
    endpoint_rule="The control-plane URL starts with https:// (or http:// on a private network).",
    endpoint_required=True,
    needs_domain=True,
    takes_api_key=True,
    takes_sandbox_url=True,
    versioned_protocol=True,
)
