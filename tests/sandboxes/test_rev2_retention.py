"""Adversarial review (rev2): the retention pass against a terminal that is still open.

The sweep finds the sandbox of an abandoned terminal through its `terminal.open` audit row
(sweep.close_abandoned); the audit retention prunes audit rows by age alone. A terminal open
longer than the audit retention (a kept tmux shell outlives every connection) loses its open
audit, and then the sweep can no longer end the shell it left in the sandbox.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from console.models import AuditEvent
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.retention import apply_retention
from sandboxes.terminal import tickets as terminals
from tests.factories import make_config
from tests.personas import World


@pytest.mark.xfail(
    strict=True,
    reason="rev2: audit retention prunes the terminal.open row of a still-open terminal; the sweep "
    "then cannot find the sandbox to end the kept shell, and the open/close pair is broken",
)
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
