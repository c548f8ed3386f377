"""Resource use of an E2B sandbox: `GET /sandboxes/{id}/metrics` (a list of SandboxMetric,
newest last; its own protocol, no envd call). E2B counts `cpuUsedPct` over all the sandbox's
CPUs; it is scaled to `docker stats`' convention (100.0 = one CPU busy). Network use is not
in the protocol (None)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..base import ErrorKind, RemoteError
from ..capabilities import SandboxStats, StatsCapability

if TYPE_CHECKING:
    from .backend import E2BBackend


def _number(row: dict[str, Any], name: str) -> float | None:
    value = row.get(name)
    return float(value) if isinstance(value, int | float) else None


class E2BStats(StatsCapability):
    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def read(self, sandbox_id: str) -> SandboxStats:
        response = self.backend._api(
            "GET", f"/sandboxes/{quote(sandbox_id, safe='')}/metrics", f"metrics of {sandbox_id}", idempotent=True
        )
        rows = response.json()
        if not isinstance(rows, list) or not rows or not isinstance(rows[-1], dict):
            raise RemoteError(ErrorKind.CONFLICT, "the backend reported no metrics for this sandbox")
        row = rows[-1]
        cpus, used = _number(row, "cpuCount"), _number(row, "cpuUsedPct")
        memory, limit = _number(row, "memUsed"), _number(row, "memTotal")
        return SandboxStats(
            cpu_percent=round(used * cpus, 2) if used is not None and cpus else used,
            cpu_count=cpus,
            memory_bytes=int(memory) if memory is not None else None,
            memory_limit_bytes=int(limit) if limit else None,
            read_at=float(row.get("timestampUnix") or time.time()),
        )
