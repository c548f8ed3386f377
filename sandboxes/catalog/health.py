"""Readiness of the platform backends (console.health): each registered backend's health,
asked with the platform's own credentials, never a space's.

A backend is named by its kind and the start of its id (`backend:docker:1f2e3d4c`): its name
and endpoint are the platform's business and /readyz is served to anyone.
"""

from __future__ import annotations

from console.crypto import decrypt
from console.health import Check
from console.tuning import READYZ

from ..backends.base import BackendConfig, ErrorKind, RemoteError
from ..backends.unix_socket import SCHEME, check_unix_socket
from ..models import PlatformBackend
from .bridge import tls_options
from .observed import build_observed


def check_name(backend: PlatformBackend) -> str:
    return f"backend:{backend.kind}:{str(backend.id)[:8]}"


def platform_backend_config(backend: PlatformBackend) -> BackendConfig:
    """The platform backend's own infrastructure and credentials (no space's config)."""
    return BackendConfig(
        kind=backend.kind,
        endpoint=backend.endpoint,
        domain=backend.domain,
        api_key=decrypt(backend.api_key_encrypted),
        allow_private_endpoints=backend.allow_private_endpoints,
        options={**({"sandbox_url": backend.sandbox_url} if backend.sandbox_url else {}), **tls_options(backend)},
    )


def _health_check(config: BackendConfig) -> Check:
    def check() -> None:
        if config.endpoint.startswith(SCHEME):
            # Not a socket: this backend's own configuration ("invalid"), which marks it
            # failing without making the whole console unready (console.health).
            check_unix_socket(config.endpoint)
        backend = build_observed(config)
        try:
            health = backend.health()
        finally:
            backend.close()
        if not health.ok:
            raise RemoteError(ErrorKind.UNAVAILABLE, "unhealthy")

    return check


def backend_checks() -> list[tuple[str, Check, bool]]:
    """One check per platform backend (read afresh at each readiness run)."""

    mode = READYZ.backends
    if mode == "off":
        return []
    return [
        (check_name(backend), _health_check(platform_backend_config(backend)), mode != "reported")
        for backend in PlatformBackend.objects.order_by("created")
    ]
