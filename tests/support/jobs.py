"""Running an admin job to its end from a test.

`start_job` dispatches after commit. Inside a test transaction that never happens, and the
test runs the job itself (`run_job`). In a `transaction=True` test it happens at once: the
in-process runner's thread and the test's `run_job` race for the job, and whichever loses
gets None while the other still runs it. `run_to_end` runs it here, or waits for the thread
that claimed it first, and returns the finished job either way.
"""

from __future__ import annotations

import threading

from console.jobs import run_job
from console.models import AdminJob, JobStatus

WAIT_S = 600


def run_to_end(job_id: str) -> AdminJob:
    finished = run_job(job_id)
    if finished is not None:
        return finished
    for thread in threading.enumerate():
        if thread.name == f"job-{job_id}":
            thread.join(timeout=WAIT_S)
    job = AdminJob.objects.get(pk=job_id)
    assert job.status not in (JobStatus.QUEUED, JobStatus.RUNNING), f"job {job_id} is still {job.status}"
    return job
