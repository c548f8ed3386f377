"""Console processes and the work they own (console/processes.py): which process counts as
dead, and what releasing it frees — exec slots (with their sessions' in-flight counts),
background commands, jobs and the skill image generation a job was building — on the real
database. The whole path with a real process killed is tests/console/test_process_lifecycle.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from console import processes
from console.models import AdminJob, JobStatus, WorkerProcess
from sandboxes.models import BackgroundCommand, CommandStatus, ExecSlot, Session
from skills.install.start import _check_not_building
from skills.models import SkillImage, SkillImageStatus
from tests.factories import make_config, make_space
from tests.support.tuning import Tuned

pytestmark = pytest.mark.django_db


def process_row(
    *, host: str = "elsewhere.test", pid: int = 4242, age_s: float = 0, identity: str = ""
) -> WorkerProcess:
    now = timezone.now()
    return WorkerProcess.objects.create(
        kind="web",
        host=host,
        pid=pid,
        pid_identity=identity,
        started=now - timedelta(seconds=age_s + 60),
        heartbeat=now - timedelta(seconds=age_s),
    )


def finished_pid() -> int:
    """The pid of a process of this host that has ended (and was reaped)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    return int(child.stdout)


def test_a_process_is_dead_past_the_heartbeat_window_or_when_its_pid_is_gone(tuned: Tuned, settings) -> None:
    tuned({"processes.heartbeat_window_s": 90})
    fresh_elsewhere = process_row(age_s=5)
    silent_elsewhere = process_row(age_s=91)
    gone_here = process_row(host=processes.HOST, pid=finished_pid(), identity="")
    alive_here = process_row(host=processes.HOST, pid=os.getppid() or 1, identity=processes.pid_identity(os.getppid()))
    # A pid number reused by another process: the start time differs, so it is not the one.
    reused_here = process_row(host=processes.HOST, pid=os.getppid(), identity="other-boot:1")

    dead = {row.pk for row in processes.dead_processes()}

    assert silent_elsewhere.pk in dead
    assert gone_here.pk in dead
    assert reused_here.pk in dead
    assert fresh_elsewhere.pk not in dead
    assert alive_here.pk not in dead


def test_this_process_is_never_taken_for_dead(tuned: Tuned, settings) -> None:
    tuned({"processes.heartbeat_window_s": 90})
    mine = processes.this_process("test")
    WorkerProcess.objects.filter(pk=mine).update(heartbeat=timezone.now() - timedelta(hours=1))
    assert mine not in {row.pk for row in processes.dead_processes()}


def test_releasing_a_dead_process_frees_its_slots_commands_jobs_and_skill_build() -> None:
    space = make_space()
    config = make_config(space)
    session = Session.objects.create(space=space, config=config, key="crashed", execs_in_flight=3)
    session.exec_deadline = timezone.now() + timedelta(hours=1)
    session.save(update_fields=["exec_deadline"])
    dead = process_row(age_s=3600)
    live = process_row(age_s=1)
    until = timezone.now() + timedelta(hours=1)
    for _ in range(2):
        ExecSlot.objects.create(space=space, session=session, deadline=until, owner_process=dead.pk)
    kept_slot = ExecSlot.objects.create(space=space, session=session, deadline=until, owner_process=live.pk)
    command = BackgroundCommand.objects.create(session=session, shell="sleep 9", owner_process=dead.pk)
    other_command = BackgroundCommand.objects.create(session=session, shell="sleep 9", owner_process=live.pk)
    job = AdminJob.objects.create(
        kind="skills.uninstall", space=space, status=JobStatus.RUNNING, owner_process=dead.pk, started=timezone.now()
    )
    queued = AdminJob.objects.create(kind="skills.install", space=space, owner_process=dead.pk)
    other_job = AdminJob.objects.create(
        kind="skills.install", space=space, status=JobStatus.RUNNING, owner_process=live.pk
    )
    building = SkillImage.objects.create(space=space, config=config, generation=3, job=job)
    with pytest.raises(Exception, match="Generation 3 is still building"):
        _check_not_building(space, config)

    assert processes.release_dead_processes() == 1

    assert set(ExecSlot.objects.values_list("pk", flat=True)) == {kept_slot.pk}
    session.refresh_from_db()
    assert session.execs_in_flight == 1  # the live process's exec still counts
    assert session.exec_deadline is not None
    command.refresh_from_db()
    other_command.refresh_from_db()
    assert command.status == CommandStatus.LOST
    assert command.finished is not None
    assert other_command.status == CommandStatus.RUNNING
    for interrupted in (job, queued):
        interrupted.refresh_from_db()
        assert interrupted.status == JobStatus.FAILED
        assert interrupted.error.startswith("Interrupted by a restart")
        assert interrupted.finished is not None
        assert "Interrupted by a restart" in interrupted.log[-1]["message"]
    other_job.refresh_from_db()
    assert other_job.status == JobStatus.RUNNING
    building.refresh_from_db()
    assert building.status == SkillImageStatus.FAILED
    assert "previous generation stays in force" in building.error
    _check_not_building(space, config)  # a new install may start at once
    assert not WorkerProcess.objects.filter(pk=dead.pk).exists()
    assert WorkerProcess.objects.filter(pk=live.pk).exists()
    # A second pass (another process racing this one) finds nothing left to release.
    assert processes.release_process(dead.pk) is None


def test_the_last_slot_of_a_session_clears_its_exec_deadline() -> None:
    space = make_space()
    session = Session.objects.create(space=space, config=make_config(space), key="only", execs_in_flight=1)
    Session.objects.filter(pk=session.pk).update(exec_deadline=timezone.now() + timedelta(hours=1))
    dead = process_row(age_s=3600)
    ExecSlot.objects.create(
        space=space, session=session, deadline=timezone.now() + timedelta(hours=1), owner_process=dead.pk
    )

    processes.release_dead_processes()

    session.refresh_from_db()
    assert (session.execs_in_flight, session.exec_deadline) == (0, None)


def test_a_process_taken_for_dead_registers_again_on_its_next_heartbeat() -> None:
    mine = processes.this_process("test")
    WorkerProcess.objects.filter(pk=mine).delete()  # another process released it (frozen past the window)
    processes.beat()
    row = WorkerProcess.objects.get(pk=mine)
    assert (row.host, row.pid) == (processes.HOST, os.getpid())


def test_a_forked_child_is_a_process_of_its_own() -> None:
    parent = processes.this_process("test")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no database work, only what it would register as
        os.close(read)
        os.write(write, str(processes.registered_process()).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child_view = os.read(read, 100).decode()
    os.close(read)
    assert child_view == "None"
    assert processes.registered_process() == parent
    assert uuid.UUID(str(parent))


def test_a_dead_exec_past_its_deadline_never_discounts_a_live_call() -> None:
    """A dead process's exec whose deadline passed no longer counts on its session (the next
    call started the count again from itself). Releasing that process later must not take
    it off the live call's count: a session reading 0 in flight during a file operation
    lets a pause freeze the sandbox under it (docker/for-linux#891)."""
    from sandboxes.sessions.inflight import busy_reason, in_flight

    space = make_space()
    session = Session.objects.create(space=space, config=make_config(space), key="after-deadline")
    dead = process_row(age_s=3600)
    past = timezone.now() - timedelta(seconds=5)
    # The dead exec: counted on the session and holding a slot, both past their deadlines.
    Session.objects.filter(pk=session.pk).update(execs_in_flight=1, exec_deadline=past)
    ExecSlot.objects.create(space=space, session=session, deadline=past, owner_process=dead.pk)

    with in_flight(session):  # a live file operation: the count starts again from it
        assert busy_reason(session.pk) is not None
        processes.release_dead_processes()
        assert busy_reason(session.pk) is not None, "the live call no longer counts"
        session.refresh_from_db()
        assert session.execs_in_flight == 1
    assert not ExecSlot.objects.filter(owner_process=dead.pk).exists()


def test_an_exec_of_a_process_taken_for_dead_is_not_counted_out_twice() -> None:
    """A process frozen past the heartbeat window is released while its exec still runs: the
    release takes that exec off its session's count. When the exec then ends, it must not
    take itself off again, or another call still running on the session stops counting and
    a pause may freeze the sandbox under it."""
    from sandboxes.sessions.inflight import busy_reason, in_flight
    from sandboxes.sessions.runtime import Runtime

    space = make_space()
    session = Session.objects.create(space=space, config=make_config(space), key="frozen-worker")
    me = processes.this_process()
    try:
        with in_flight(session):  # another call, of a process that is not released
            with Runtime().exec_in_flight(session, 30):
                processes.release_process(me)  # taken for dead while the exec runs
            session.refresh_from_db()
            assert session.execs_in_flight == 1
            assert busy_reason(session.pk) is not None, "the other call no longer counts"
        session.refresh_from_db()
        assert (session.execs_in_flight, session.exec_deadline) == (0, None)
        assert not ExecSlot.objects.filter(session=session).exists()
    finally:
        processes.beat()  # registered again, as its next heartbeat does
