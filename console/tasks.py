"""Celery entry points of the console app: thin wrappers over services and the job runner."""

from __future__ import annotations

from celery import shared_task

from .activity import start_activity_sample
from .jobs import RUN_ADMIN_JOB_TASK, run_job
from .processes import release_dead_processes


@shared_task(name=RUN_ADMIN_JOB_TASK, ignore_result=True)
def run_admin_job(job_id: str) -> None:
    """Run one admin job; the compare-and-set claim in run_job makes redelivery harmless."""
    run_job(job_id)


@shared_task(name="console.activity_sample", ignore_result=True)
def activity_sample_task() -> None:
    start_activity_sample()


@shared_task(name="console.release_dead_processes", ignore_result=True)
def release_dead_processes_task() -> None:
    release_dead_processes()
