"""What is in flight in a session: the one meaning the idle sweep, the guarded pause and the
stale rebuild's wait all read.

In flight means any of:

- engine work counted on the session's row (`execs_in_flight`, trusted until
  `exec_deadline`): API and UI execs (`Runtime.exec`), file operations, the opening of a
  background command's or a terminal's shell — everything that makes the engine start a
  process in the sandbox, which is what races a freeze (docker/for-linux#891);
- a background command still running;
- an open terminal (its shell takes keystrokes at any time).

`in_flight()` counts a call on the row; `quiet_sessions()` is the query of sessions with
nothing in flight; `busy_reason()` says in words what is.

Counting is a row update: the guarded pause holds the same row locked (by a conditional
update) while it freezes the sandbox, so a call that counts itself meanwhile waits for the
pause to be done and then resumes the sandbox, and a pause that finds a call counted refuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Case, Exists, F, OuterRef, Q, QuerySet, When
from django.utils import timezone

from ..models import BackgroundCommand, CommandStatus, Session, Terminal

# How long past its own timeout a counted call still counts (a process that died mid-call).
GRACE = timedelta(seconds=60)
# The count's trust for calls without a timeout of their own (file operations, shell opens).
SHORT_CALL_S = 120


def _running_command() -> Exists:
    return Exists(BackgroundCommand.objects.filter(session=OuterRef("pk"), status=CommandStatus.RUNNING))


def _open_terminal() -> Exists:
    # Opened and not closed: a ticket never redeemed holds no shell.
    return Exists(Terminal.objects.filter(session=OuterRef("pk"), opened__isnull=False, closed__isnull=True))


def _counted(now: datetime) -> Q:
    return Q(execs_in_flight__gt=0, exec_deadline__gt=now)


def quiet_sessions(now: datetime | None = None) -> QuerySet[Session]:
    """Sessions with nothing in flight: no counted call, no running command, no open terminal."""
    now = now or timezone.now()
    return Session.objects.exclude(_counted(now)).exclude(_running_command()).exclude(_open_terminal())


def busy_reason(session_pk: Any, now: datetime | None = None, *, own_calls: int = 0) -> str | None:
    """What is in flight in the session, in words; None when nothing is. `own_calls`: calls
    the asker counted itself (an exec resolving its session) that do not count against it."""
    now = now or timezone.now()
    row = (
        Session.objects.filter(pk=session_pk)
        .annotate(counted=Case(When(_counted(now), then=F("execs_in_flight")), default=0))
        .annotate(command=_running_command(), terminal=_open_terminal())
        .values("counted", "command", "terminal")
        .first()
    )
    if row is None:
        return None
    reasons = []
    if row["counted"] > own_calls:
        n = row["counted"] - own_calls
        reasons.append(f"{n} command{'s' if n != 1 else ''} or file operation{'s' if n != 1 else ''} running")
    if row["command"]:
        reasons.append("a background command running")
    if row["terminal"]:
        reasons.append("a terminal open")
    return ", ".join(reasons) or None


@dataclass(frozen=True)
class Count:
    """One side of a call's count on its session row: a single UPDATE with named parameters,
    run alone (one statement: atomic by itself, no transaction of its own to open and commit)
    or inside an exec slot's statement (`limits`), guarded by `cond` — an SQL condition on
    what that statement did (its slot taken, or freed)."""

    template: str
    params: dict[str, Any]

    def sql(self, cond: str = "TRUE") -> str:
        return self.template.replace("{cond}", cond)

    def run(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(self.sql(), self.params)


@contextlib.contextmanager
def in_flight(
    session: Session,
    timeout_s: float | None = None,
    *,
    activity: bool = True,
    counting: Callable[[Count], object] | None = None,
    ending: Callable[[Count], object] | None = None,
) -> Iterator[None]:
    """Count one call on the session's row for its duration (see the module docstring).

    A call that starts while a guarded pause holds the row waits here until the pause is done.
    `activity=False` (a read that may not wake the session): its end does not restart the
    session's idle clock. `counting` runs the count in with what it does itself (an exec takes
    its slot), in one statement; what it raises refuses the call uncounted. `ending` runs the
    count out with what it does (an exec frees its slot: only a slot still held, and within its
    deadline, counts out — one released with its process, taken for dead, was counted out
    then, `limits.release_slots_of`; past its deadline the count started again without it).
    """
    now = timezone.now()
    until = now + timedelta(seconds=timeout_s or SHORT_CALL_S) + GRACE
    count_in = Count(
        _count_in_sql(), {"count_now": _when(now), "count_until": _when(until), "count_id": _pk(session.pk)}
    )
    if counting is None:
        count_in.run()
    else:
        counting(count_in)
    try:
        yield
    finally:
        # Its end is activity too: the idle clock starts again from here. The last one out
        # clears the deadline, so a long timeout does not outlive its call.
        params = {"count_id": _pk(session.pk), **({"count_ended": _when(timezone.now())} if activity else {})}
        count_out = Count(_count_out_sql(activity), params)
        if ending is None:
            count_out.run()
        else:
            ending(count_out)


def _quick() -> str:
    """A FROM item that switches synchronous_commit off for the statement's transaction
    (PostgreSQL; set_config(…, true) is SET LOCAL): its commit does not wait for the disk, one
    write less to wait for per call. A database crash may lose the last such commits, which is
    harmless: each count and slot carries its own deadline, past which it no longer counts."""
    return " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS quick" if _quick_commits() else ""


def _quick_commits() -> bool:
    return connection.vendor == "postgresql"


# ruff: noqa: S608 - the only interpolations are the quoted table name; values are parameters
# The two row updates of every counted call, written once (the ORM's Case/When took a
# millisecond or more to build on each call). Both SET expressions read the row as it was.
# Past the deadline every counted call is dead (its process was killed before its `finally`):
# the count starts again rather than carry them for ever.
def _count_in_sql() -> str:
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    return (
        f"UPDATE {_table()} SET"
        " execs_in_flight = CASE WHEN exec_deadline IS NULL OR exec_deadline <= %(count_now)s THEN 1"
        " ELSE execs_in_flight + 1 END,"
        " exec_deadline = CASE WHEN exec_deadline IS NULL OR exec_deadline <= %(count_now)s THEN %(count_until)s"
        f" ELSE {greatest}(exec_deadline, %(count_until)s) END"
        f"{_quick()} WHERE id = %(count_id)s AND {{cond}}"
    )


def _count_out_sql(activity: bool) -> str:
    return (
        f"UPDATE {_table()} SET"
        " execs_in_flight = CASE WHEN NOT ({cond}) THEN execs_in_flight"
        " WHEN execs_in_flight > 0 THEN execs_in_flight - 1 ELSE 0 END,"
        " exec_deadline = CASE WHEN NOT ({cond}) THEN exec_deadline"
        " WHEN execs_in_flight <= 1 THEN NULL ELSE exec_deadline END"
        + (", last_activity = %(count_ended)s" if activity else "")
        + f"{_quick()} WHERE id = %(count_id)s"
    )


def _table() -> str:
    return connection.ops.quote_name(Session._meta.db_table)


def _when(value: datetime | None) -> Any:
    return Session._meta.get_field("exec_deadline").get_db_prep_value(value, connection)


def _pk(value: Any) -> Any:
    return Session._meta.get_field("id").get_db_prep_value(value, connection)
