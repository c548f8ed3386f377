"""Retention: the periodic pass deletes exactly the records past their setting, never live ones."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.utils import timezone

from console.jobs import housekeeping_kinds, run_job, start_job
from console.models import AdminJob, AuditAction, AuditEvent, JobStatus
from console.services import SYSTEM, record_audit
from sandboxes.models import Artifact, BackgroundCommand, CommandStatus, Session, Terminal
from sandboxes.sessions.retention import KIND, apply_retention
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db

DAYS = {"audit_events": 10, "jobs": 10, "terminals": 10, "commands": 10, "artifacts": 10}


@pytest.fixture
def retention(settings: Any, tmp_path: Any) -> Any:
    settings.RETENTION_DAYS = dict(DAYS)
    settings.RETENTION_BATCH = 2  # several batches per kind
    settings.MEDIA_ROOT = tmp_path
    return settings


def _age(model: Any, pk: Any, days: float, *fields: str) -> None:
    when = timezone.now() - timedelta(days=days)
    model.objects.filter(pk=pk).update(**dict.fromkeys(fields, when))


def _session(world: World) -> Session:
    return Session.objects.create(
        space=world.space_a, key=f"k-{uuid.uuid4().hex[:6]}", config=make_config(world.space_a)
    )


def test_each_kind_loses_exactly_its_old_finished_rows(world: World, retention: Any) -> None:
    session = _session(world)
    audit = [record_audit(SYSTEM, AuditAction.SPACE_UPDATE, target_type="t") for _ in range(5)]
    for event in audit[:3]:
        _age(AuditEvent, event.pk, 11, "time")
    jobs = [AdminJob.objects.create(kind="skills.install", status=JobStatus.SUCCEEDED) for _ in range(3)]
    _age(AdminJob, jobs[0].pk, 11, "created", "finished")
    _age(AdminJob, jobs[1].pk, 9, "created", "finished")
    running = AdminJob.objects.create(kind="skills.install", status=JobStatus.RUNNING)
    _age(AdminJob, running.pk, 50, "created")
    terminals = [Terminal.objects.create(session=session, user=world.alice) for _ in range(3)]
    _age(Terminal, terminals[0].pk, 12, "created", "closed")
    _age(Terminal, terminals[1].pk, 12, "created")  # still open: kept whatever its age
    commands = [BackgroundCommand.objects.create(session=session, shell="true") for _ in range(3)]
    BackgroundCommand.objects.filter(pk=commands[0].pk).update(status=CommandStatus.EXITED)
    _age(BackgroundCommand, commands[0].pk, 11, "started", "finished")
    _age(BackgroundCommand, commands[1].pk, 11, "started")  # running
    old_art, new_art = (
        Artifact.objects.create(
            session=session,
            collection=uuid.uuid4(),
            path=f"out/{n}.txt",
            size=1,
            sha256="0" * 64,
            file=ContentFile(b"x", name=f"{n}.txt"),
        )
        for n in ("old", "new")
    )
    _age(Artifact, old_art.pk, 11, "created")
    old_file = old_art.file.path

    deleted = apply_retention()

    assert deleted == {"audit_events": 3, "jobs": 1, "terminals": 1, "commands": 1, "artifacts": 1}
    assert set(AuditEvent.objects.filter(action=AuditAction.SPACE_UPDATE).values_list("pk", flat=True)) == {
        audit[3].pk,
        audit[4].pk,
    }
    assert set(AdminJob.objects.values_list("pk", flat=True)) >= {jobs[1].pk, jobs[2].pk, running.pk}
    assert not AdminJob.objects.filter(pk=jobs[0].pk).exists()
    assert set(Terminal.objects.values_list("pk", flat=True)) == {terminals[1].pk, terminals[2].pk}
    assert set(BackgroundCommand.objects.values_list("pk", flat=True)) == {commands[1].pk, commands[2].pk}
    assert list(Artifact.objects.values_list("pk", flat=True)) == [new_art.pk]
    assert not os.path.exists(old_file)
    assert os.path.exists(new_art.file.path)
    prune = AuditEvent.objects.get(action="retention.prune")
    assert prune.details["deleted"]["audit_events"] == 3


def test_zero_days_keeps_forever_and_a_second_pass_deletes_nothing(world: World, retention: Any) -> None:
    retention.RETENTION_DAYS = {**DAYS, "audit_events": 0}
    event = record_audit(SYSTEM, AuditAction.SPACE_UPDATE, target_type="t")
    _age(AuditEvent, event.pk, 5000, "time")
    first = apply_retention()
    assert "audit_events" not in first
    assert AuditEvent.objects.filter(pk=event.pk).exists()
    assert not any(apply_retention().values())
    assert not AuditEvent.objects.filter(action="retention.prune").exists()


def test_the_pass_runs_as_a_housekeeping_job(world: World, retention: Any) -> None:
    event = record_audit(SYSTEM, AuditAction.SPACE_UPDATE, target_type="t")
    _age(AuditEvent, event.pk, 11, "time")
    job = start_job(KIND, actor=SYSTEM)  # the test's transaction never commits: run it here
    assert run_job(str(job.pk)) is not None
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert job.result["deleted"]["audit_events"] >= 1
    assert not AuditEvent.objects.filter(pk=event.pk).exists()
    assert KIND in housekeeping_kinds()
