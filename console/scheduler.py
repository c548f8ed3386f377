"""Periodic tasks: Celery beat when REDIS_URL is set, a thread of the server otherwise.

Each task is registered beside its function (console/periodic.py); Celery beat's schedule is
built from that registry (console/celery.py), and `start_in_process_scheduler()` runs the same
functions on the embedded default (started by console/asgi.py, so management commands never
start it). Intervals are read again after each run, so a changed tuning value applies.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from .periodic import discover

logger = logging.getLogger(__name__)
_started = threading.Event()
_stop = threading.Event()


def _run_forever(stop: threading.Event) -> None:
    tasks = discover()
    next_run = {name: time.monotonic() + spec.every_s() for name, spec in tasks.items()}
    while not stop.wait(1.0):
        for name, spec in tasks.items():
            if stop.is_set():
                return
            if time.monotonic() < next_run[name]:
                continue
            next_run[name] = time.monotonic() + spec.every_s()
            try:
                spec.function()
            except Exception:
                logger.exception("periodic task %s failed", name)
            finally:
                close_old_connections()


def start_in_process_scheduler() -> threading.Event | None:
    """Start the scheduler thread once per process; returns its stop event."""
    if _started.is_set() or settings.JOB_RUNNER != "inprocess" or not settings.RUN_SCHEDULER:
        return None
    _started.set()
    threading.Thread(target=_run_forever, args=(_stop,), name="console-scheduler", daemon=True).start()
    return _stop


def stop_in_process_scheduler() -> None:
    """No periodic task starts after this (a shutdown); one under way runs on in its thread."""
    _stop.set()
