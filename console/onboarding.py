"""The dashboard's "getting started" path: steps that check themselves off from real state.

The console app cannot import the apps to its left (sandboxes, skills), so each app
registers its own steps (`@onboarding_step(order, reads=...)`) when it starts. A step has two
halves: `reads(user, spaces)` names what it needs from the database as scalar reads
(console.readings: `exists`, `first`, `Count` over indexed columns; never a backend), and the
decorated function turns their values into a `Step`. The dashboard reads every step's values
in the same single query as its own counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from .models import Space
from .readings import exists, read_together


@dataclass(frozen=True)
class Step:
    """One step: done or not, and where to go to do it (empty url: nothing to do yet)."""

    key: str
    title: str
    done: bool
    url: str = ""
    action: str = ""  # the link's words
    detail: str = ""  # what is missing, or what was done


Reads = Callable[[Any, QuerySet[Space]], dict[str, Any]]
StepFunction = Callable[[Any, dict[str, Any]], Step]


@dataclass(frozen=True)
class _Registered:
    order: int
    reads: Reads
    decide: StepFunction


_STEPS: list[_Registered] = []
ANY_SPACE = "onboarding_any_space"


def onboarding_step(order: int, *, reads: Reads) -> Callable[[StepFunction], StepFunction]:
    """Register a step; `order` places it on the path (10 config, 20 test, 30 skill, …).
    The function gets the user and the values of `reads`, by the names `reads` gave them."""

    def register(func: StepFunction) -> StepFunction:
        if func not in [step.decide for step in _STEPS]:
            _STEPS.append(_Registered(order, reads, func))
            _STEPS.sort(key=lambda step: step.order)
        return func

    return register


def _name(index: int, name: str) -> str:
    return f"onboarding_{index}_{name}"


def onboarding_reads(user: Any, spaces: QuerySet[Space]) -> dict[str, Any]:
    """Every step's reads, for `read_together`, over the spaces `user` administers."""
    reads: dict[str, Any] = {ANY_SPACE: exists(spaces)}
    for index, step in enumerate(_STEPS):
        reads.update({_name(index, name): read for name, read in step.reads(user, spaces).items()})
    return reads


def onboarding_steps(user: Any, values: dict[str, Any]) -> list[Step]:
    """The path from the values `onboarding_reads` asked for (empty when the user administers
    no space)."""
    if not values[ANY_SPACE]:
        return []
    steps = []
    for index, step in enumerate(_STEPS):
        prefix = _name(index, "")
        steps.append(step.decide(user, {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}))
    return steps


def getting_started(user: Any, spaces: QuerySet[Space]) -> list[Step]:
    """The path for `user` over the spaces they administer, in one query."""
    return onboarding_steps(user, read_together(user, onboarding_reads(user, spaces)))
