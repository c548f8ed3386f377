"""Pools' tests refill when they say so: no background refill after a claim (one test turns
it back on to see it)."""

from __future__ import annotations

import pytest

from tests.support.tuning import Tuned


@pytest.fixture(autouse=True)
def refill_when_told(tuned: Tuned) -> None:
    tuned({"pools.refill_on_change": False})
