"""The job runner end to end: in a thread of this process, and through a real Celery worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse

from console.jobs import JobContext, JobFailed, do_cancel_job, job_handler, run_job, start_job
from console.models import AdminJob, AuditEvent, JobStatus
from console.services import SYSTEM, Actor, ServiceError
from tests.conftest import REDIS_URL

from .conftest import World

REPO = Path(__file__).resolve().parents[2]


def wait_for_job(job_id: Any, timeout: float = 60) -> AdminJob:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = AdminJob.objects.get(pk=job_id)
        if job.is_finished:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish in {timeout}s: {AdminJob.objects.get(pk=job_id).status}")


@job_handler("tests.fails", label="Always fails")
def failing_job(ctx: JobContext) -> None:
    ctx.progress(40, "about to fail")
    raise JobFailed("step 2 (verify) failed: exit code 3")


@job_handler("tests.crashes", label="Crashes")
def crashing_job(ctx: JobContext) -> None:
    raise RuntimeError("boom")


@pytest.mark.django_db(transaction=True)
def test_in_process_runner_runs_a_real_job_end_to_end(world: World, settings: Any) -> None:
    settings.JOB_RUNNER = "inprocess"
    client = world.client_for("root")
    response = client.post(reverse("console:diagnostics_start"))
    job = AdminJob.objects.get()
    assert response["Location"] == job.get_absolute_url()
    job = wait_for_job(job.id)
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert job.progress == 100
    assert job.result["database"].endswith("answers")
    assert job.task_id.startswith("thread:")
    assert any("channel layer" in line["message"] for line in job.log)
    assert AuditEvent.objects.filter(action="job.start", target_id=str(job.id)).count() == 1
    # The finished job's status partial tells HTMX to stop polling (286).
    partial = client.get(job.get_absolute_url(), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-status")
    assert partial.status_code == 286
    assert "Succeeded" in partial.content.decode()


@pytest.mark.django_db
def test_running_job_page_polls_and_stops_when_finished(world: World) -> None:
    job = AdminJob.objects.create(kind="console.diagnostics", status=JobStatus.RUNNING, progress=30)
    client = world.client_for("root")
    page = client.get(job.get_absolute_url()).content.decode()
    assert 'hx-trigger="every 2s"' in page
    assert "30%" in page
    partial = client.get(job.get_absolute_url(), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-status")
    assert partial.status_code == 200
    AdminJob.objects.filter(pk=job.pk).update(status=JobStatus.SUCCEEDED, progress=100)
    final = client.get(job.get_absolute_url(), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-status")
    assert final.status_code == 286
    assert "every 2s" not in final.content.decode()


@pytest.mark.django_db
def test_failures_are_recorded_with_their_message() -> None:
    job = AdminJob.objects.create(kind="tests.fails")
    run_job(str(job.id))
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error == "step 2 (verify) failed: exit code 3"
    assert job.progress == 40
    crash = AdminJob.objects.create(kind="tests.crashes")
    run_job(str(crash.id))
    crash.refresh_from_db()
    assert crash.status == JobStatus.FAILED
    assert crash.error.startswith("RuntimeError: boom")


@pytest.mark.django_db
def test_a_job_runs_once_even_if_delivered_twice() -> None:
    job = AdminJob.objects.create(kind="console.diagnostics")
    assert run_job(str(job.id)) is not None
    assert run_job(str(job.id)) is None


@pytest.mark.django_db
def test_cancel(world: World) -> None:
    job = AdminJob.objects.create(kind="console.diagnostics", space=world.space_a)
    do_cancel_job(job, actor=Actor(user=world.alice))
    assert run_job(str(job.id)) is None
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.finished is not None
    with pytest.raises(ServiceError, match="already finished"):
        do_cancel_job(job, actor=SYSTEM)


@pytest.mark.django_db
def test_unknown_job_kind_is_refused() -> None:
    with pytest.raises(ServiceError, match="Unknown job kind"):
        start_job("nope", actor=SYSTEM)
    assert not AdminJob.objects.exists()


@pytest.fixture
def celery_worker_process(settings: Any) -> Iterator[str]:
    """A real `celery worker` subprocess on Redis, sharing this test's PostgreSQL database."""
    from console.celery import app

    queue = f"test-jobs-{uuid.uuid4().hex[:8]}"
    db = connection.settings_dict
    database_url = f"postgres://{db['USER'] or ''}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "console.settings.test",
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
    }
    old = (app.conf.broker_url, app.conf.task_default_queue)
    app.conf.update(broker_url=REDIS_URL, task_default_queue=queue)
    settings.JOB_RUNNER = "celery"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "console",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "--loglevel=INFO",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield queue
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=30)
        app.conf.update(broker_url=old[0], task_default_queue=old[1])
        print(output[-3000:])


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_celery_worker_runs_a_real_job_end_to_end(world: World, celery_worker_process: str) -> None:
    job = start_job("console.diagnostics", actor=Actor(user=world.root))
    job = wait_for_job(job.id, timeout=90)
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert not job.task_id.startswith("thread:")
    assert job.task_id
    assert job.result["redis"].startswith("answers")
    assert job.result["database"] == "postgresql answers"


PRIVATE_INDEX = "https://__token__:index-secret-42@pypi.test/simple"


@job_handler("tests.quotes_a_secret", label="Quotes a secret")
def secret_quoting_job(ctx: JobContext) -> None:
    ctx.log(f"pip install from {PRIVATE_INDEX} with ?token=sck_line-secret-77")
    raise JobFailed(f"pip install for demo failed from the pip index {PRIVATE_INDEX}: no matching distribution")


@job_handler("tests.crashes_quoting_a_secret", label="Crashes quoting a secret")
def secret_crashing_job(ctx: JobContext) -> None:
    raise RuntimeError("could not reach redis://:redis-secret-9@127.0.0.1:6390/0 password=pw-secret-3")


@pytest.mark.django_db
def test_a_jobs_log_and_error_blank_the_secrets_a_step_quoted(world: World) -> None:
    """The job page is read by the space's admins: a platform secret a step quoted (a private
    package index's password, a token in a URL, a password in a crash) never shows on it."""
    secrets = ("index-secret-42", "sck_line-secret-77", "redis-secret-9", "pw-secret-3")
    for kind in ("tests.quotes_a_secret", "tests.crashes_quoting_a_secret"):
        job = AdminJob.objects.create(kind=kind, space=world.space_a)
        run_job(str(job.id))
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED
        page = world.client_for("alice").get(job.get_absolute_url()).content.decode()
        stored = job.error + "\n".join(line["message"] for line in job.log)
        for secret in secrets:
            assert secret not in stored, (kind, stored)
            assert secret not in page
        assert "[redacted]" in job.error
