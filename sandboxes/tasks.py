"""Celery entry points of the sandboxes app (scheduled by beat when REDIS_URL is set)."""

from __future__ import annotations

from celery import shared_task

from .sessions.reaper import start_idle_sweep, start_reaper_pass
from .sessions.retention import start_retention_pass


@shared_task(name="sandboxes.reaper_pass", ignore_result=True)
def reaper_pass() -> None:
    start_reaper_pass()


@shared_task(name="sandboxes.idle_sweep", ignore_result=True)
def idle_sweep_task() -> None:
    start_idle_sweep()


@shared_task(name="sandboxes.retention_pass", ignore_result=True)
def retention_pass_task() -> None:
    start_retention_pass()
