"""Celery entry points of the sandboxes app (scheduled by beat when REDIS_URL is set)."""

from __future__ import annotations

from celery import shared_task

from .network.live import apply_space_policy
from .network.log import egress_housekeeping, ingest_refusals
from .sessions.reaper import start_idle_sweep, start_reaper_pass
from .sessions.retention import start_retention_pass
from .terminal.sweep import close_abandoned


@shared_task(name="sandboxes.reaper_pass", ignore_result=True)
def reaper_pass() -> None:
    start_reaper_pass()


@shared_task(name="sandboxes.idle_sweep", ignore_result=True)
def idle_sweep_task() -> None:
    start_idle_sweep()


@shared_task(name="sandboxes.apply_network_policy", ignore_result=True)
def apply_network_policy_task(space_id: str, session_id: str = "") -> None:
    from console.models import Space

    from .models import Session

    space = Space.objects.filter(pk=space_id).first()
    if space is None:
        return
    sessions = list(Session.objects.filter(pk=session_id, space=space)) if session_id else None
    apply_space_policy(space, sessions=sessions)


@shared_task(name="sandboxes.egress_ingest", ignore_result=True)
def egress_ingest_task() -> None:
    ingest_refusals()


@shared_task(name="sandboxes.egress_housekeeping", ignore_result=True)
def egress_housekeeping_task() -> None:
    egress_housekeeping()


@shared_task(name="sandboxes.retention_pass", ignore_result=True)
def retention_pass_task() -> None:
    start_retention_pass()


@shared_task(name="sandboxes.terminal_sweep", ignore_result=True)
def terminal_sweep_task() -> None:
    close_abandoned()
