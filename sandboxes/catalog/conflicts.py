"""A refusal by the console's own rules (a space's settings, a session's state), not a backend
failure: its message is written for the user and shown as it is (409 on the API)."""

from __future__ import annotations

from ..backends.base import RemoteError


class Conflict(RemoteError):
    """Base of `catalog.network.PolicyConflict` and `sessions.runtime.SessionConflict`."""
