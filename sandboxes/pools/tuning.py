"""Warm pools' knobs. Overrides: CONSOLE_TUNING pools.* (docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass

from console.tuning import room


@dataclass(frozen=True)
class PoolsTuning:
    # How often every pool is topped up and checked against its config's image and policy
    # (a claim, a skill image or a policy change also starts one at once).
    refill_interval_s: float = 10.0
    # A claim, a size change, a skill image or a policy change starts a refill at once (else
    # the periodic pass does it).
    refill_on_change: bool = True
    # Sandboxes one config's refill makes at once.
    refill_parallel: int = 4
    # A member still being made after this long was left by a refill that died.
    refill_timeout_s: int = 600
    # Ready sandboxes wait paused (True) or running (False): bench/warm_pool.py measures the
    # memory of both (the same on Docker: a paused container keeps its memory) and running
    # saves the resume at claim.
    keep_paused: bool = False
    # The Pools page and /metrics count claims of this last stretch; older rows are pruned after
    # `claims_retention_s`.
    stats_window_s: int = 3600
    claims_retention_s: int = 86400
    # Memory readings one load of a Pools page asks of the backend (one per pool with a ready
    # sandbox, one engine call each); the page's follows read the rest, a few at a time.
    memory_reads: int = 20


POOLS = room("pools", PoolsTuning)
