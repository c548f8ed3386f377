"""Adversarial review (rev1): /metrics with a bearer that is not ASCII."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.support.tuning import Tuned


@pytest.mark.django_db
def test_a_non_ascii_bearer_on_metrics_is_refused_not_a_500(settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-token-0123456789"
    settings.METRICS_ALLOWED_NETWORKS = []
    settings.METRICS_ALLOW_LOOPBACK = False
    client = Client(raise_request_exception=False)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer sécret")
    assert response.status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-0123456789").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_backend_that_hangs_does_not_take_the_other_checks_down_with_it(tuned: Tuned) -> None:
    """Each readiness run leaves the hung check's thread behind; once the pool is full of
    them, the database check itself never runs and /readyz reports it failing."""
    import threading

    from console import health

    release = threading.Event()

    def hangs() -> None:
        release.wait(60)

    tuned({"readyz.timeout_s": 0.2})
    tuned({"readyz.cache_s": 0})
    health.register_checks("rev1-hung", lambda: [("backend:hung", hangs, True)])
    try:
        for _ in range(health._pool._max_workers + 2):
            health.forget_readiness()
            results = {r.name: r for r in health.readiness()}
        assert "database" in results, results  # else: the console's own source never got a thread
        assert results["database"].ok, results["database"]
    finally:
        release.set()
        health._sources.pop("rev1-hung", None)
        health.forget_readiness()
