"""Closing terminals that no console process holds any more (a periodic task).

A process that held a terminal and stopped (a replica's restart lets kept shells go so their
clients reconnect elsewhere) or was killed leaves the row open and the tmux session running
in the sandbox. Once the lease has run out (the grace window included) and nobody took the
terminal again, this closes it: it wins `attachments.claim_close` like any process, kills the
kept shell in the sandbox its last shell started in (`Terminal.sandbox_id`, on the row: the
audit rows may be past their retention; never resuming a sandbox for it), and records the
one close of the terminal.
"""

from __future__ import annotations

import logging

from console.periodic import periodic

from ..catalog.bridge import get_backend
from . import attachments, keeper
from .shells import record_close
from .tickets import Grant

logger = logging.getLogger(__name__)

SWEEPER = "sweep"
ABANDONED = "abandoned: no console process held it within the grace window"
MARGIN_S = 5.0


@periodic("terminal-sweep", task="sandboxes.terminal_sweep", every=60)
def close_abandoned() -> int:
    """Close every abandoned terminal; returns how many this pass closed."""
    closed = 0
    for terminal in attachments.abandoned(MARGIN_S):
        terminal_id = str(terminal.pk)
        if not attachments.claim_close(terminal_id, SWEEPER, force=False):
            continue
        sandbox_id = terminal.sandbox_id  # on the row: its audit rows may be past their retention
        if sandbox_id:
            try:
                keeper.end(get_backend(terminal.session.config), sandbox_id, terminal_id)
            except Exception:  # the sandbox or its backend is gone: so is the shell
                logger.info("terminal %s: ending its kept shell failed", terminal_id, exc_info=True)
        grant = Grant(
            terminal_id, str(terminal.session_id), str(terminal.session.space_id), terminal.user_id, terminal.read_only
        )
        record_close(grant, terminal.user, None, ABANDONED, {"bytes_in": 0, "bytes_out": 0})
        logger.info("terminal %s: closed (abandoned)", terminal_id)
        closed += 1
    return closed
