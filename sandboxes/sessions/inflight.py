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
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
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


@contextlib.contextmanager
def in_flight(
    session: Session,
    timeout_s: float | None = None,
    *,
    activity: bool = True,
    still_counted: Callable[[], bool] | None = None,
    counting: Callable[[], object] | None = None,
) -> Iterator[None]:
    """Count one call on the session's row for its duration (see the module docstring).

    A call that starts while a guarded pause holds the row waits here until the pause is done.
    `activity=False` (a read that may not wake the session): its end does not restart the
    session's idle clock. `still_counted`, called at the end: False when the call was taken
    off the count meanwhile (its process was released as dead, `limits.release_slots_of`),
    so it does not take itself off a second time. `counting`: called in the same transaction
    as the count (an exec takes its slot there); what it raises refuses the call uncounted.
    """
    now = timezone.now()
    until = now + timedelta(seconds=timeout_s or SHORT_CALL_S) + GRACE
    with quick_commit():
        if counting is not None:
            counting()
        # Past the deadline every counted call is dead (its process was killed before its
        # `finally`): start the count again rather than carry them for ever.
        _update(_count_in_sql(), [_when(now), _when(now), _when(until), _when(until), session.pk])
    try:
        yield
    finally:
        # Its end is activity too: the idle clock starts again from here. The last one out
        # clears the deadline, so a long timeout does not outlive its call.
        ended = timezone.now() if activity else None
        with quick_commit():
            if still_counted is None or still_counted():
                _update(_count_out_sql(activity), [*([_when(ended)] if activity else []), session.pk])
            else:
                _quick_commit_off()  # the count's statement, which says it too, does not run
                if ended:
                    Session.objects.filter(pk=session.pk).update(last_activity=ended)


@contextlib.contextmanager
def quick_commit() -> Iterator[None]:
    """One transaction for the in-flight bookkeeping, whose commit does not wait for the disk
    (PostgreSQL's synchronous_commit off: one write less to wait for per call). A database
    crash may lose the last such commits, which is harmless: each count and slot carries its
    own deadline, past which it no longer counts."""
    with transaction.atomic():
        yield  # each side's count statement switches it off (_QUICK): no round trip of its own


def _quick_commit_off() -> None:
    if _quick_commits():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def _quick() -> str:
    """A FROM item that switches synchronous_commit off for the transaction (PostgreSQL;
    set_config(…, true) is SET LOCAL) inside the count's own statement."""
    return " FROM (SELECT set_config('synchronous_commit', 'off', true)) AS quick" if _quick_commits() else ""


def _quick_commits() -> bool:
    return connection.vendor == "postgresql"


# ruff: noqa: S608 - the only interpolations are the quoted table name; values are parameters
# The two row updates of every counted call, written once (the ORM's Case/When took a
# millisecond or more to build on each call). Both SET expressions read the row as it was.
def _count_in_sql() -> str:
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    return (
        f"UPDATE {_table()} SET"
        " execs_in_flight = CASE WHEN exec_deadline IS NULL OR exec_deadline <= %s THEN 1"
        " ELSE execs_in_flight + 1 END,"
        " exec_deadline = CASE WHEN exec_deadline IS NULL OR exec_deadline <= %s THEN %s"
        f" ELSE {greatest}(exec_deadline, %s) END"
        f"{_quick()} WHERE id = %s"
    )


def _count_out_sql(activity: bool) -> str:
    return (
        f"UPDATE {_table()} SET"
        " execs_in_flight = CASE WHEN execs_in_flight > 0 THEN execs_in_flight - 1 ELSE 0 END,"
        " exec_deadline = CASE WHEN execs_in_flight <= 1 THEN NULL ELSE exec_deadline END"
        + (", last_activity = %s" if activity else "")
        + f"{_quick()} WHERE id = %s"
    )


def _table() -> str:
    return connection.ops.quote_name(Session._meta.db_table)


def _when(value: datetime | None) -> Any:
    return Session._meta.get_field("exec_deadline").get_db_prep_value(value, connection)


def _update(sql: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, [_pk(p) if isinstance(p, uuid.UUID) else p for p in params])


def _pk(value: uuid.UUID) -> Any:
    return Session._meta.get_field("id").get_db_prep_value(value, connection)
