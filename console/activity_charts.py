"""The activity charts' numbers: samples (console/activity.py) grouped into buckets of a
window, one chart per subject. The JSON endpoint and the HTML tables render the same
`Charts`, so the table without JavaScript shows exactly what the charts draw.

Per bucket: a gauge is its last sample's value; a counter's increase is the sum over the
bucket's samples; the mean resolve latency is the bucket's resolve seconds over its resolves.
A bucket without samples holds None (a gap in the chart, "—" in the table).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from .models import MetricSample


@dataclass(frozen=True)
class Window:
    key: str
    label: str
    hours: float
    bucket_s: int

    @property
    def bucket_label(self) -> str:
        minutes = self.bucket_s // 60
        return f"{minutes} min" if minutes < 60 else ("hour" if minutes == 60 else f"{minutes // 60} h")


WINDOWS = {
    w.key: w
    for w in (
        Window("1h", "Last hour", 1, 300),
        Window("6h", "Last 6 hours", 6, 900),
        Window("24h", "Last 24 hours", 24, 3600),
        Window("14d", "Last 14 days", 24 * 14, 12 * 3600),
    )
}
DEFAULT_WINDOW = "24h"


@dataclass
class Series:
    label: str
    values: list[float | None]


@dataclass
class Chart:
    id: str
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    times: Sequence[datetime] = ()

    @property
    def rows(self) -> list[tuple[datetime, list[float | None]]]:
        """Table rows: (bucket start, one value per series)."""
        return [(t, [s.values[i] for s in self.series]) for i, t in enumerate(self.times)]


@dataclass
class Charts:
    window: Window
    times: list[datetime]
    charts: list[Chart]
    samples: int

    def by_id(self, *ids: str) -> list[Chart]:
        return [c for c in self.charts if c.id in ids] if ids else self.charts

    def to_json(self, *ids: str) -> dict[str, object]:
        return {
            "window": self.window.key,
            "bucket_s": self.window.bucket_s,
            "samples": self.samples,
            "times": [int(t.timestamp()) for t in self.times],
            "charts": [
                {
                    "id": c.id,
                    "title": c.title,
                    "unit": c.unit,
                    "series": [{"label": s.label, "values": s.values} for s in c.series],
                }
                for c in self.by_id(*ids)
            ],
        }


@dataclass
class Bucket:
    """One bucket's samples, added up once: the last sample's values (gauges) and the sum of
    the increases of the samples that have them."""

    last: dict[str, float] | None = None
    sums: dict[str, float] = field(default_factory=dict)
    has_deltas: bool = False

    def add(self, interval_s: float | None, values: dict[str, float]) -> None:
        self.last = values
        if interval_s is not None:
            self.has_deltas = True
            for key, value in values.items():
                self.sums[key] = self.sums.get(key, 0.0) + float(value)


def _keys(buckets: list[Bucket], prefix: str) -> list[str]:
    found = {k for b in buckets for k in (*(b.last or {}), *b.sums) if k.startswith(prefix + ":")}
    return sorted(found)


def _gauge(buckets: list[Bucket], key: str) -> list[float | None]:
    return [float(b.last.get(key, 0.0)) if b.last is not None else None for b in buckets]


def _increase(buckets: list[Bucket], key: str) -> list[float | None]:
    return [round(b.sums.get(key, 0.0), 6) if b.has_deltas else None for b in buckets]


def _by_label(
    buckets: list[Bucket], prefix: str, read: Callable[[list[Bucket], str], list[float | None]]
) -> list[Series]:
    return [Series(key.split(":", 1)[1], read(buckets, key)) for key in _keys(buckets, prefix)]


def _mean_latency_ms(buckets: list[Bucket]) -> list[float | None]:
    out: list[float | None] = []
    resolve_keys = _keys(buckets, "resolves")
    for bucket in buckets:
        count = sum(bucket.sums.get(k, 0.0) for k in resolve_keys)
        seconds = bucket.sums.get("resolve_seconds", 0.0)
        out.append(round(seconds / count * 1000, 1) if count else None)
    return out


def _fill(buckets: list[Bucket], start: datetime, now: datetime, start_ts: int, step: int) -> int:
    """Add every sample of the window to its bucket, here, in time order; how many there were."""
    rows = MetricSample.objects.filter(time__gte=start, time__lte=now).order_by("time")
    samples = 0
    for time, interval_s, values in rows.values_list("time", "interval_s", "values").iterator(chunk_size=2000):
        index = int((time.timestamp() - start_ts) // step)
        if 0 <= index < len(buckets):
            buckets[index].add(interval_s, values)
            samples += 1
    return samples


# The same per bucket, added up by PostgreSQL: a day of one-minute samples is 1,440 rows to
# decode and add in Python, but 24 buckets to read (the dashboard and the activity page draw it).
_BUCKETS_SQL = """
WITH s AS (
    SELECT time, id, interval_s, "values", floor((extract(epoch FROM time) - %(start_ts)s) / %(step)s)::int AS b
    FROM console_metricsample WHERE time >= %(start)s AND time <= %(now)s
), heads AS (
    SELECT b, count(*) AS n, bool_or(interval_s IS NOT NULL) AS has_deltas,
           (array_agg("values" ORDER BY time DESC, id DESC))[1] AS last
    FROM s GROUP BY b
), sums AS (
    SELECT b, jsonb_object_agg(key, total) AS sums FROM (
        SELECT s.b, e.key, sum(e.value::float8) AS total
        FROM s, jsonb_each_text(s."values") AS e
        WHERE s.interval_s IS NOT NULL GROUP BY s.b, e.key
    ) per_key GROUP BY b
)
SELECT heads.b, heads.n, heads.has_deltas, heads.last::text, sums.sums::text FROM heads LEFT JOIN sums USING (b)
"""


def _fill_in_sql(buckets: list[Bucket], start: datetime, now: datetime, start_ts: int, step: int) -> int:
    samples = 0
    with connection.cursor() as cursor:
        cursor.execute(_BUCKETS_SQL, {"start_ts": start_ts, "step": step, "start": start, "now": now})
        for index, n, has_deltas, last, sums in cursor.fetchall():
            if 0 <= index < len(buckets):
                bucket = buckets[index]
                bucket.last = json.loads(last)
                bucket.has_deltas = bool(has_deltas)
                bucket.sums = {key: float(value) for key, value in json.loads(sums).items()} if sums else {}
                samples += n
    return samples


def build_charts(window_key: str = DEFAULT_WINDOW, now: datetime | None = None) -> Charts:
    window = WINDOWS.get(window_key) or WINDOWS[DEFAULT_WINDOW]
    now = now or timezone.now()
    step = window.bucket_s
    # Buckets end at the next boundary of their size after now, so the last one is current.
    end_ts = (int(now.timestamp()) // step + 1) * step
    count = int(window.hours * 3600 // step)
    start_ts = end_ts - count * step
    start = datetime.fromtimestamp(start_ts, tz=now.tzinfo or timezone.get_current_timezone())
    buckets = [Bucket() for _ in range(count)]
    if connection.vendor == "postgresql":
        samples = _fill_in_sql(buckets, start, now, start_ts, step)
    else:
        samples = _fill(buckets, start, now, start_ts, step)
    times = [start + timedelta(seconds=i * step) for i in range(count)]
    charts = [
        Chart("sessions", "Sessions by state", "sessions", _by_label(buckets, "sessions", _gauge)),
        Chart("resolves", "Resolves by outcome", "resolves", _by_label(buckets, "resolves", _increase)),
        Chart("latency", "Mean resolve latency", "ms", [Series("mean", _mean_latency_ms(buckets))]),
        Chart("errors", "Backend errors by kind", "errors", _by_label(buckets, "backend_errors", _increase)),
        Chart("installs", "Skill installs by result", "installs", _by_label(buckets, "skill_installs", _increase)),
        Chart(
            "reaper",
            "Reaper claims and deletions",
            "sandboxes",
            [
                Series("claims", _increase(buckets, "reaper_claims")),
                Series("deletions", _increase(buckets, "reaper_deletions")),
            ],
        ),
    ]
    for chart in charts:
        chart.times = times
    return Charts(window=window, times=times, charts=charts, samples=samples)


DASHBOARD_CHARTS = ("sessions", "resolves", "errors")
