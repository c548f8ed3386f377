"""The attachment lease and the once-per-terminal audit (sandboxes/terminal/attachments.py,
tickets.record_open/record_close), against the real database; the sandbox side is in
test_replicas.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from console.models import (
    AuditEvent,
    SpaceLimits,  # noqa: F401
)
from sandboxes.models import (
    Session,  # noqa: F401
    Terminal,
)
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.terminal import attachments, sweep
from sandboxes.terminal import shells as terminal_shells
from sandboxes.terminal import tickets as terminals
from tests.factories import make_config
from tests.personas import World
from tests.support.killed_process import console_child, kill_when_ready
from tests.support.tuning import Tuned


def grant_for(terminal: Terminal) -> terminals.Grant:
    return terminals.Grant(
        str(terminal.pk), str(terminal.session_id), str(terminal.session.space_id), terminal.user_id, False
    )


@pytest.fixture
def terminal(world: World) -> Terminal:
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "lease")
    return terminals.create_terminal(world.bob, session)


@pytest.mark.django_db
def test_a_grace_window_closes_only_when_no_other_process_holds_the_terminal(
    tuned: Tuned, terminal: Terminal, settings: Any
) -> None:
    tuned({"terminal.lease_s": 30})
    tuned({"terminal.reattach_s": 30})
    tid = str(terminal.pk)
    assert attachments.take(tid, "a")
    attachments.release(tid, "a")  # a's client dropped: its grace window
    assert attachments.take(tid, "b")  # reattached through b
    assert not attachments.renew(tid, "a")  # a learns it was taken over
    assert attachments.renew(tid, "b")
    assert not attachments.claim_close(tid, "a", force=False)  # a's grace ends: b holds it
    assert Terminal.objects.get(pk=tid).holder == "b"
    attachments.release(tid, "b")
    # b's grace window is in the lease: a (its own shell, plain) still may not close it
    assert not attachments.claim_close(tid, "a", force=False)
    assert attachments.claim_close(tid, "b", force=False)  # b's own grace ends: b closes
    assert not attachments.take(tid, "c")  # closing: nobody attaches any more
    assert not attachments.claim_close(tid, "c", force=True)  # and nobody closes twice


@pytest.mark.django_db
def test_an_expired_lease_does_not_keep_the_terminal(terminal: Terminal) -> None:
    tid = str(terminal.pk)
    assert attachments.take(tid, "b")
    Terminal.objects.filter(pk=tid).update(held_until=timezone.now() - timedelta(seconds=1))  # b was killed
    assert attachments.claim_close(tid, "a", force=False)


@pytest.mark.django_db
def test_one_open_and_one_close_audit_however_many_processes_served_it(terminal: Terminal) -> None:
    grant = grant_for(terminal)
    assert terminal_shells.record_open(grant, terminal.user, "127.0.0.1", "sbx-1") is True
    assert terminal_shells.record_open(grant, terminal.user, "127.0.0.1", "sbx-1") is False  # a reattach elsewhere
    attachments.add_traffic(grant.terminal_id, 5, 70)  # a process that let go
    terminal_shells.record_close(grant, terminal.user, None, "closed by the client", {"bytes_in": 3, "bytes_out": 30})
    terminal_shells.record_close(grant, terminal.user, None, "again", {"bytes_in": 1, "bytes_out": 1})
    row = Terminal.objects.get(pk=terminal.pk)
    assert (row.bytes_in, row.bytes_out, row.close_reason) == (8, 100, "closed by the client")
    assert AuditEvent.objects.filter(action="terminal.open", target_id=grant.terminal_id).count() == 1
    closes = list(AuditEvent.objects.filter(action="terminal.close", target_id=grant.terminal_id))
    assert len(closes) == 1
    assert closes[0].details["bytes_out"] == 100


@pytest.mark.django_db
def test_the_sweep_closes_only_terminals_whose_lease_ran_out(world: World, terminal: Terminal) -> None:
    session = terminal.session
    held = terminals.create_terminal(world.bob, session)
    never_opened = terminals.create_terminal(world.bob, session)
    for row in (terminal, held):
        terminal_shells.record_open(grant_for(row), world.bob, None, "")  # no sandbox id: nothing to end there
        attachments.take(str(row.pk), "gone")
    past = timezone.now() - timedelta(seconds=sweep.MARGIN_S + 5)
    Terminal.objects.filter(pk=terminal.pk).update(held_until=past)
    Terminal.objects.filter(pk=never_opened.pk).update(held_until=past)
    assert sweep.close_abandoned() == 1
    assert Terminal.objects.get(pk=terminal.pk).close_reason == sweep.ABANDONED
    assert Terminal.objects.get(pk=held.pk).closed is None
    assert Terminal.objects.get(pk=never_opened.pk).closed is None
    assert AuditEvent.objects.filter(action="terminal.close", target_id=str(terminal.pk)).count() == 1
    assert sweep.close_abandoned() == 0


@pytest.mark.django_db
def test_a_close_whose_audit_fails_leaves_the_row_open_for_the_next_try(terminal: Terminal) -> None:
    """The close and its audit row commit together: a reader that sees the row closed finds
    its audit (a replica test once read between the two), and a failed audit write closes nothing."""
    grant = grant_for(terminal)
    unwritable = {"bytes_in": 1, "bytes_out": 2, "when": object()}  # not JSON: the audit insert fails
    with pytest.raises(TypeError):
        terminal_shells.record_close(grant, terminal.user, None, "closed by the client", unwritable)
    assert Terminal.objects.get(pk=terminal.pk).closed is None
    assert not AuditEvent.objects.filter(action="terminal.close", target_id=grant.terminal_id).exists()
    terminal_shells.record_close(grant, terminal.user, None, "closed by the client", {"bytes_in": 1, "bytes_out": 2})
    assert Terminal.objects.get(pk=terminal.pk).closed is not None
    assert AuditEvent.objects.filter(action="terminal.close", target_id=grant.terminal_id).count() == 1


# A process killed after it won attachments.claim_close but before record_close (the window holds
# the kept shell's end) must not leave the terminal open for ever: the sweep closes it, with
# exactly one close audit.


@pytest.mark.django_db(transaction=True)
def test_a_closer_killed_between_claim_and_record_is_closed_by_the_sweep(world: World) -> None:
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "killed-closer")
    terminal = terminals.create_terminal(world.bob, session)
    tid = str(terminal.pk)
    grant = terminals.Grant(tid, str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminal_shells.record_open(grant, world.bob, None, "no-such-sandbox")

    child = console_child(
        "from sandboxes.terminal import attachments\n"
        f"assert attachments.take({tid!r}, 'replica-a')\n"
        f"assert attachments.claim_close({tid!r}, 'replica-a', force=True)\n"
        "print('READY', flush=True)\n"
        "time.sleep(120)  # ending the kept shell (an exec of up to 20 s) ... killed here\n"
    )
    kill_when_ready(child)
    row = Terminal.objects.get(pk=tid)
    assert row.closed is None
    assert row.holder.startswith(attachments.CLOSING)

    # Long after: every timestamp the row carries is an hour older.
    hour = timedelta(hours=1)
    if row.held_until is not None:
        Terminal.objects.filter(pk=tid).update(held_until=row.held_until - hour)
    assert sweep.close_abandoned() == 1, "a terminal whose closer died stays open for ever"
    row.refresh_from_db()
    assert row.closed is not None
    assert row.holder == ""
    assert AuditEvent.objects.filter(action="terminal.close", target_id=tid).count() == 1
    assert AuditEvent.objects.filter(action="terminal.open", target_id=tid).count() == 1
    assert sweep.close_abandoned() == 0  # and nobody closes it twice
