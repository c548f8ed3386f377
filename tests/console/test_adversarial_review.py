"""Adversarial review (rev1): /metrics with a bearer that is not ASCII."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client


@pytest.mark.django_db
def test_a_non_ascii_bearer_on_metrics_is_refused_not_a_500(settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-token-0123456789"
    settings.METRICS_ALLOWED_NETWORKS = []
    settings.METRICS_ALLOW_LOOPBACK = False
    client = Client(raise_request_exception=False)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer sécret")
    assert response.status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-0123456789").status_code == 200
