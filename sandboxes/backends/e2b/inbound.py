"""Inbound URLs of E2B sandboxes and the traffic token public traffic needs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import ErrorKind, RemoteError
from ..capabilities import InboundCapability
from .common import translating

if TYPE_CHECKING:
    from .backend import E2BBackend


class E2BInbound(InboundCapability):
    """Port URLs `https://<port>-<id>.<domain>`; the traffic token (needed when public
    traffic is off) comes from the create/connect answer and is cached per backend."""

    token_header = "e2b-traffic-access-token"  # noqa: S105 - a header name

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def public_url(self, sandbox_id: str, port: int) -> str:
        if not 1 <= port <= 65535:
            raise RemoteError(ErrorKind.INVALID, f"invalid port {port}")
        return f"https://{port}-{sandbox_id}.{self.backend.domain}"

    def traffic_token(self, sandbox_id: str) -> str | None:
        with self.backend._lock:
            return self.backend._traffic_tokens.get(sandbox_id)


translating(E2BInbound, "public_url", "traffic_token")
