"""The dashboard's "getting started" path: steps that check themselves off from real state.

The console app cannot import the apps to its left (sandboxes, skills), so each app
registers its own steps (`@onboarding_step(order)`) when it starts; a step reads the
database (configs, connection tests, skill images, sessions, terminals) and never a backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from .models import Space


@dataclass(frozen=True)
class Step:
    """One step: done or not, and where to go to do it (empty url: nothing to do yet)."""

    key: str
    title: str
    done: bool
    url: str = ""
    action: str = ""  # the link's words
    detail: str = ""  # what is missing, or what was done


StepFunction = Callable[[Any, QuerySet[Space]], Step]
_STEPS: list[tuple[int, StepFunction]] = []


def onboarding_step(order: int) -> Callable[[StepFunction], StepFunction]:
    """Register a step; `order` places it on the path (10 config, 20 test, 30 skill, …)."""

    def register(func: StepFunction) -> StepFunction:
        if func not in [f for _, f in _STEPS]:
            _STEPS.append((order, func))
            _STEPS.sort(key=lambda item: item[0])
        return func

    return register


def getting_started(user: Any, spaces: QuerySet[Space]) -> list[Step]:
    """The path for `user` over the spaces they administer (empty when they administer none)."""
    if not spaces.exists():
        return []
    return [func(user, spaces) for _, func in _STEPS]
