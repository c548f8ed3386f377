"""Celery entry points of the sandboxes app.

The periodic ones are registered beside their functions (`@periodic`, console/periodic.py);
importing their modules here is what registers them (Celery autodiscovers this module)."""

from __future__ import annotations

from celery import shared_task

from .network import log  # noqa: F401  (periodic: egress-ingest, egress-housekeeping)
from .network.live import apply_space_policy  # (periodic: network-catch-up)
from .pools import keeper  # noqa: F401  (periodic: pool-refill; the task sandboxes.pool_refill_config)
from .sessions import reaper, retention  # noqa: F401  (periodic: reaper, idle-sweep, retention)
from .terminal import sweep  # noqa: F401  (periodic: terminal-sweep)


@shared_task(name="sandboxes.apply_network_policy", ignore_result=True)
def apply_network_policy_task(space_id: str, session_id: str = "") -> None:
    from console.models import Space

    from .models import Session

    space = Space.objects.filter(pk=space_id).first()
    if space is None:
        return
    sessions = list(Session.objects.filter(pk=session_id, space=space)) if session_id else None
    apply_space_policy(space, sessions=sessions)
