"""Retention: the periodic pass deletes exactly the records past their setting, never live ones."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from console.jobs import housekeeping_kinds, run_job, start_job
from console.models import AdminJob, AuditAction, AuditEvent, JobStatus
from console.services import SYSTEM, record_audit
from sandboxes.backends.base import ExecRequest
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import (
    Artifact,
    BackgroundCommand,
    CommandStatus,
    SandboxConfig,
    Session,
    Terminal,
)
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.retention import KIND, apply_retention
from sandboxes.sessions.runtime import Runtime
from sandboxes.terminal import keeper, sweep
from sandboxes.terminal import shells as terminal_shells
from sandboxes.terminal import tickets as terminals
from tests.factories import make_config
from tests.personas import World
from tests.support import terminal_support
from tests.support.tuning import Tuned

pytestmark = pytest.mark.django_db

DAYS = {"audit_events": 10, "jobs": 10, "terminals": 10, "commands": 10, "artifacts": 10}


@pytest.fixture
def retention(tuned: Tuned, settings: Any, tmp_path: Any) -> Any:
    tuned({f"retention.{kind}_days": days for kind, days in DAYS.items()})
    tuned({"retention.egress_events_days": 0, "retention.activity_samples_days": 0})  # kept: not these tests'
    tuned({"retention.batch": 2})  # several batches per kind
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


def test_zero_days_keeps_forever_and_a_second_pass_deletes_nothing(world: World, retention: Any, tuned: Tuned) -> None:
    tuned({"retention.audit_events_days": 0})
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


# A terminal still open: the sweep finds the sandbox of an abandoned terminal through its row
# (Terminal.sandbox_id), since the audit retention prunes audit rows by age alone; the retention
# keeps a terminal.open row with its close, never before it.


@pytest.mark.django_db
def test_retention_keeps_the_open_audit_of_a_terminal_still_open(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"retention.audit_events_days": 1})
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "long-open")
    terminal = terminals.create_terminal(world.bob, session)
    tid = str(terminal.pk)
    grant = terminals.Grant(tid, str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminal_shells.record_open(grant, world.bob, None, "sandbox-of-the-shell")
    AuditEvent.objects.filter(action="terminal.open", target_id=tid).update(time=timezone.now() - timedelta(days=2))
    apply_retention()
    terminal.refresh_from_db()
    assert terminal.closed is None  # still open: live, never touched ...
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1  # ... its open neither


def _open_with_a_shell(world: World, key: str, sandbox_id: str) -> tuple[Terminal, terminals.Grant]:
    if not SandboxConfig.objects.filter(space=world.space_a, is_default=True).exists():
        make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, key)
    terminal = terminals.create_terminal(world.bob, session)
    grant = terminals.Grant(str(terminal.pk), str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminal_shells.record_open(grant, world.bob, None, sandbox_id)
    return terminal, grant


def _age_audit(terminal: Terminal, days: int, *actions: str) -> None:
    AuditEvent.objects.filter(action__in=actions, target_id=str(terminal.pk)).update(
        time=timezone.now() - timedelta(days=days)
    )


@pytest.mark.django_db
def test_an_open_is_pruned_with_its_close_never_before_it(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"retention.audit_events_days": 1, "retention.terminals_days": 0})
    terminal, grant = _open_with_a_shell(world, "closed-late", "sandbox-a")
    _age_audit(terminal, 3, "terminal.open")
    terminal_shells.record_close(grant, world.bob, None, "closed by the client", {"bytes_in": 0, "bytes_out": 0})
    tid = str(terminal.pk)
    apply_retention()  # the close is recent: the open stays with it
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1
    assert AuditEvent.objects.filter(action="terminal.close", target_id=tid).count() == 1
    tuned({"retention.terminals_days": 1})
    Terminal.objects.filter(pk=terminal.pk).update(closed=timezone.now() - timedelta(days=2))
    apply_retention()  # the closed row is pruned, but its close audit is recent: the open stays
    assert not Terminal.objects.filter(pk=terminal.pk).exists()
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1
    _age_audit(terminal, 2, "terminal.close")
    apply_retention()  # both past the setting: both go
    assert not AuditEvent.objects.filter(target_type="terminal", target_id=tid).exists()


@pytest.mark.django_db
def test_other_old_audit_rows_still_go(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"retention.audit_events_days": 1})
    terminal, _ = _open_with_a_shell(world, "kept-open", "sandbox-b")
    record_audit(SYSTEM, AuditAction.SANDBOX_CONFIG_UPDATE, target_type="sandbox_config", target_id=str(terminal.pk))
    record_audit(SYSTEM, AuditAction.TERMINAL_OPEN, target_type="terminal", target_id="not-a-terminal-id")
    AuditEvent.objects.update(time=timezone.now() - timedelta(days=2))
    apply_retention()
    assert list(AuditEvent.objects.exclude(action="retention.prune").values_list("action", "target_id")) == [
        ("terminal.open", str(terminal.pk))
    ]


@pytest.mark.django_db
def test_the_row_carries_the_sandbox_of_its_last_shell(world: World) -> None:
    terminal, grant = _open_with_a_shell(world, "carries", "sandbox-first")
    terminal.refresh_from_db()
    assert terminal.sandbox_id == "sandbox-first"
    # A shell that replaced a lost one in a new sandbox: no second open audit, the row follows.
    assert not terminal_shells.record_open(grant, world.bob, None, "sandbox-second")
    terminal.refresh_from_db()
    assert terminal.sandbox_id == "sandbox-second"
    assert AuditEvent.objects.filter(action="terminal.open", target_id=grant.terminal_id).count() == 1


store = terminal_support.store
session = terminal_support.session


def _tmux_sessions(session: Session) -> list[str]:
    script = f"tmux -L {keeper.SOCKET} list-sessions -F '#{{session_name}}' 2>/dev/null; true"
    result = Runtime().exec(session, ExecRequest(argv=("/bin/sh", "-c", script), timeout_s=30))
    return result.stdout.decode().split()


@pytest.mark.docker
@pytest.mark.django_db
def test_the_sweep_ends_the_kept_shell_of_a_terminal_whose_audit_rows_are_gone(world: World, session: Session) -> None:
    """The sweep finds the sandbox on the row: an abandoned terminal whose audit rows went
    (an operator pruned them, or an older console's retention did) still has its shell ended."""
    sandbox_id = Runtime().resolve_session(session).sandbox.sandbox_id
    terminal = terminals.create_terminal(world.bob, session)
    tid = str(terminal.pk)
    backend = get_backend(session.config)
    assert keeper.probe(backend, sandbox_id, tid).kept, "the base template keeps shells (tmux)"
    # The shell a connection left behind: its tmux session, started detached the way a PTY does.
    line = keeper._tmux("new-session", "-d", "-s", keeper.session_name(tid), "--", *terminal_shells.SHELL)
    started = Runtime().exec(session, ExecRequest(argv=("/bin/sh", "-c", line), timeout_s=30))
    assert keeper.session_name(tid) in _tmux_sessions(session), started
    grant = terminals.Grant(tid, str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminal_shells.record_open(grant, world.bob, None, sandbox_id)
    AuditEvent.objects.filter(target_id=tid).delete()
    Terminal.objects.filter(pk=tid).update(held_until=timezone.now() - timedelta(seconds=sweep.MARGIN_S + 5))
    assert sweep.close_abandoned() == 1
    assert keeper.session_name(tid) not in _tmux_sessions(session)
    assert Terminal.objects.get(pk=tid).close_reason == sweep.ABANDONED


@pytest.mark.django_db(transaction=True)
def test_the_migration_copies_the_sandbox_of_open_terminals_from_their_open_audit(world: World) -> None:
    still_open, _ = _open_with_a_shell(world, "migrated-open", "sandbox-open")
    closed, closed_grant = _open_with_a_shell(world, "migrated-closed", "sandbox-closed")
    terminal_shells.record_close(closed_grant, world.bob, None, "closed by the client", {"bytes_in": 0, "bytes_out": 0})
    executor = MigrationExecutor(connection)
    executor.migrate([("sandboxes", "0016_exec_slots")])  # the column goes
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("sandboxes"))
    assert Terminal.objects.get(pk=still_open.pk).sandbox_id == "sandbox-open"
    assert Terminal.objects.get(pk=closed.pk).sandbox_id == ""  # closed: nobody needs it


# The pass decides which terminal.open rows to keep with one cutoff and deletes aged audit rows
# with another, taken later (each step asks the clock). An open audit aging between the two must
# still be kept while its terminal is open. Real PostgreSQL: the second transaction is a
# connection of its own, holding a table lock.

HOLD_S = 1.5


def _open_terminal(world: World, key: str) -> Terminal:
    if not SandboxConfig.objects.filter(space=world.space_a, is_default=True).exists():
        make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, key)
    terminal = terminals.create_terminal(world.bob, session)
    grant = terminals.Grant(str(terminal.pk), str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminal_shells.record_open(grant, world.bob, None, f"sandbox-{key}")
    return terminal


@pytest.mark.django_db(transaction=True)
def test_an_open_audit_aging_during_the_pass_is_kept_while_its_terminal_is_open(
    tuned: Tuned, world: World, settings: Any
) -> None:
    tuned({"retention.audit_events_days": 1})
    day = timedelta(days=1)
    long_open = _open_terminal(world, "long-open")  # aged already: the pass checks its terminal
    AuditEvent.objects.filter(action="terminal.open", target_id=str(long_open.pk)).update(time=timezone.now() - 2 * day)
    ageing = _open_terminal(world, "ageing")
    locked, release = threading.Event(), threading.Event()

    def hold_the_terminals_table() -> None:
        try:
            with transaction.atomic(using="default"), connections["default"].cursor() as cursor:
                cursor.execute(f"LOCK TABLE {Terminal._meta.db_table} IN ACCESS EXCLUSIVE MODE")
                locked.set()
                release.wait(10)
        finally:
            connections["default"].close()

    holder = threading.Thread(target=hold_the_terminals_table)
    holder.start()
    try:
        assert locked.wait(10)
        # Its open turns one day old half a second from now: during the pass.
        AuditEvent.objects.filter(action="terminal.open", target_id=str(ageing.pk)).update(
            time=timezone.now() - day + timedelta(seconds=0.5)
        )
        threading.Timer(HOLD_S, release.set).start()
        apply_retention()  # the periodic pass: no `now`
    finally:
        release.set()
        holder.join(15)
    assert Terminal.objects.get(pk=ageing.pk).closed is None
    assert AuditEvent.objects.filter(action="terminal.open", target_id=str(long_open.pk)).count() == 1
    assert AuditEvent.objects.filter(action="terminal.open", target_id=str(ageing.pk)).count() == 1, (
        "the open audit of a terminal still open was deleted"
    )
