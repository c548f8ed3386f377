"""The console's own time series: a periodic housekeeping pass samples the series `/metrics`
exposes (through console.metrics' read helpers, so the charts and a scrape agree) into
MetricSample rows, one per pass, and drops rows older than their retention.

What a sample holds (`values`; keys are "<series>" or "<series>:<label value>"):

- gauges as read: `sessions:<state>` (sandbox_sessions summed by state);
- counters as their increase since the previous sample: `resolves:<outcome>` and
  `resolve_seconds` (the resolve histogram's count and sum: a rate and a mean latency),
  `backend_errors:<error kind>`, `skill_installs:<status>` (finished "skills.install" jobs),
  `reaper_claims`, `reaper_deletions`.

Counters are cumulative and start again from 0 when the processes counting them restart
(the embedded console, or every process of a multiprocess start). An increase is the
difference to the previous total; a total lower than before means the counter was reset,
and the increase is then the new total (what was counted since the restart), as
Prometheus' `increase()` does. A previous sample older than activity.max_gap_s gives no
increases (the time between would blur into one point).

Settings: activity.sample_interval_s (60), retention.activity_samples_days (14 days;
0 keeps them forever), activity.max_gap_s; docs/operations.md, "Activity charts".
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from . import metrics
from .jobs import JobContext, job_handler, prune_housekeeping_jobs, start_job
from .models import MetricSample
from .periodic import periodic
from .retention import cutoff_for, delete_in_batches
from .services import SYSTEM
from .tuning import ACTIVITY

logger = logging.getLogger(__name__)
KIND = "console.activity_sample"
SKILL_INSTALL_KIND = "skills.install"

# The series read, as current_values() names their samples.
SESSIONS = "sandbox_sessions"
RESOLVE_COUNT = "sandbox_resolve_seconds_count"
RESOLVE_SUM = "sandbox_resolve_seconds_sum"
BACKEND_ERRORS = "sandbox_backend_errors_total"
JOBS_FINISHED = "console_jobs_finished_total"
REAPER_CLAIMS = "sandbox_reaper_claims_total"
REAPER_DELETIONS = "sandbox_reaper_deletions_total"
READ = (SESSIONS, RESOLVE_COUNT, RESOLVE_SUM, BACKEND_ERRORS, JOBS_FINISHED, REAPER_CLAIMS, REAPER_DELETIONS)


def _prefixed(prefix: str, by_label: dict[str, float]) -> dict[str, float]:
    return {f"{prefix}:{label or 'unknown'}": value for label, value in by_label.items()}


def read_series() -> tuple[dict[str, float], dict[str, float]]:
    """(gauges, counter totals) as /metrics would show them now."""
    found = metrics.current_values(*READ)
    gauges = _prefixed("sessions", metrics.labels_of(found[SESSIONS], "state"))
    installs = [(labels, value) for labels, value in found[JOBS_FINISHED] if labels.get("kind") == SKILL_INSTALL_KIND]
    totals = {
        **_prefixed("resolves", metrics.labels_of(found[RESOLVE_COUNT], "outcome")),
        "resolve_seconds": metrics.total(found[RESOLVE_SUM]),
        **_prefixed("backend_errors", metrics.labels_of(found[BACKEND_ERRORS], "error")),
        **_prefixed("skill_installs", metrics.labels_of(installs, "status")),
        "reaper_claims": metrics.total(found[REAPER_CLAIMS]),
        "reaper_deletions": metrics.total(found[REAPER_DELETIONS]),
    }
    return gauges, totals


def increases(previous: dict[str, float], current: dict[str, float]) -> dict[str, float]:
    """Each counter's increase from `previous` to `current` totals; a total that went down was
    reset (its processes restarted), so its increase is the new total."""
    out: dict[str, float] = {}
    for key, now in current.items():
        before = float(previous.get(key, 0.0))
        out[key] = now - before if now >= before else now
    return out


def take_sample(now: datetime | None = None) -> MetricSample:
    """Read the series and store one sample (increases against the newest earlier sample)."""
    now = now or timezone.now()
    gauges, totals = read_series()
    with transaction.atomic():
        previous = MetricSample.objects.select_for_update().filter(time__lt=now).order_by("-time").first()
        interval: float | None = None
        deltas: dict[str, float] = {}
        if previous is not None:
            gap = (now - previous.time).total_seconds()
            if gap <= float(ACTIVITY.max_gap_s):
                interval = gap
                deltas = increases(previous.totals, totals)
        return MetricSample.objects.create(time=now, interval_s=interval, values={**gauges, **deltas}, totals=totals)


def prune_samples(now: datetime | None = None) -> int:
    cutoff = cutoff_for("activity_samples", now)
    if cutoff is None:
        return 0
    return delete_in_batches(MetricSample.objects.filter(time__lt=cutoff))


@job_handler(KIND, label="Activity sample", housekeeping=True)
def activity_sample(ctx: JobContext) -> dict[str, Any]:
    sample = take_sample()
    pruned = prune_samples()
    ctx.log(f"sampled {len(sample.values)} values" + (f"; {pruned} old samples deleted" if pruned else ""))
    prune_housekeeping_jobs(KIND)
    return {"values": len(sample.values), "pruned": pruned}


@periodic("activity-sample", task="console.activity_sample", every=lambda: ACTIVITY.sample_interval_s)
def start_activity_sample() -> None:
    """The periodic entry point: one housekeeping job per sample."""
    start_job(KIND, actor=SYSTEM)


def samples_since(since: datetime) -> list[MetricSample]:
    return list(MetricSample.objects.filter(time__gte=since).order_by("time"))


def window_start(hours: float, now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(hours=hours)
