"""Readiness of the platform backends (console.health): each registered backend's health,
asked with the platform's own credentials, never a space's.

A backend is named by its kind and the start of its id (`backend:docker:1f2e3d4c`): its name
and endpoint are the platform's business and /readyz is served to anyone.
"""

from __future__ import annotations

from console.health import Check
from console.tuning import READYZ

from ..backends.base import ErrorKind, RemoteError
from ..backends.unix_socket import SCHEME, check_unix_socket
from ..models import PlatformBackend
from .bridge import get_backend


def check_name(backend: PlatformBackend) -> str:
    return f"backend:{backend.kind}:{str(backend.id)[:8]}"


def _health_check(platform: PlatformBackend) -> Check:
    def check() -> None:
        if platform.endpoint.startswith(SCHEME):
            # Not a socket: this backend's own configuration ("invalid"), which marks it
            # failing without making the whole console unready (console.health).
            check_unix_socket(platform.endpoint)
        health = get_backend(platform).health()
        if not health.ok:
            raise RemoteError(ErrorKind.UNAVAILABLE, "unhealthy")

    return check


def backend_checks() -> list[tuple[str, Check, bool]]:
    """One check per platform backend (read afresh at each readiness run)."""

    mode = READYZ.backends
    if mode == "off":
        return []
    return [
        (check_name(backend), _health_check(backend), mode != "reported")
        for backend in PlatformBackend.objects.order_by("created")
    ]
