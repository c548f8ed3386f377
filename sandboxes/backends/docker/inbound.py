"""Inbound traffic to Docker sandboxes: served by the console's own proxy, never by a port the
engine publishes on the host.

- `public_url(id, port)` = the console's inbound route, `<inbound_url><id>/<port>/`; the
  prefix comes in as `DockerOptions.inbound_url` (composed above the adapter from
  the console's settings; default "/inbound/", a path the page makes absolute);
- the traffic token is made at create (32 random bytes) and kept in the container's label
  `console.traffic-token`, so it survives console restarts and is read back on connect;
- `console_upstream(id, port)` is the sandbox's own address on its space's network, read from
  the engine's inspect: the proxy connects nowhere else;
- a sandbox with inbound on and outbound off sits on the space's *internal* network (Docker
  `internal=true`: no route off the bridge; the host packet filter keeps it off the host's own
  addresses like every `sbx-` bridge), so the console reaches it while it reaches nothing.

Imports nothing of the project.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from ..base import META_SPACE, ErrorKind, RemoteError, SandboxState
from ..capabilities import InboundCapability
from .common import (
    _SANDBOX_ID,
    _STATES,
    KIND_SANDBOX,
    LABEL_META_PREFIX,
    _engine_call,
)
from .image import LABEL_KIND, LABEL_MANAGED

if TYPE_CHECKING:
    from .engine import DockerEngine
    from .networks import DockerNetworks

LABEL_TRAFFIC_TOKEN = "console.traffic-token"  # noqa: S105 - a label name, not a secret
DEFAULT_INBOUND_URL = "/inbound/"
TOKEN_HEADER = "X-Traffic-Token"  # noqa: S105 - a header name, not a secret


def new_traffic_token() -> str:
    return secrets.token_urlsafe(32)


class DockerInbound(InboundCapability):
    """Ports of Docker sandboxes at the console's inbound route, guarded by the traffic token."""

    token_header = TOKEN_HEADER
    served_by_console = True

    def __init__(self, engine: DockerEngine, networks: DockerNetworks) -> None:
        self.engine = engine
        self.networks = networks
        self.prefix = engine.options.inbound_url or DEFAULT_INBOUND_URL
        if not self.prefix.endswith("/"):
            self.prefix += "/"

    def public_url(self, sandbox_id: str, port: int) -> str:
        _check_port(port)
        return f"{self.prefix}{sandbox_id}/{port}/"

    def traffic_token(self, sandbox_id: str) -> str | None:
        labels = (self._inspect(sandbox_id)["Config"].get("Labels")) or {}
        return labels.get(LABEL_TRAFFIC_TOKEN) or None

    def console_upstream(self, sandbox_id: str, port: int) -> tuple[str, int]:
        _check_port(port)
        if not self._engine_is_local():
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "inbound traffic reaches sandboxes of a local engine only (the console connects "
                "to the sandbox's address on the engine's bridge)",
            )
        attrs = self._inspect(sandbox_id)
        state = _STATES.get(attrs["State"]["Status"], SandboxState.GONE)
        if state != SandboxState.RUNNING:
            raise RemoteError(ErrorKind.CONFLICT, f"the sandbox is {state}, not running")
        labels = attrs["Config"].get("Labels") or {}
        space = labels.get(LABEL_META_PREFIX + META_SPACE, "")
        own = (self.networks.space_network_name(space), self.networks.inbound_network_name(space))
        networks: dict[str, Any] = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
        for name in own:
            address = str((networks.get(name) or {}).get("IPAddress") or "")
            if address:
                return address, port
        raise RemoteError(
            ErrorKind.UNSUPPORTED,
            "the sandbox has no network to reach it on (it was created while inbound was off); "
            "rebuild the session to apply the space's inbound switch",
        )

    def _engine_is_local(self) -> bool:
        return self.engine.is_local()

    def _inspect(self, sandbox_id: str) -> dict[str, Any]:
        """One inspect of a console sandbox (not_found for any other container)."""
        if not _SANDBOX_ID.match(sandbox_id or ""):
            raise RemoteError(ErrorKind.INVALID, f"malformed sandbox id {sandbox_id!r}")
        with _engine_call(f"sandbox {sandbox_id}"):
            attrs: dict[str, Any] = self.engine.api.inspect_container(sandbox_id)
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_MANAGED) != "1" or labels.get(LABEL_KIND) != KIND_SANDBOX:
            raise RemoteError(ErrorKind.NOT_FOUND, f"sandbox {sandbox_id}: no such sandbox")
        return attrs


def _check_port(port: int) -> None:
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise RemoteError(ErrorKind.INVALID, f"invalid port {port!r} (1-65535)")
