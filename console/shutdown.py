"""A bounded shutdown, the Django side (the server side is `console/serve.py`).

On SIGTERM (or Ctrl-C) the server calls `begin()` at once: no periodic task starts any more
(the in-process scheduler stops; one under way runs on in its thread). It then closes its
port and gives the requests in flight up to processes.shutdown_grace_s to finish; those still running
then are cut, answered 503 "shutting_down" where no answer had started. Last, `finish()`
releases what this process still holds, as a crash's would be released by the next start,
but at once: its exec slots freed, its background commands marked lost, its jobs failed
"Interrupted by a restart" (console/processes.py). The process then exits without waiting
for the threads of cut requests (the server's `os._exit`).

Imports the console app only.
"""

from __future__ import annotations

import json
import logging

from django.db import close_old_connections

from .processes import release_this_process
from .scheduler import stop_in_process_scheduler
from .tuning import PROCESSES

logger = logging.getLogger(__name__)

SHUTTING_DOWN_BODY = json.dumps(
    {
        "error": {
            "code": "shutting_down",
            "message": "The console was stopped while this request ran; it was cut. Retry it.",
        }
    }
).encode()


def grace_s() -> float:
    return max(0.0, float(PROCESSES.shutdown_grace_s))


def begin(in_flight: int) -> None:
    stop_in_process_scheduler()
    logger.info(
        "shutting down: periodic tasks stopped; %d request(s) in flight get up to %g s to finish",
        in_flight,
        grace_s(),
    )


def cut(count: int) -> None:
    if count:
        logger.warning("shutting down: %d request(s) still running after %g s were cut", count, grace_s())


def finish() -> None:
    """What this process still holds, released now (not after the heartbeat window)."""
    try:
        release_this_process()
    except Exception:
        logger.exception("shutting down: releasing this process's work failed; the next start releases it")
    finally:
        close_old_connections()
