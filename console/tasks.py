"""Celery entry points of the console app: thin wrappers over services and the job runner.

The periodic ones are registered beside their functions (`@periodic`, console/periodic.py);
importing their modules here is what registers them (Celery autodiscovers this module)."""

from __future__ import annotations

from celery import shared_task

from . import activity, processes  # noqa: F401  (periodic: activity-sample, process-release)
from .jobs import RUN_ADMIN_JOB_TASK, run_job


@shared_task(name=RUN_ADMIN_JOB_TASK, ignore_result=True)
def run_admin_job(job_id: str) -> None:
    """Run one admin job; the compare-and-set claim in run_job makes redelivery harmless."""
    run_job(job_id)
