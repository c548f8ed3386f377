"""The console's processes and the work they own (`console.models.WorkerProcess`).

Exec slots, background commands and admin jobs name the process that owns them
(`owner_process`). Every process that owns work registers itself once: the entry points at
start (Daphne in `console/asgi.py`, the Celery worker in `console/celery.py`), any other
process (a management command, a shell) on first use through `this_process()`. A daemon
thread renews its heartbeat every third of processes.heartbeat_window_s, and writes the row
again if it was released meanwhile (a process frozen past the window). A forked child is a
process of its own: it registers on first use.

A process is dead when its heartbeat is older than the window, or when it ran on this host
and its pid is gone or names another process now (Linux: boot id and the pid's start time).
`release_dead_processes()` runs at each process's start and periodically (the periodic registry,
"process-release"); for each dead process, in one transaction:

- its queued and running jobs fail with "Interrupted by a restart" (here);
- `console.signals.process_released` is sent with the process id and those jobs, and the
  other apps release what is theirs: exec slots freed and their sessions' in-flight counts
  lowered, background commands marked lost (`sandboxes/sessions/`), a skill image generation
  that an interrupted job was building marked failed, so the previous generation stays in
  force and an install can start at once (`skills/images.py`);
- its row is deleted, so two processes releasing it at once release it once.

A process that shuts down releases itself the same way (`console/shutdown.py`).

Imports the console app only.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from . import metrics
from .models import AdminJob, JobStatus, WorkerProcess
from .periodic import periodic
from .signals import process_released
from .tuning import PROCESSES

logger = logging.getLogger(__name__)

HOST = socket.gethostname()
INTERRUPTED = "Interrupted by a restart"

_lock = threading.Lock()
# This process's identity and heartbeat, made once (state, not a cache).
_state: dict[str, Any] = {"id": None, "kind": "", "stop": None}


# --- This process -------------------------------------------------------------------------


def pid_identity(pid: int) -> str:
    """What tells this pid apart from a later process given the same number: the boot id and
    the process's start time in clock ticks since boot ("" where /proc does not say)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces and parentheses: count after the last ")".
    fields = stat.rsplit(")", 1)[1].split()
    return f"{boot}:{fields[19]}"  # field 22, starttime


def this_process(kind: str = "") -> uuid.UUID:
    """This process's id, registering it (and starting its heartbeat) on first use."""
    with _lock:
        if _state["id"] is None:
            _state["id"] = uuid.uuid4()
            _state["kind"] = (kind or Path(sys.argv[0] if sys.argv else "python").name)[:32]
            _write_row()
            stop = threading.Event()
            _state["stop"] = stop
            threading.Thread(target=_beat_forever, args=(stop,), name="console-heartbeat", daemon=True).start()
        return uuid.UUID(str(_state["id"]))


def registered_process() -> uuid.UUID | None:
    """This process's id if it registered, without registering it."""
    return _state["id"]


def _write_row() -> None:
    now = timezone.now()
    WorkerProcess.objects.update_or_create(
        pk=_state["id"],
        defaults={"heartbeat": now},
        create_defaults={
            "kind": _state["kind"],
            "host": HOST[:255],
            "pid": os.getpid(),
            "pid_identity": pid_identity(os.getpid()),
            "started": now,
            "heartbeat": now,
        },
    )


def beat() -> None:
    """Renew the heartbeat; a row that was released meanwhile is written again (its work was
    released: this process carries on with what it still holds, no longer counted)."""
    if _state["id"] is None:
        return
    if not WorkerProcess.objects.filter(pk=_state["id"]).update(heartbeat=timezone.now()):
        logger.warning("this process (%s:%s) had been taken for dead; registering it again", HOST, os.getpid())
        _write_row()


def _beat_forever(stop: threading.Event) -> None:
    every = max(1.0, float(PROCESSES.heartbeat_window_s) / 3)
    while not stop.wait(every):
        try:
            beat()
        except Exception as exc:  # the database away for a moment: the next beat tries again
            logger.warning("process heartbeat failed: %s", exc)
        finally:
            connection.close()


def stop_heartbeat() -> None:
    stop = _state["stop"]
    if stop is not None:
        stop.set()


def _forget_in_child() -> None:
    # A forked child shares neither the parent's identity nor its heartbeat thread.
    _state.update({"id": None, "kind": "", "stop": None})


os.register_at_fork(after_in_child=_forget_in_child)


# --- Dead processes and what they held ---------------------------------------------------


def is_dead(row: WorkerProcess, *, now: Any = None) -> bool:
    now = now or timezone.now()
    if row.heartbeat < now - timedelta(seconds=float(PROCESSES.heartbeat_window_s)):
        return True
    if row.host != HOST:
        return False
    if row.pid_identity:
        return pid_identity(row.pid) != row.pid_identity
    try:
        os.kill(row.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def dead_processes() -> list[WorkerProcess]:
    now = timezone.now()
    rows = WorkerProcess.objects.all()
    if _state["id"] is not None:
        rows = rows.exclude(pk=_state["id"])
    return [row for row in rows if is_dead(row, now=now)]


def release_process(process_id: uuid.UUID, *, where: str = "") -> list[str] | None:
    """Release what the process held (see the module docstring) and delete its row. Returns
    what was released, in words; None when another process released it first."""
    now = timezone.now()
    with transaction.atomic():
        row = WorkerProcess.objects.select_for_update().filter(pk=process_id).first()
        if row is None:
            return None
        where = where or f"{row.host}:{row.pid}"
        jobs = list(
            AdminJob.objects.select_for_update().filter(
                owner_process=process_id, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]
            )
        )
        for job in jobs:
            line = {
                "time": now.isoformat(timespec="seconds"),
                "message": f"{INTERRUPTED}: the console process running it ({where}) stopped before it finished.",
            }
            AdminJob.objects.filter(pk=job.pk, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).update(
                status=JobStatus.FAILED,
                error=f"{INTERRUPTED}: the console process running it ({where}) stopped; run it again.",
                finished=now,
                log=[*job.log, line],
            )
            metrics.JOBS_FINISHED.labels(kind=job.kind, status=str(JobStatus.FAILED)).inc()
        answers = process_released.send(sender=WorkerProcess, process_id=process_id, job_ids=[job.pk for job in jobs])
        WorkerProcess.objects.filter(pk=process_id).delete()
    released = [f"{len(jobs)} job(s) failed"] if jobs else []
    released += [str(answer) for _, answer in answers if answer]
    # A clean stop that held nothing is routine; anything released is worth a look.
    (logger.warning if released else logger.info)(
        "released the work of console process %s (%s): %s",
        where,
        row.kind or "process",
        "; ".join(released) or "it held nothing",
        extra={"process_id": str(process_id)},
    )
    return released


@periodic(
    "process-release", task="console.release_dead_processes", every=lambda: max(5.0, PROCESSES.heartbeat_window_s / 3)
)
def release_dead_processes() -> int:
    """Release every dead process's work (at start and periodically). Returns how many."""
    released = 0
    for row in dead_processes():
        if release_process(row.pk) is not None:
            released += 1
    return released


def release_this_process() -> None:
    """On a clean shutdown: what this process still holds is released now, not after the window."""
    process_id = _state["id"]
    stop_heartbeat()
    if process_id is not None:
        close_old_connections()
        release_process(process_id, where=f"{HOST}:{os.getpid()}, shutting down")


def start_up(kind: str) -> None:
    """At a server's or worker's start: register, and release what dead processes held, so a
    restart after a crash finds its space's exec slots and skill images free at once. Off
    where periodic work is off (RUN_SCHEDULER=false: the test suite runs it itself)."""
    if not settings.RUN_SCHEDULER:
        return
    try:
        this_process(kind)
        release_dead_processes()
    except Exception:
        logger.exception("releasing the work of dead console processes at start failed; the periodic pass retries")
    finally:
        close_old_connections()
