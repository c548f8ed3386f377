"""The activity samples and charts: console/activity.py, activity_charts.py, activity_views.py.

Counters are the real series of console/metrics.py, counted here as the code that owns them
counts (a resolve observed, a backend error, a finished install job, a reaper claim); the
sampler reads them through the same helpers as /metrics.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, cast

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client import Counter

from console import metrics
from console.activity import increases, prune_samples, start_activity_sample, take_sample
from console.activity_charts import build_charts
from console.models import AdminJob, JobStatus, MetricSample
from sandboxes.models import Session, SessionState
from tests.factories import make_config
from tests.personas import World
from tests.support.tuning import Tuned

pytestmark = pytest.mark.django_db


def count_some(resolves: int, seconds_each: float, errors: int, installs_ok: int, claims: int) -> None:
    for _ in range(resolves):
        metrics.RESOLVE_SECONDS.labels(path="fast", outcome="bound").observe(seconds_each)
    for _ in range(errors):
        metrics.BACKEND_ERRORS.labels(backend_kind="docker", operation="exec", error="unavailable").inc()
    for _ in range(installs_ok):
        metrics.JOBS_FINISHED.labels(kind="skills.install", status="succeeded").inc()
    metrics.JOBS_FINISHED.labels(kind="diagnostics", status="succeeded").inc()  # not an install
    metrics.REAPER_CLAIMS.labels(backend_kind="docker").inc(claims)


def test_the_sampler_stores_gauges_and_the_increase_of_each_counter(world: World) -> None:
    config = make_config(world.space_a)
    for state in (SessionState.RUNNING, SessionState.RUNNING, SessionState.PAUSED):
        Session.objects.create(
            space=world.space_a, config=config, state=state, key=f"k-{state}-{Session.objects.count()}"
        )
    now = timezone.now()
    first = take_sample(now - timedelta(seconds=60))
    assert first.interval_s is None  # nothing to diff against: gauges only
    assert first.values == {"sessions:running": 2.0, "sessions:paused": 1.0}

    count_some(resolves=4, seconds_each=0.25, errors=3, installs_ok=2, claims=5)
    second = take_sample(now)
    assert second.interval_s == pytest.approx(60)
    values = second.values
    assert values["resolves:bound"] == 4
    assert values["resolve_seconds"] == pytest.approx(1.0)
    assert values["backend_errors:unavailable"] == 3
    assert values["skill_installs:succeeded"] == 2
    assert "skill_installs:diagnostics" not in values
    assert values.get("skill_installs:failed", 0) == 0
    assert values["reaper_claims"] == 5
    assert values["reaper_deletions"] == 0
    assert values["sessions:running"] == 2
    # The stored totals are what /metrics shows now.
    scraped = metrics.current_values("sandbox_reaper_claims_total")["sandbox_reaper_claims_total"]
    assert second.totals["reaper_claims"] == metrics.total(scraped)


def test_a_counter_reset_counts_what_was_counted_since_the_restart(world: World) -> None:
    now = timezone.now()
    metrics.REAPER_DELETIONS.labels(backend_kind="docker").inc(7)
    take_sample(now - timedelta(seconds=120))
    metrics.REAPER_DELETIONS.labels(backend_kind="docker").inc(2)
    before_reset = take_sample(now - timedelta(seconds=60))
    assert before_reset.values["reaper_deletions"] == 2
    # The processes counting it restart: the counter starts again from 0 and counts 3.
    for child in list(metrics.REAPER_DELETIONS._metrics.values()):
        cast(Counter, child).reset()
    metrics.REAPER_DELETIONS.labels(backend_kind="docker").inc(3)
    after = take_sample(now)
    assert after.totals["reaper_deletions"] == 3
    assert after.values["reaper_deletions"] == 3  # not 3 - (earlier total): never negative


def test_increases_handle_new_vanished_and_reset_series() -> None:
    assert increases({"a": 5, "b": 2, "gone": 4}, {"a": 8, "b": 1, "new": 6}) == {"a": 3, "b": 1, "new": 6}


def test_a_sample_after_a_long_gap_has_no_increases(tuned: Tuned, settings: Any, world: World) -> None:
    tuned({"activity.max_gap_s": 300})
    now = timezone.now()
    take_sample(now - timedelta(hours=2))
    metrics.REAPER_CLAIMS.labels(backend_kind="docker").inc()
    late = take_sample(now)
    assert late.interval_s is None
    assert "reaper_claims" not in late.values


def test_retention_drops_samples_older_than_the_setting(tuned: Tuned, settings: Any) -> None:
    tuned({"retention.activity_samples_days": 14})
    now = timezone.now()
    old = take_sample(now - timedelta(days=15))
    kept = take_sample(now - timedelta(days=13))
    assert prune_samples(now) == 1
    assert list(MetricSample.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not MetricSample.objects.filter(pk=old.pk).exists()
    tuned({"retention.activity_samples_days": 0})
    assert prune_samples(now + timedelta(days=400)) == 0


def test_the_periodic_entry_point_runs_a_housekeeping_job_that_samples(transactional_db: None) -> None:
    start_activity_sample()
    job = AdminJob.objects.get(kind="console.activity_sample")
    for _ in range(100):
        job.refresh_from_db()
        if job.is_finished:
            break
        import time

        time.sleep(0.05)
    assert job.status == JobStatus.SUCCEEDED, job.log
    assert MetricSample.objects.count() == 1


def test_charts_bucket_increases_and_keep_the_last_gauge(world: World) -> None:
    now = timezone.now()
    take_sample(now - timedelta(minutes=3))
    count_some(resolves=2, seconds_each=0.1, errors=1, installs_ok=0, claims=0)
    take_sample(now - timedelta(minutes=2))
    count_some(resolves=3, seconds_each=0.2, errors=0, installs_ok=1, claims=0)
    take_sample(now - timedelta(minutes=1))
    charts = {c.id: c for c in build_charts("1h", now).charts}
    resolves = {s.label: s.values for s in charts["resolves"].series}
    filled = [v for v in resolves["bound"] if v is not None]
    assert sum(filled) == 5
    latency = [v for v in charts["latency"].series[0].values if v is not None]
    assert latency
    assert all(100 <= v <= 200 for v in latency)
    assert sum(v or 0 for v in {s.label: s.values for s in charts["errors"].series}["unavailable"]) == 1


# --- Access and the page without JavaScript --------------------------------------------------


def sample_with_counts() -> None:
    now = timezone.now()
    take_sample(now - timedelta(minutes=2))
    count_some(resolves=6, seconds_each=0.05, errors=4, installs_ok=1, claims=2)
    take_sample(now - timedelta(minutes=1))


@pytest.mark.parametrize("persona", ["alice", "bob", "carol", "charlie"])
def test_only_platform_admins_get_the_series_and_the_page(world: World, persona: str) -> None:
    sample_with_counts()
    client = world.client_for(persona)
    assert client.get("/platform/activity/series.json").status_code == 404
    assert client.get("/platform/activity/").status_code == 404
    dashboard = client.get("/")
    assert dashboard.status_code == 200
    assert b"data-activity-src" not in dashboard.content


def test_anonymous_is_sent_to_the_login_page(world: World) -> None:
    response = Client().get("/platform/activity/series.json")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_json_series_for_a_platform_admin(world: World) -> None:
    sample_with_counts()
    client = world.client_for("root")
    payload = client.get("/platform/activity/series.json?window=1h").json()
    assert payload["window"] == "1h"
    assert payload["bucket_s"] == 300
    assert len(payload["times"]) == 12
    charts = {c["id"]: c for c in payload["charts"]}
    assert set(charts) == {"sessions", "resolves", "latency", "errors", "installs", "reaper"}
    errors = {s["label"]: s["values"] for s in charts["errors"]["series"]}
    assert sum(v or 0 for v in errors["unavailable"]) == 4
    only = client.get("/platform/activity/series.json?charts=sessions,errors&window=bogus").json()
    assert only["window"] == "24h"
    assert [c["id"] for c in only["charts"]] == ["sessions", "errors"]


def test_the_tables_hold_the_charted_numbers_without_javascript(world: World) -> None:
    sample_with_counts()
    client = world.client_for("root")
    page = client.get("/platform/activity/?window=1h").content.decode()
    payload = client.get("/platform/activity/series.json?window=1h").json()
    errors = next(c for c in payload["charts"] if c["id"] == "errors")
    # The errors table: a row per bucket, a column per series, the same numbers as the JSON.
    # (Which error kinds have a series depends on what the process counted before this test.)
    figure = re.search(r'<figure class="chart" data-chart="errors".*?</figure>', page, re.S)
    assert figure, page
    labels = re.findall(r'<th scope="col">([^<]+)</th>', figure.group(0))[1:]
    assert labels == [series["label"] for series in errors["series"]]
    rows = re.findall(r'<tr><td class="when">[^<]+</td>(.*?)</tr>', figure.group(0))
    assert len(rows) == 12
    column = labels.index("unavailable")
    cells = [re.findall(r"<td>([^<]+)</td>", row)[column] for row in rows]
    values = next(series["values"] for series in errors["series"] if series["label"] == "unavailable")
    expected = ["—" if v is None else f"{v:g}" for v in values]
    assert cells == expected
    assert "4" in cells
    assert '<details class="chart-numbers" open>' in figure.group(0)
    # The dashboard includes the same partial with its subset.
    dashboard = client.get("/").content.decode()
    assert 'data-chart="sessions"' in dashboard
    assert 'data-chart="reaper"' not in dashboard
    assert "vendor/uplot/uPlot.iife.min.js" in dashboard
