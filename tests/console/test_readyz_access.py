"""/readyz: ok or failing for anyone; which parts, and how they fail, for an allowed scraper.

It used to list every backend by kind and id prefix, with its error kind, to anyone who could
reach the console.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from console import health
from tests.factories import make_backend, make_space
from tests.support.tuning import Tuned

TOKEN = "readyz-token-5c1d2e3f4a"


@pytest.fixture(autouse=True)
def _scraper(tuned: Tuned, settings: Any) -> Iterator[None]:
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_NETWORKS = []
    settings.METRICS_ALLOW_LOOPBACK = False
    tuned({"readyz.cache_s": 0})
    health.forget_readiness()
    yield
    health.forget_readiness()


@pytest.fixture
def failing_part() -> Iterator[None]:
    def refuses() -> None:
        raise ConnectionRefusedError("backend at 10.9.8.7 refused")

    health.register_checks("test-failing", lambda: [("backend:e2b:deadbeef", refuses, True)])
    try:
        yield
    finally:
        health._sources.pop("test-failing", None)


@pytest.mark.django_db(transaction=True)
def test_without_credentials_readyz_says_only_ok() -> None:
    backend = make_backend(make_space("Quiet tenant", slug="quiet"))
    for authorization in ("", "Bearer wrong-token", "Basic cm9vdDpyb290"):
        answer = Client().get("/readyz", headers={"Authorization": authorization} if authorization else {})
        assert answer.status_code == 200, answer.content
        assert answer.json() == {"status": "ok"}
        assert str(backend.id)[:8].encode() not in answer.content
        assert b"docker" not in answer.content


@pytest.mark.django_db(transaction=True)
def test_without_credentials_a_failure_is_only_failing(failing_part: None) -> None:
    answer = Client().get("/readyz")
    assert answer.status_code == 503
    assert answer.json() == {"status": "failing"}
    assert answer["Cache-Control"] == "no-store"


@pytest.mark.django_db(transaction=True)
def test_the_metrics_token_gets_the_details(failing_part: None) -> None:
    backend = make_backend(make_space())
    answer = Client().get("/readyz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 503
    body = answer.json()
    assert body["status"] == "failing"
    assert body["failing"] == ["backend:e2b:deadbeef"]
    assert body["checks"]["backend:e2b:deadbeef"]["error"] == "ConnectionRefusedError"
    assert body["checks"][f"backend:docker:{str(backend.id)[:8]}"]["ok"] is True
    assert body["checks"]["database"]["ok"] is True
    assert b"10.9.8.7" not in answer.content  # never a message, even to the scraper


@pytest.mark.django_db(transaction=True)
def test_an_allowed_network_gets_the_details_too(settings: Any) -> None:
    settings.METRICS_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    body = Client().get("/readyz", REMOTE_ADDR="127.0.0.1").json()
    assert set(body) == {"status", "failing", "checks"}
    assert Client().get("/readyz", REMOTE_ADDR="192.0.2.10").json() == {"status": "ok"}
