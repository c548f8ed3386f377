"""Background commands against the real Docker engine and Redis."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from console.models import AuditEvent
from console.services import Actor, ServiceError
from sandboxes.models import BackgroundCommand, CommandStatus, SandboxConfig, Session
from sandboxes.sessions import store_select as binding
from sandboxes.sessions.commands import CommandOutput, kill_command, read_output, send_input, start_command
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from tests.conftest import REDIS_URL
from tests.personas import World

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def runtime(settings: Any) -> Iterator[Runtime]:
    """Every process-level helper (kill, exit codes) shares this run's Redis store."""
    settings.REDIS_URL = REDIS_URL
    store = RedisSessionStore(REDIS_URL)
    previous = binding._store
    binding.set_store(store)
    try:
        yield Runtime(store)
    finally:
        binding.set_store(previous)


@pytest.fixture(autouse=True)
def _pumps_finish() -> Iterator[None]:
    """Pump threads write the outcome to the database: let them end before the flush."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith("command-"):
            thread.join(timeout=30)


@pytest.fixture
def session(world: World, session_config: SandboxConfig, runtime: Runtime) -> Session:
    session = get_or_create_session(world.space_a, f"cmd-{time.monotonic_ns()}")
    runtime.resolve_session(session)
    return session


@pytest.fixture
def actor(world: World) -> Actor:
    return Actor(user=world.bob, source_ip="127.0.0.1")


def wait_finished(command: BackgroundCommand, timeout: float = 30) -> tuple[bytes, CommandOutput]:
    """Read every page until the reader has everything."""
    data = b""
    after: int | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = read_output(command, after)
        data += page.data
        after = page.next_after
        if page.finished:
            return data, page
        if not page.chunks:
            time.sleep(0.05)
    raise AssertionError(f"command did not finish; output so far {data[-200:]!r}")


def sandbox_processes(runtime: Runtime, session: Session) -> str:
    from sandboxes.backends.base import ExecRequest

    result = runtime.exec(session, ExecRequest(argv=("ps", "-eo", "pid,pgid,args"), timeout_s=30))
    return result.stdout.decode()


def test_output_arrives_incrementally_and_the_exit_code_is_recorded(
    runtime: Runtime, session: Session, actor: Actor
) -> None:
    command = start_command(
        runtime, session, shell="for i in 1 2 3; do echo line$i; sleep 0.7; done; exit 3", actor=actor
    )
    assert command.status == CommandStatus.RUNNING
    deadline = time.monotonic() + 10
    first = read_output(command)
    while b"line1" not in first.data and time.monotonic() < deadline:
        time.sleep(0.05)
        first = read_output(command)
    assert first.data == b"line1\n"  # raw output: no echo, no CR added
    assert not first.finished
    rest, last = wait_finished(command)
    assert first.data + rest.split(b"line1\n", 1)[-1] == b"line1\nline2\nline3\n"
    assert (last.status, last.exit_code) == (CommandStatus.EXITED, 3)
    command.refresh_from_db()
    assert command.finished is not None
    assert AuditEvent.objects.filter(action="command.start", target_id=str(command.id), actor=actor.user).count() == 1


def test_argv_commands_run_as_the_session_user_in_the_workspace(
    runtime: Runtime, session: Session, actor: Actor
) -> None:
    command = start_command(runtime, session, argv=["sh", "-c", 'echo "$(id -u) $(pwd)"'], actor=actor)
    data, last = wait_finished(command)
    assert data == b"1000 /workspace\n"
    assert last.exit_code == 0


def test_a_reader_that_reconnects_with_its_last_id_loses_nothing(
    runtime: Runtime, session: Session, actor: Actor
) -> None:
    command = start_command(runtime, session, shell="seq 1 20000", actor=actor)
    collected = b""
    after: int | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        # Each page is a fresh "connection" that only remembers its last id.
        page = read_output(BackgroundCommand.objects.get(pk=command.pk), after, max_bytes=4096)
        assert not page.fell_behind
        collected += page.data
        after = page.next_after
        if page.finished:
            break
        if not page.chunks:
            time.sleep(0.02)
    expected = "".join(f"{i}\n" for i in range(1, 20001)).encode()
    assert collected == expected


def test_a_reader_too_far_behind_is_told_so(runtime: Runtime, session: Session, actor: Actor) -> None:
    # More than the Redis ring keeps (4 MiB): the oldest chunks are dropped.
    command = start_command(runtime, session, shell="head -c 6000000 /dev/zero | tr '\\0' x; echo", actor=actor)
    data, _ = wait_finished(command, timeout=60)
    assert len(data) > 1_000_000  # read while running, so most of it arrived in time
    late = read_output(command, 1)
    assert late.fell_behind
    assert late.chunks
    assert late.chunks[0][0] > 2


def test_stdin_reaches_the_command(runtime: Runtime, session: Session, actor: Actor) -> None:
    command = start_command(runtime, session, shell='read -r line; echo "got:$line"; cat', actor=actor)
    send_input(command, b"hello world\n", actor=actor)
    send_input(command, "more\n", actor=actor, eof=True)
    data, last = wait_finished(command)
    assert data == b"got:hello world\nmore\n"
    assert last.exit_code == 0
    rows = AuditEvent.objects.filter(action="command.input", target_id=str(command.id))
    assert [row.details["bytes"] for row in rows.order_by("time", "id")] == [12, 5]
    assert "hello" not in str([row.details for row in rows])  # input is never recorded
    with pytest.raises(ServiceError):
        send_input(command, b"late\n", actor=actor)


def test_kill_leaves_no_process_in_the_sandbox(runtime: Runtime, session: Session, actor: Actor) -> None:
    command = start_command(
        runtime, session, shell="sleep 301 & sleep 302 & (sleep 303; echo never); wait", actor=actor
    )
    deadline = time.monotonic() + 10
    while "sleep 303" not in sandbox_processes(runtime, session) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "sleep 301" in sandbox_processes(runtime, session)
    killed = kill_command(BackgroundCommand.objects.get(pk=command.pk), actor=actor)
    assert killed.status == CommandStatus.KILLED
    _, last = wait_finished(command)
    assert last.status == CommandStatus.KILLED
    remaining = sandbox_processes(runtime, session)
    assert "sleep 30" not in remaining, remaining
    assert str(command.id) not in remaining
    assert AuditEvent.objects.filter(action="command.kill", target_id=str(command.id)).count() == 1
    assert kill_command(killed, actor=actor).status == CommandStatus.KILLED  # idempotent, no second row
    assert AuditEvent.objects.filter(action="command.kill", target_id=str(command.id)).count() == 1


def test_bad_input_is_a_service_error(runtime: Runtime, session: Session, actor: Actor) -> None:
    bad: list[dict[str, Any]] = [{}, {"shell": "true", "argv": ["true"]}, {"shell": "  "}, {"argv": []}, {"argv": "ls"}]
    for kwargs in bad:
        with pytest.raises(ServiceError):
            start_command(runtime, session, actor=actor, **kwargs)
    assert not BackgroundCommand.objects.filter(session=session).exists()
    command = start_command(runtime, session, argv=["true"], actor=actor)
    for after, max_bytes in ((-1, 10), (None, 0), (None, 10**9)):
        with pytest.raises(ServiceError):
            read_output(command, after, max_bytes)
    with pytest.raises(ServiceError):
        send_input(command, b"x" * 70_000, actor=actor)
    wait_finished(command)
