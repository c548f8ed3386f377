"""The generic admin-job runner.

A job is an `AdminJob` row plus a registered handler. `start_job` writes the row (audited)
and dispatches it after commit: to a Celery worker when JOB_RUNNER is "celery" (REDIS_URL
set), otherwise to a thread of this process. Either way `run_job` executes it, claiming the
row with a compare-and-set so a redelivered message never runs a job twice, and naming the
process that runs it (`owner_process`): if that process dies, the job fails "Interrupted by
a restart" (console/processes.py). Handlers report progress and log lines through a
`JobContext`; the job page polls the row.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction
from django.utils import timezone

from . import metrics
from .logs import HOUSEKEEPING_JOB_KINDS, get_request_id, new_request_id, redact, request_id
from .models import AdminJob, AuditAction, JobStatus, Space
from .processes import this_process
from .services import Actor, ServiceError, record_audit
from .tuning import JOBS

logger = logging.getLogger(__name__)

MAX_LOG_LINES = 2000


class JobCancelled(Exception):
    """Raised inside a handler when an admin cancelled the running job."""


class JobFailed(Exception):
    """A handler's clean failure: the message is shown on the job page as is, and `result`
    (what was done before the failure, if the handler says) is kept as the job's result."""

    def __init__(self, message: str, *, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


class JobContext:
    """What a handler sees of its job: params, progress, log, cancellation."""

    def __init__(self, job: AdminJob) -> None:
        self.job = job
        self.params: dict[str, Any] = dict(job.params)
        self._log: list[dict[str, str]] = list(job.log)

    def log(self, message: str) -> None:
        # A job's log and error are shown to the space's admins: a secret a step quoted (a
        # package index URL with its password, a token in a URL) is blanked as in log lines.
        message = redact(message)
        self._log.append({"time": timezone.now().isoformat(timespec="seconds"), "message": message})
        if len(self._log) > MAX_LOG_LINES:
            self._log = [*self._log[:10], {"time": "", "message": "… earlier lines dropped …"}, *self._log[-1500:]]
        AdminJob.objects.filter(pk=self.job.pk).update(log=self._log)

    def progress(self, percent: int, message: str | None = None) -> None:
        percent = max(0, min(100, int(percent)))
        AdminJob.objects.filter(pk=self.job.pk).update(progress=percent)
        if message:
            self.log(message)
        self.check_cancelled()

    def check_cancelled(self) -> None:
        status = AdminJob.objects.filter(pk=self.job.pk).values_list("status", flat=True).first()
        if status == JobStatus.CANCELLED:
            raise JobCancelled()


JobHandler = Callable[[JobContext], dict[str, Any] | None]
_HANDLERS: dict[str, tuple[JobHandler, str]] = {}
_HOUSEKEEPING = HOUSEKEEPING_JOB_KINDS  # one registry, read by the logging too (console.logs)


def job_handler(kind: str, *, label: str, housekeeping: bool = False) -> Callable[[JobHandler], JobHandler]:
    """Register a handler for a job kind (apps register theirs when imported).

    Housekeeping kinds (periodic passes such as the reaper) run every minute: they are pruned
    after jobs.housekeeping_retention_s and left out of the default job lists.
    """

    def register(func: JobHandler) -> JobHandler:
        _HANDLERS[kind] = (func, label)
        if housekeeping:
            _HOUSEKEEPING.add(kind)
        return func

    return register


def job_kinds() -> list[tuple[str, str]]:
    """Every registered (kind, label), by label: the Jobs list's kind filter."""
    return sorted(((kind, label) for kind, (_, label) in _HANDLERS.items()), key=lambda item: item[1].lower())


def housekeeping_kinds() -> frozenset[str]:
    return frozenset(_HOUSEKEEPING)


def prune_housekeeping_jobs(kind: str) -> int:
    """Delete finished jobs of a housekeeping kind older than the retention (failed ones too)."""
    from datetime import timedelta

    from .models import FINISHED_JOB_STATUSES

    cutoff = timezone.now() - timedelta(seconds=JOBS.housekeeping_retention_s)
    deleted, _ = AdminJob.objects.filter(kind=kind, status__in=FINISHED_JOB_STATUSES, created__lt=cutoff).delete()
    return deleted


def job_label(kind: str) -> str:
    entry = _HANDLERS.get(kind)
    return entry[1] if entry else kind


def start_job(kind: str, *, actor: Actor, space: Space | None = None, params: dict[str, Any] | None = None) -> AdminJob:
    """Create the job row (audited) and run it after the transaction commits."""
    if kind not in _HANDLERS:
        raise ServiceError(f"Unknown job kind {kind!r}.")
    with transaction.atomic():
        job = AdminJob.objects.create(kind=kind, space=space, created_by=actor.user, params=params or {})
        record_audit(
            actor,
            AuditAction.JOB_START,
            space=space,
            target_type="job",
            target_id=job.id,
            target_name=job.kind,
            details={"kind": kind, "params": params or {}},
        )
        transaction.on_commit(lambda: dispatch(job))
    return job


# The Celery task that runs a job (registered in console.tasks).
RUN_ADMIN_JOB_TASK = "console.run_admin_job"


def dispatch(job: AdminJob) -> None:
    if settings.JOB_RUNNER == "celery":
        from .celery import app

        # By name, so the job runner does not import its own Celery wrapper (console.tasks).
        # The request id travels in a message header (console/celery.py).
        result = app.send_task(RUN_ADMIN_JOB_TASK, args=[str(job.id)])
        AdminJob.objects.filter(pk=job.pk).update(task_id=result.id)
    else:
        rid = get_request_id() or new_request_id()
        thread = threading.Thread(target=_run_in_thread, args=(str(job.id), rid), name=f"job-{job.id}", daemon=True)
        # Queued in this process's memory: if the process dies first, the job fails with it.
        AdminJob.objects.filter(pk=job.pk).update(task_id=f"thread:{thread.name}", owner_process=this_process())
        thread.start()
    logger.info("job %s (%s) queued", job.id, job.kind, extra={"job_id": str(job.id), "job_kind": job.kind})


def _run_in_thread(job_id: str, rid: str) -> None:
    try:
        with request_id(rid):
            run_job(job_id)
    finally:
        close_old_connections()
        from django.db import connection

        connection.close()


def run_job(job_id: str) -> AdminJob | None:
    """Execute a queued job once. Returns None when another runner already claimed it."""
    claimed = AdminJob.objects.filter(pk=job_id, status=JobStatus.QUEUED).update(
        status=JobStatus.RUNNING, started=timezone.now(), owner_process=this_process()
    )
    if not claimed:
        return None
    job = AdminJob.objects.get(pk=job_id)
    handler, _ = _HANDLERS[job.kind]
    context = JobContext(job)
    logger.info("job %s (%s) started", job.id, job.kind, extra={"job_id": str(job.id), "job_kind": job.kind})
    try:
        result = handler(context) or {}
    except JobCancelled:
        context.log("Cancelled.")
        _finish(job, JobStatus.CANCELLED, error="Cancelled by an admin.")
    except JobFailed as exc:
        context.log(f"Failed: {exc}")
        _finish(job, JobStatus.FAILED, error=redact(str(exc)), result=exc.result)
    except Exception as exc:
        logger.exception("job %s (%s) crashed", job.id, job.kind)
        context.log(f"Failed: {exc.__class__.__name__}: {exc}")
        _finish(
            job,
            JobStatus.FAILED,
            error=redact(f"{exc.__class__.__name__}: {exc}\n{traceback.format_exc(limit=5)}"),
        )
    else:
        _finish(job, JobStatus.SUCCEEDED, result=result, progress=100)
    job.refresh_from_db()
    return job


def _finish(
    job: AdminJob,
    status: JobStatus,
    *,
    error: str = "",
    result: dict[str, Any] | None = None,
    progress: int | None = None,
) -> None:
    updates: dict[str, Any] = {"finished": timezone.now(), "error": error, "result": result or {}}
    if progress is not None:
        updates["progress"] = progress
    # A cancelled job stays cancelled even if its handler finished meanwhile.
    if not AdminJob.objects.filter(pk=job.pk).exclude(status=JobStatus.CANCELLED).update(status=status, **updates):
        status = JobStatus.CANCELLED
    AdminJob.objects.filter(pk=job.pk, status=JobStatus.CANCELLED, finished__isnull=True).update(
        finished=updates["finished"]
    )
    metrics.JOBS_FINISHED.labels(kind=job.kind, status=str(status)).inc()
    duration = (updates["finished"] - job.started).total_seconds() if job.started else None
    logger.info(
        "job %s (%s) %s",
        job.id,
        job.kind,
        status,
        extra={"job_id": str(job.id), "job_kind": job.kind, "status": str(status), "duration_s": duration},
    )


def do_cancel_job(job: AdminJob, *, actor: Actor) -> AdminJob:
    """Cancel a queued or running job; a running handler stops at its next checkpoint."""
    with transaction.atomic():
        updated = AdminJob.objects.filter(pk=job.pk, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).update(
            status=JobStatus.CANCELLED
        )
        if not updated:
            raise ServiceError("This job has already finished.")
        AdminJob.objects.filter(pk=job.pk, started__isnull=True).update(finished=timezone.now())
        record_audit(
            actor,
            AuditAction.JOB_CANCEL,
            space=job.space,
            target_type="job",
            target_id=job.id,
            target_name=job.kind,
            details={"kind": job.kind},
        )
    job.refresh_from_db()
    return job


def active_job_counts() -> list[tuple[dict[str, str], float]]:
    """Queued and running jobs by kind and status (console.metrics reads it at scrape)."""
    from django.db.models import Count

    rows = (
        AdminJob.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
        .values("kind", "status")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return [({"kind": row["kind"], "status": row["status"]}, float(row["n"])) for row in rows]
