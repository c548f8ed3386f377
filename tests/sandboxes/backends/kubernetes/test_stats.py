"""Quantities of the metrics API as the Kubernetes backend's stats read them (`stats.quantity`)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sandboxes.backends.base import ErrorKind, RemoteError
from sandboxes.backends.kubernetes.stats import quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [("250m", "0.25"), ("12Mi", str(12 * 1024**2)), ("3", "3"), ("1Pi", str(1024**5)), ("2E", "2e18"), ("1e3", "1000")],
)
def test_quantities_in_every_suffix_the_api_writes(text: str, value: str) -> None:
    assert quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", ["1.2.3", ".", "", "12Qi", "-", "1e"])
def test_a_malformed_quantity_is_an_error_in_words_not_a_crash(text: str) -> None:
    with pytest.raises(RemoteError) as caught:
        quantity(text)
    assert caught.value.kind == ErrorKind.INTERNAL
    assert "no quantity" in caught.value.message
