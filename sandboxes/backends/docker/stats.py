"""Resource use of a Docker sandbox: the engine's stats, read once (`stats(stream=False)`).

The engine takes two readings about a second apart for a one-shot answer, which gives the
CPU use over that second (`precpu_stats` to `cpu_stats`), as `docker stats` shows it. Memory
alone needs one reading: `memory_bytes` asks for it with `one-shot` (engine API 1.41), at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from docker.utils import version_lt

from ..base import ErrorKind, RemoteError
from ..capabilities import SandboxStats, StatsCapability
from .common import _engine_call

if TYPE_CHECKING:
    from .engine import DockerEngine

_NO_READING = "0001-01-01T00:00:00Z"


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def cpu_percent(stats: dict[str, Any]) -> float | None:
    """100.0 = one CPU busy, over the interval between the engine's two readings."""
    cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
    total = (cpu.get("cpu_usage") or {}).get("total_usage")
    before = (pre.get("cpu_usage") or {}).get("total_usage")
    system, system_before = cpu.get("system_cpu_usage"), pre.get("system_cpu_usage")
    if total is None or before is None or system is None or system_before is None:
        return None
    cpus = cpu.get("online_cpus") or len((cpu.get("cpu_usage") or {}).get("percpu_usage") or []) or 1
    system_delta = system - system_before
    if system_delta <= 0:
        return 0.0
    return round(max(total - before, 0) / system_delta * cpus * 100.0, 2)


def memory_in_use(memory: dict[str, Any]) -> int | None:
    """Usage less the page cache, as `docker stats` (cgroup v2: inactive_file; v1: cache)."""
    usage = _int(memory.get("usage"))
    if usage is None:
        return None
    detail = memory.get("stats") or {}
    cache = detail.get("inactive_file", detail.get("total_inactive_file", detail.get("cache", 0)))
    return max(usage - int(cache or 0), 0)


class DockerStats(StatsCapability):
    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def read(self, sandbox_id: str) -> SandboxStats:
        container_id = self.engine.container_id(sandbox_id)
        stats = self._stats(container_id)
        memory = stats.get("memory_stats") or {}
        networks = stats.get("networks") or {}
        limit = _int(memory.get("limit"))
        nano_cpus = self.engine.api.inspect_container(container_id).get("HostConfig", {}).get("NanoCpus") or 0
        return SandboxStats(
            cpu_percent=cpu_percent(stats),
            cpu_count=nano_cpus / 1e9 if nano_cpus else None,
            memory_bytes=memory_in_use(memory),
            # An unlimited container reports the host's memory (or a huge number) as its limit.
            memory_limit_bytes=limit if limit and limit < 1 << 50 else None,
            net_rx_bytes=sum(int(n.get("rx_bytes", 0)) for n in networks.values()) if networks else None,
            net_tx_bytes=sum(int(n.get("tx_bytes", 0)) for n in networks.values()) if networks else None,
            read_at=time.time(),
        )

    def memory_bytes(self, sandbox_id: str) -> int | None:
        container_id = self.engine.container_id(sandbox_id)
        one_shot = not version_lt(self.engine.api.api_version, "1.41")
        return memory_in_use(self._stats(container_id, one_shot=one_shot).get("memory_stats") or {})

    def _stats(self, container_id: str, *, one_shot: bool = False) -> dict[str, Any]:
        with _engine_call("reading the sandbox's stats"):
            stats: dict[str, Any] = self.engine.api.stats(container_id, stream=False, one_shot=one_shot or None)
        if not stats or stats.get("read") in (None, "", _NO_READING):
            raise RemoteError(ErrorKind.CONFLICT, "the sandbox is not running: no stats")
        return stats
