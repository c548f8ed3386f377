"""Adversarial review (rev2): the retention pass against a terminal that is still open.

The sweep finds the sandbox of an abandoned terminal through its `terminal.open` audit row
(sweep.close_abandoned); the audit retention prunes audit rows by age alone. A terminal open
longer than the audit retention (a kept tmux shell outlives every connection) lost its open
audit, and then the sweep could no longer end the shell it left in the sandbox. Now the row
carries its sandbox (`Terminal.sandbox_id`) and the retention keeps an open with its close.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.utils import timezone

from console.models import AuditAction, AuditEvent
from console.services import SYSTEM, record_audit
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig, Session, Terminal
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.retention import apply_retention
from sandboxes.sessions.runtime import Runtime, backend_for
from sandboxes.terminal import keeper, sweep
from sandboxes.terminal import tickets as terminals
from tests.factories import make_config
from tests.personas import World
from tests.support import terminal_support


@pytest.mark.django_db
def test_retention_keeps_the_open_audit_of_a_terminal_still_open(world: World, settings: Any) -> None:
    settings.RETENTION_DAYS = {**settings.RETENTION_DAYS, "audit_events": 1}
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "long-open")
    terminal = terminals.create_terminal(world.bob, session)
    tid = str(terminal.pk)
    grant = terminals.Grant(tid, str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminals.record_open(grant, world.bob, None, "sandbox-of-the-shell")
    AuditEvent.objects.filter(action="terminal.open", target_id=tid).update(time=timezone.now() - timedelta(days=2))
    apply_retention()
    terminal.refresh_from_db()
    assert terminal.closed is None  # still open: live, never touched ...
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1  # ... its open neither


def _open(world: World, key: str, sandbox_id: str) -> tuple[Terminal, terminals.Grant]:
    if not SandboxConfig.objects.filter(space=world.space_a, is_default=True).exists():
        make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, key)
    terminal = terminals.create_terminal(world.bob, session)
    grant = terminals.Grant(str(terminal.pk), str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminals.record_open(grant, world.bob, None, sandbox_id)
    return terminal, grant


def _age(terminal: Terminal, days: int, *actions: str) -> None:
    AuditEvent.objects.filter(action__in=actions, target_id=str(terminal.pk)).update(
        time=timezone.now() - timedelta(days=days)
    )


@pytest.mark.django_db
def test_an_open_is_pruned_with_its_close_never_before_it(world: World, settings: Any) -> None:
    settings.RETENTION_DAYS = {**settings.RETENTION_DAYS, "audit_events": 1, "terminals": 0}
    terminal, grant = _open(world, "closed-late", "sandbox-a")
    _age(terminal, 3, "terminal.open")
    terminals.record_close(grant, world.bob, None, "closed by the client", {"bytes_in": 0, "bytes_out": 0})
    tid = str(terminal.pk)
    apply_retention()  # the close is recent: the open stays with it
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1
    assert AuditEvent.objects.filter(action="terminal.close", target_id=tid).count() == 1
    settings.RETENTION_DAYS = {**settings.RETENTION_DAYS, "terminals": 1}
    Terminal.objects.filter(pk=terminal.pk).update(closed=timezone.now() - timedelta(days=2))
    apply_retention()  # the closed row is pruned, but its close audit is recent: the open stays
    assert not Terminal.objects.filter(pk=terminal.pk).exists()
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1
    _age(terminal, 2, "terminal.close")
    apply_retention()  # both past the setting: both go
    assert not AuditEvent.objects.filter(target_type="terminal", target_id=tid).exists()


@pytest.mark.django_db
def test_other_old_audit_rows_still_go(world: World, settings: Any) -> None:
    settings.RETENTION_DAYS = {**settings.RETENTION_DAYS, "audit_events": 1}
    terminal, _ = _open(world, "kept-open", "sandbox-b")
    record_audit(SYSTEM, AuditAction.SANDBOX_CONFIG_UPDATE, target_type="sandbox_config", target_id=str(terminal.pk))
    record_audit(SYSTEM, AuditAction.TERMINAL_OPEN, target_type="terminal", target_id="not-a-terminal-id")
    AuditEvent.objects.update(time=timezone.now() - timedelta(days=2))
    apply_retention()
    assert list(AuditEvent.objects.exclude(action="retention.prune").values_list("action", "target_id")) == [
        ("terminal.open", str(terminal.pk))
    ]


@pytest.mark.django_db
def test_the_row_carries_the_sandbox_of_its_last_shell(world: World) -> None:
    terminal, grant = _open(world, "carries", "sandbox-first")
    terminal.refresh_from_db()
    assert terminal.sandbox_id == "sandbox-first"
    # A shell that replaced a lost one in a new sandbox: no second open audit, the row follows.
    assert not terminals.record_open(grant, world.bob, None, "sandbox-second")
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
    backend = backend_for(session.config)
    assert keeper.probe(backend, sandbox_id, tid).kept, "the base template keeps shells (tmux)"
    # The shell a connection left behind: its tmux session, started detached the way a PTY does.
    line = keeper._tmux("new-session", "-d", "-s", keeper.session_name(tid), "--", *terminals.SHELL)
    started = Runtime().exec(session, ExecRequest(argv=("/bin/sh", "-c", line), timeout_s=30))
    assert keeper.session_name(tid) in _tmux_sessions(session), started
    grant = terminals.Grant(tid, str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminals.record_open(grant, world.bob, None, sandbox_id)
    AuditEvent.objects.filter(target_id=tid).delete()
    Terminal.objects.filter(pk=tid).update(held_until=timezone.now() - timedelta(seconds=sweep.MARGIN_S + 5))
    assert sweep.close_abandoned() == 1
    assert keeper.session_name(tid) not in _tmux_sessions(session)
    assert Terminal.objects.get(pk=tid).close_reason == sweep.ABANDONED


@pytest.mark.django_db(transaction=True)
def test_the_migration_copies_the_sandbox_of_open_terminals_from_their_open_audit(world: World) -> None:
    still_open, _ = _open(world, "migrated-open", "sandbox-open")
    closed, closed_grant = _open(world, "migrated-closed", "sandbox-closed")
    terminals.record_close(closed_grant, world.bob, None, "closed by the client", {"bytes_in": 0, "bytes_out": 0})
    executor = MigrationExecutor(connection)
    executor.migrate([("sandboxes", "0016_exec_slots")])  # the column goes
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("sandboxes"))
    assert Terminal.objects.get(pk=still_open.pk).sandbox_id == "sandbox-open"
    assert Terminal.objects.get(pk=closed.pk).sandbox_id == ""  # closed: nobody needs it
