"""Adversarial review (rev2): console processes SIGKILLed inside the windows the lease and the
exec counter leave open, with the real database seen from a second, real Python process.

- a process killed after it won `attachments.claim_close` but before `record_close` (the
  window holds the kept shell's end: an exec of up to 20 s) must not leave the terminal open
  for ever: the sweep has to close it, with exactly one close audit;
- an exec counted in by a process killed before its `finally` must stop counting against the
  space's concurrent-exec limit once its own deadline has passed, even when the session keeps
  running other execs (an agent's steady traffic).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from console.models import AuditEvent, SpaceLimits
from sandboxes.models import Session, Terminal
from sandboxes.sessions import runtime as runtime_module
from sandboxes.sessions.limits import LimitExceeded
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.terminal import attachments, sweep
from sandboxes.terminal import shells as terminal_shells
from sandboxes.terminal import tickets as terminals
from tests.factories import make_config
from tests.personas import World

REPO = Path(__file__).resolve().parents[2]


def _child(code: str) -> subprocess.Popen[str]:
    """A real console-side Python process on the test database; prints READY when there."""
    settings_dict = connection.settings_dict
    url = (
        f"postgres://{settings_dict['USER']}@{settings_dict['HOST'] or '127.0.0.1'}:"
        f"{settings_dict['PORT'] or 5432}/{settings_dict['NAME']}"
    )
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "console.settings.test"}
    prelude = "import django, sys, time\ndjango.setup()\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )


def _kill_when_ready(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "READY", f"child did not get there: {line!r} (rc {child.poll()})"
    os.kill(child.pid, signal.SIGKILL)  # no finally, no atexit, no cleanup
    child.wait(timeout=10)


@pytest.mark.django_db(transaction=True)
def test_a_closer_killed_between_claim_and_record_is_closed_by_the_sweep(world: World) -> None:
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "killed-closer")
    terminal = terminals.create_terminal(world.bob, session)
    tid = str(terminal.pk)
    grant = terminals.Grant(tid, str(session.pk), str(session.space_id), world.bob.pk, False)
    assert terminal_shells.record_open(grant, world.bob, None, "no-such-sandbox")

    child = _child(
        "from sandboxes.terminal import attachments\n"
        f"assert attachments.take({tid!r}, 'replica-a')\n"
        f"assert attachments.claim_close({tid!r}, 'replica-a', force=True)\n"
        "print('READY', flush=True)\n"
        "time.sleep(120)  # ending the kept shell (an exec of up to 20 s) ... killed here\n"
    )
    _kill_when_ready(child)
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


@pytest.mark.django_db(transaction=True)
def test_a_killed_exec_stops_counting_after_its_deadline_under_steady_traffic(world: World, monkeypatch: Any) -> None:
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "killed-exec")
    SpaceLimits.objects.update_or_create(space=world.space_a, defaults={"concurrent_execs": 2})
    grace_s = 1.0
    monkeypatch.setattr(runtime_module, "EXEC_GRACE", timedelta(seconds=grace_s))
    child = _child(
        "from datetime import timedelta\n"
        "from sandboxes.models import Session\n"
        "from sandboxes.sessions import runtime\n"
        f"runtime.EXEC_GRACE = timedelta(seconds={grace_s})\n"
        f"session = Session.objects.select_related('space').get(pk={str(session.pk)!r})\n"
        "with runtime.Runtime().exec_in_flight(session, 1.0):\n"
        "    print('READY', flush=True)\n"
        "    time.sleep(120)\n"
    )
    _kill_when_ready(child)
    killed_deadline = time.monotonic() + 1.0 + grace_s
    rt = runtime_module.Runtime()
    session = Session.objects.select_related("space").get(pk=session.pk)
    # The agent goes on: one short exec after another, well within each other's deadline.
    while time.monotonic() < killed_deadline + 2.0:
        with rt.exec_in_flight(session, 1.0):
            time.sleep(0.05)
        time.sleep(0.3)
    # The killed exec's own deadline is long past; only live execs count now.
    with rt.exec_in_flight(session, 1.0):
        try:
            with rt.exec_in_flight(session, 1.0):  # two live execs: within the limit of 2
                pass
        except LimitExceeded as refused:
            pytest.fail(f"the dead exec still counts: {refused}")
