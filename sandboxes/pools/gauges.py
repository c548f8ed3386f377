"""The Pools page's numbers on /metrics, read from the rows at scrape (console.metrics
.DatabaseGauge; registered by sandboxes/apps.py): per config, its size, ready, refilling, hit
rate, claim latency p50/p95 and a pooled resolve's whole time p50/p95 over the stats window."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

from console.metrics import DatabaseGauge

from .stats import PoolReading, pooled_configs_of, read_pools

LABELS = ["space", "config"]


def _rows(value: Callable[[PoolReading], float | None]) -> Callable[[], Iterable[tuple[dict[str, str], float]]]:
    def rows() -> Iterable[tuple[dict[str, str], float]]:
        for reading in read_pools(pooled_configs_of()):
            number = value(reading)
            if number is not None:
                yield {"space": reading.config.space.name, "config": reading.config.name}, float(number)

    return rows


def _percentiles(name: str, what: str, p50: str, p95: str) -> list[DatabaseGauge]:
    """`<name>_p50_ms` and `<name>_p95_ms`: the readings' fields `p50` and `p95`."""
    return [
        DatabaseGauge(
            f"{name}_{label}_ms",
            f"{words} {what}, over the stats window.",
            LABELS,
            _rows(operator.attrgetter(field)),
        )
        for label, words, field in (("p50", "Median", p50), ("p95", "95th percentile", p95))
    ]


GAUGES = [
    DatabaseGauge("sandbox_pool_size", "Warm pool size in force, per config.", LABELS, _rows(lambda r: r.size)),
    DatabaseGauge("sandbox_pool_ready", "Warm pool sandboxes ready, unclaimed.", LABELS, _rows(lambda r: r.ready)),
    DatabaseGauge("sandbox_pool_refilling", "Warm pool sandboxes being made.", LABELS, _rows(lambda r: r.refilling)),
    DatabaseGauge(
        "sandbox_pool_hit_ratio",
        "Share of first resolves that took a pooled sandbox, over the stats window.",
        LABELS,
        _rows(lambda r: r.hit_rate),
    ),
    *_percentiles("sandbox_pool_claim", "time to hand a session a pooled sandbox", "p50_ms", "p95_ms"),
    *_percentiles(
        "sandbox_pool_ready",
        "time an agent waited for a pooled resolve (request to answer)",
        "ready_p50_ms",
        "ready_p95_ms",
    ),
]
