"""Periodic tasks, each registered beside its function.

    @periodic("reaper", task="sandboxes.reaper_pass", every=lambda: SESSIONS.reaper_interval_s)
    def start_reaper_pass() -> None: ...

registers the function under its name, makes it the Celery task `task`, and says how often it
runs (seconds; a callable is read when the schedule is built, so tuning applies). Celery beat's
schedule (console/celery.py) and the in-process scheduler (console/scheduler.py) are both
built from this registry. The registering modules are the ones each app's `tasks.py` imports
(`discover()` imports them), as Celery's own autodiscovery does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[[], Any])


@dataclass(frozen=True)
class Periodic:
    name: str
    function: Callable[[], Any]
    task: str  # the Celery task name
    every: Callable[[], float]

    def every_s(self) -> float:
        return float(self.every())


_REGISTRY: dict[str, Periodic] = {}


def periodic(name: str, *, task: str, every: float | Callable[[], float]) -> Callable[[F], F]:
    """Register the decorated function as periodic task `name` (Celery task `task`)."""

    def register(function: F) -> F:
        from celery import shared_task

        interval: Callable[[], float] = every if callable(every) else (lambda: float(every))
        existing = _REGISTRY.get(name)
        if existing is not None and existing.task != task:
            raise ValueError(f"periodic task {name!r} is registered twice")
        _REGISTRY[name] = Periodic(name=name, function=function, task=task, every=interval)
        shared_task(name=task, ignore_result=True)(function)
        return function

    return register


def discover() -> dict[str, Periodic]:
    """Every periodic task of the installed apps (their `tasks.py` import the registering modules)."""
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("tasks")
    return dict(_REGISTRY)


def beat_schedule() -> dict[str, dict[str, Any]]:
    """Celery beat's schedule: each task's Celery name and interval."""
    return {name: {"task": spec.task, "schedule": spec.every_s()} for name, spec in sorted(discover().items())}
