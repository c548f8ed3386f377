"""Review (revdeny): the retention pass decides which `terminal.open` rows to keep with one
cutoff and deletes aged audit rows with another, taken later (the periodic pass gives no
`now`: each step asks the clock). An open audit that ages between the two — the pass's first
step took a while, here because another transaction holds the terminals table — is in
neither: not kept, yet deleted, though its terminal is still open.

Real PostgreSQL: the second transaction is a connection of its own, holding a table lock.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from console.models import AuditEvent
from sandboxes.models import SandboxConfig, Terminal
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.retention import apply_retention
from sandboxes.terminal import shells as terminal_shells
from sandboxes.terminal import tickets as terminals
from tests.factories import make_config
from tests.personas import World
from tests.support.tuning import Tuned

HOLD_S = 1.5


def _open(world: World, key: str) -> Terminal:
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
    long_open = _open(world, "long-open")  # aged already: the pass checks its terminal
    AuditEvent.objects.filter(action="terminal.open", target_id=str(long_open.pk)).update(time=timezone.now() - 2 * day)
    ageing = _open(world, "ageing")
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
