"""Who holds a terminal: an attachment lease in the database, shared by every console process.

A terminal's shell is kept by the sandbox (`keeper`), so any Daphne process may attach to it.
The process that holds a live websocket attachment writes itself into the Terminal row
(`holder`, `held_until`) and renews the lease while the connection lasts. A process whose
client dropped releases the lease and starts its grace window; when the window ends it closes
the terminal only if no other process holds a live lease (`claim_close`), else it just lets
go of its own PTY. Taking the lease and claiming the close lock the row, so a reattach through
another process and a grace expiry cannot both win.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from ..models import Terminal
from .tuning import TERMINAL

CLOSING = "closing:"  # the holder mark of a terminal whose close is under way
# How long a close may take (ending the kept shell is an exec of up to 20 s, then the PTY's
# kill): a closer that has not recorded the close by then was killed in between, and the
# close is anyone's again (the sweep's), so the terminal is never left open for ever.
CLOSE_BUDGET_S = 120.0


def lease_s() -> float:
    return float(max(TERMINAL.lease_s, 1))


def _live_other(row: Terminal, holder: str) -> bool:
    return bool(row.holder) and row.holder != holder and row.held_until is not None and row.held_until > timezone.now()


def _stale_close(row: Terminal) -> bool:
    """A close under way past its budget: its closer died before recording it."""
    return row.held_until is None or row.held_until <= timezone.now()


def take(terminal_id: str, holder: str) -> bool:
    """Make `holder` the one live attachment; False when the terminal is closed or closing."""
    with transaction.atomic():
        row = Terminal.objects.select_for_update().filter(pk=terminal_id).first()
        if row is None or row.closed is not None or row.holder.startswith(CLOSING):
            return False
        row.holder = holder
        row.held_until = timezone.now() + timedelta(seconds=lease_s())
        row.save(update_fields=["holder", "held_until"])
        return True


def renew(terminal_id: str, holder: str) -> bool:
    """Extend the lease; False when another process took the terminal over (or it closed)."""
    until = timezone.now() + timedelta(seconds=lease_s())
    return bool(Terminal.objects.filter(pk=terminal_id, holder=holder, closed__isnull=True).update(held_until=until))


def release(terminal_id: str, holder: str) -> None:
    """The holder's client went away: the lease runs on for the grace window only (not
    renewed), so any process may take the terminal, and once it runs out with nobody taking
    it the terminal is abandoned (`abandoned`, closed by the sweep)."""
    until = timezone.now() + timedelta(seconds=TERMINAL.reattach_s + lease_s())
    Terminal.objects.filter(pk=terminal_id, holder=holder, closed__isnull=True).update(held_until=until)


def claim_close(terminal_id: str, holder: str, *, force: bool) -> bool:
    """Become the one process that closes (and audits) the terminal.

    False when it is closed or closing already, or (unless `force`) when another process
    holds a live attachment: then only this process's own PTY ends."""
    with transaction.atomic():
        row = Terminal.objects.select_for_update().filter(pk=terminal_id).first()
        if row is None or row.closed is not None:
            return False
        if row.holder.startswith(CLOSING) and not _stale_close(row):
            return False
        if not force and not row.holder.startswith(CLOSING) and _live_other(row, holder):
            return False
        row.holder = (CLOSING + holder)[:100]
        row.held_until = timezone.now() + timedelta(seconds=CLOSE_BUDGET_S)
        row.save(update_fields=["holder", "held_until"])
        return True


def abandoned(margin_s: float = 0.0) -> list[Terminal]:
    """Open terminals whose lease ran out (plus `margin_s`): no process holds them or waits
    for them (its process stopped, or was killed in its grace window, or killed while closing
    it: a close's budget is in the same field)."""
    before = timezone.now() - timedelta(seconds=margin_s)
    return list(
        Terminal.objects.select_related("session__config", "session__space", "user")
        .filter(closed__isnull=True, opened__isnull=False)
        .filter(Q(held_until__lt=before) | Q(holder__startswith=CLOSING, held_until__isnull=True))
    )


def add_traffic(terminal_id: str, bytes_in: int, bytes_out: int) -> None:
    """Count one process's share of the terminal's traffic (several may serve one terminal)."""
    Terminal.objects.filter(pk=terminal_id).update(
        bytes_in=F("bytes_in") + bytes_in, bytes_out=F("bytes_out") + bytes_out
    )
