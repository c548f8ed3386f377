"""Celery entry points of the console app: thin wrappers over services and the job runner."""

from __future__ import annotations

from celery import shared_task

from .activity import start_activity_sample
from .jobs import RUN_ADMIN_JOB_TASK, run_job


@shared_task(name=RUN_ADMIN_JOB_TASK, ignore_result=True)
def run_admin_job(job_id: str) -> None:
    """Run one admin job; the compare-and-set claim in run_job makes redelivery harmless."""
    run_job(job_id)


@shared_task(name="console.activity_sample", ignore_result=True)
def activity_sample_task() -> None:
    start_activity_sample()
