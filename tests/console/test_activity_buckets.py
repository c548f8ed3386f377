"""The activity charts' buckets added up by PostgreSQL are the ones Python adds up: last gauge,
summed increases, no increases where no sample had an interval, every window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from console import activity_charts
from console.models import MetricSample

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]


def test_postgresql_buckets_match_the_python_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the SQL path is PostgreSQL's")
    now = timezone.now()
    MetricSample.objects.bulk_create(
        MetricSample(
            time=now - timedelta(minutes=minute, seconds=minute % 7),
            # A gap every 50 samples: no interval, so no increases in that sample.
            interval_s=None if minute % 50 == 0 else 60.0 + minute % 3,
            values={
                "sessions:running": float(minute % 11),
                f"sessions:{'paused' if minute % 2 else 'stopped'}": 1.0,
                "resolves:bound": float(minute % 4),
                "resolve_seconds": 0.25 * (minute % 5),
                **({"backend_errors:timeout": 1.0} if minute % 13 == 0 else {}),
            },
        )
        for minute in range(0, 3 * 24 * 60, 3)
    )
    for window in activity_charts.WINDOWS:
        in_sql = activity_charts.build_charts(window, now)
        with monkeypatch.context() as patch:
            patch.setattr(activity_charts, "_fill_in_sql", activity_charts._fill)
            in_python = activity_charts.build_charts(window, now)
        assert in_sql.samples > 0, window
        assert in_sql.to_json() == in_python.to_json(), window
