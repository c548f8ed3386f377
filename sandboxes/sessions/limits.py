"""Quotas and rate limits per space (console.models.SpaceLimits; docs/operations.md, "Quotas
and rate limits").

- live sessions: checked when a session is created, under a lock on the space's limits row,
  so concurrent creations never pass the quota together; a warm pool's ready (unclaimed)
  sandboxes count against the same quota (`pool_room`: a pool refills only into what the
  live sessions leave), and each new session takes one of them over;
- concurrent execs: one `ExecSlot` row per exec in flight, naming the process running it
  and with its own deadline, in one of the space's numbered places (unique per space), taken
  without a lock by one statement that also counts the exec in flight on its session
  (`take_exec_slot`; freed, and counted out, by one more: `release_exec_slot`); a process killed
  mid-exec frees its slots when it is found dead (`release_slots_of`, answering
  `console.signals.process_released`), at the latest when their deadlines pass;
- background commands: running `BackgroundCommand` rows of the space, checked before the
  sandbox is resumed and again, authoritatively, under the lock in the transaction that
  records the new command (a start that loses the race kills its process and is refused);
- API requests per minute per space (whichever of its tokens sent them): the calls of the
  last 60 s, estimated from fixed one-minute windows (this one's count and the one before's,
  weighted by its share still within the last 60 s), refused calls not counted; in Redis
  when REDIS_URL is set (every process shares it) and in this process otherwise (the
  embedded mode is one process).

A refusal raises `LimitExceeded` (a ServiceError, so pages show its message); the agent API
answers it with 429, `Retry-After` and a JSON error naming the limit.

Imports the console app and the sandboxes models; the runtime, lookup and commands call it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, When
from django.utils import timezone
from redis.exceptions import RedisError

from console.compiled import execute_planned
from console.models import Space, SpaceLimits
from console.processes import this_process
from console.services import ServiceError

from ..models import BackgroundCommand, CommandStatus, ExecSlot, MemberState, PoolMember, Session, SessionState
from .inflight import Count

# A quota that frees up only when something else ends has no natural wait; this is a hint.
QUOTA_RETRY_AFTER_S = 30
WINDOW_S = 60


class LimitExceeded(ServiceError):
    """A call refused by a space's quota or rate limit."""

    def __init__(self, limit: str, maximum: int, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.limit, self.maximum, self.retry_after_s = limit, maximum, max(int(retry_after_s), 1)


# The per-request rate check reads the limits from here: a changed limit is in force in
# every process within LIMITS_CACHE_S (the quota checks read the locked row, never this).
LIMITS_CACHE_S = 5.0
# Measured (bench/module_caches.py): a hit 2 us against the row read 913 us, on every API request.
_limits_cache: dict[Any, tuple[float, dict[str, int]]] = {}


def limits_of(space: Space, *, max_age_s: float = 0.0) -> dict[str, int]:
    """The space's limits as enforced (its own values, else the platform defaults)."""
    now = time.monotonic()
    cached = _limits_cache.get(space.pk)
    if max_age_s and cached is not None and now - cached[0] < max_age_s:
        return cached[1]
    row = SpaceLimits.objects.filter(space=space).first()
    limits = row.effective() if row is not None else SpaceLimits(space=space).effective()
    if len(_limits_cache) > 10_000:
        _limits_cache.clear()
    _limits_cache[space.pk] = (now, limits)
    return limits


def lock_limits(space: Space) -> dict[str, int]:
    """Lock the space's limits row for the current transaction and return the limits."""
    SpaceLimits.objects.get_or_create(space=space)
    return SpaceLimits.objects.select_for_update().get(space=space).effective()


def check_live_sessions(space: Space) -> None:
    """Inside the transaction that creates a session: refuse it past the quota."""
    maximum = lock_limits(space)["live_sessions"]
    live = Session.objects.filter(space=space).exclude(state=SessionState.GONE).count()
    if live >= maximum:
        raise LimitExceeded(
            "live_sessions",
            maximum,
            f"This space has {live} sessions, its quota of live sessions ({maximum}); "
            "delete a session or ask a platform admin to raise the quota.",
            retry_after_s=QUOTA_RETRY_AFTER_S,
        )


def pooled_unclaimed(space: Space) -> int:
    """The space's warm pool sandboxes not claimed by a session (ready, or being made)."""
    return PoolMember.objects.filter(space=space).exclude(state=MemberState.CLAIMED).count()


def _pool_headroom(space: Space) -> int:
    maximum = limits_of(space)["live_sessions"]
    live = Session.objects.filter(space=space).exclude(state=SessionState.GONE).count()
    return maximum - live - pooled_unclaimed(space)


def pool_room(space: Space) -> int:
    """How many more pooled sandboxes the space's quota of live sessions leaves room for:
    live sessions and unclaimed pooled sandboxes count together."""
    return max(0, _pool_headroom(space))


def pool_overflow(space: Space) -> int:
    """How many unclaimed pooled sandboxes are past the quota (a lowered quota, or sessions
    made without the pool): a refill drains that many."""
    return max(0, -_pool_headroom(space))


# An INSERT that lost its place to a racing one tries another this often before refusing.
SLOT_TRIES = 8
# One statement takes a free place (0 to limit - 1) of the space, or one whose deadline passed,
# and counts the exec in on its session row (the `Count` of inflight.py, run only when a place
# was taken); the unique (space, number) index decides between racing inserts: no lock is
# held across it. Execs running in places past a lowered limit count too: none is taken while
# the space runs as many as the limit (the count and the index agree once those have ended).
# Places are tried from a random one on (fewer races), generated lazily up to the first free.
_PLACES = "WITH RECURSIVE places(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM places WHERE i + 1 < %(limit)s)"
_INSERT_SLOT = """
INSERT INTO {table} (id, space_id, session_id, deadline, owner_process, number)
SELECT %(id)s, %(space)s, %(session)s, %(deadline)s, %(owner)s, (%(start)s + places.i) %% %(limit)s
FROM places
WHERE NOT EXISTS (
    SELECT 1 FROM {table} taken
    WHERE taken.space_id = %(space)s AND taken.number = (%(start)s + places.i) %% %(limit)s
    AND taken.deadline > %(now)s
)
AND (SELECT count(*) FROM {table} live WHERE live.space_id = %(space)s AND live.deadline > %(now)s) < %(limit)s
LIMIT 1
ON CONFLICT (space_id, number) DO UPDATE SET
    id = excluded.id, session_id = excluded.session_id, deadline = excluded.deadline,
    owner_process = excluded.owner_process
    WHERE {table}.deadline <= %(now)s
RETURNING number
"""
_DELETE_SLOT = "DELETE FROM {table} WHERE id = %(id)s"
_TAKE_SLOT = f"{_PLACES},\nslot AS ({_INSERT_SLOT}),\ncounted AS ({{count}})\nSELECT number FROM slot"
# Frees the slot and counts the exec out in one statement; true when this freed it. Counted
# out only if this freed it and its deadline had not passed: past it, the session's count
# started again without it (the rule `release_slots_of` keeps), and taking it off would
# discount a live call.
_FREE_SLOT = (
    f"WITH freed AS ({_DELETE_SLOT} RETURNING deadline),\ncounted AS ({{count}})\nSELECT EXISTS (SELECT 1 FROM freed)"  # noqa: S608 - constants only
)
_FREED_IN_TIME = "EXISTS (SELECT 1 FROM freed WHERE freed.deadline > %(now)s)"
# The same on SQLite, asked before the DELETE (in its transaction) while the slot is there.
_HELD_IN_TIME = "EXISTS (SELECT 1 FROM {table} WHERE id = %(id)s AND deadline > %(now)s)"
# SQLite runs no INSERT, UPDATE or DELETE inside WITH: there the slot's statement and the
# count are two statements in one transaction.
_TAKE_SLOT_ALONE = f"{_PLACES}\n{_INSERT_SLOT}"


def _db_value(field: str, value: Any) -> Any:
    return ExecSlot._meta.get_field(field).get_db_prep_value(value, connection)  # type: ignore[union-attr]


def _joined() -> bool:
    """Whether the slot and the count go in one statement (data-modifying WITH: PostgreSQL)."""
    return connection.vendor == "postgresql"


def take_exec_slot(space: Space, session: Session, deadline: datetime, count: Count | None = None) -> ExecSlot:
    """Count an exec in against the space's limit, or refuse it. Each exec holds one of the
    space's `concurrent_execs` places (a row, unique per space and place) with its own
    deadline, so one killed mid-exec stops counting when its deadline passes, however busy
    its session stays. No row lock: one statement per try (`_TAKE_SLOT`), which also runs
    `count` (the exec counted in flight on its session), if given, once a place is taken. The limit is
    read through the per-process cache (a changed limit is in force within LIMITS_CACHE_S);
    slots taken under a higher limit count against the lower one until they end."""
    maximum = limits_of(space, max_age_s=LIMITS_CACHE_S)["concurrent_execs"]
    slot = ExecSlot(space=space, session=session, deadline=deadline, owner_process=this_process())
    table = connection.ops.quote_name(ExecSlot._meta.db_table)
    params = {
        "limit": maximum,
        "id": _db_value("id", slot.pk),
        "space": _db_value("space", space.pk),
        "session": _db_value("session", session.pk),
        "deadline": _db_value("deadline", deadline),
        "owner": _db_value("owner_process", slot.owner_process),
        **(count.params if count is not None else {}),
    }
    for attempt in range(SLOT_TRIES if maximum > 0 else 0):
        params.update(now=_db_value("deadline", timezone.now()), start=random.randrange(maximum))  # noqa: S311
        taken = _take(table, params, count)
        if taken is not None:
            slot.number = taken[0]
            return slot
        if attempt == 0:
            # Full, or a racing insert won the place: forget the slots nobody will release
            # (past their deadline), then try again while the space has a free place.
            ExecSlot.objects.filter(space=space, deadline__lte=timezone.now()).delete()
        if _running_execs(space) >= maximum:
            break
    running = _running_execs(space)
    raise LimitExceeded(
        "concurrent_execs",
        maximum,
        f"{running} commands are running in this space, its limit of concurrent execs ({maximum}); "
        "retry when one has finished.",
        retry_after_s=5,
    )


def _take(table: str, params: dict[str, Any], count: Count | None) -> tuple[Any, ...] | None:
    if count is not None and _joined():
        with connection.cursor() as cursor:
            execute_planned(
                cursor, _TAKE_SLOT.format(table=table, count=count.sql("EXISTS (SELECT 1 FROM slot)")), params
            )
            return cursor.fetchone()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_TAKE_SLOT_ALONE.format(table=table), params)
        taken = cursor.fetchone()
        if taken is not None and count is not None:
            count.run()
        return taken


def _running_execs(space: Space) -> int:
    return ExecSlot.objects.filter(space=space, deadline__gt=timezone.now()).count()


def release_exec_slot(slot: ExecSlot, count: Count | None = None) -> bool:
    """Free the slot, and run `count` (the exec counted out of its session), if given, guarded
    by whether this freed it in time: False when it was freed already (its process was taken
    for dead, and its count lowered then); and an exec ending past its slot's deadline counts
    for nothing any more (`_FREE_SLOT`). Unguarded, the count changes nothing but the activity
    it records. One statement (PostgreSQL)."""
    table = connection.ops.quote_name(ExecSlot._meta.db_table)
    params = {
        "id": _db_value("id", slot.pk),
        "now": _db_value("deadline", timezone.now()),
        **(count.params if count is not None else {}),
    }
    if count is not None and _joined():
        with connection.cursor() as cursor:
            execute_planned(cursor, _FREE_SLOT.format(table=table, count=count.sql(_FREED_IN_TIME)), params)
            row = cursor.fetchone()
            return bool(row and row[0])
    with transaction.atomic(), connection.cursor() as cursor:
        if count is not None:
            cursor.execute(count.sql(_HELD_IN_TIME.format(table=table)), params)
        cursor.execute(_DELETE_SLOT.format(table=table), params)
        return bool(cursor.rowcount)


def release_slots_of(process_id: Any, **_: Any) -> str:
    """The exec slots of a dead process: freed, and each session's count of execs in flight
    lowered by its share, so neither the space's limit nor the idle sweep waits for execs
    nobody runs any more. Inside the transaction of `console.processes.release_process`."""
    # Locked, so an exec ending meanwhile cannot count itself out a second time.
    rows = ExecSlot.objects.select_for_update().filter(owner_process=process_id)
    slots = list(rows.values_list("pk", "session_id", "deadline"))
    if not slots:
        return ""
    ExecSlot.objects.filter(pk__in=[pk for pk, _, _ in slots]).delete()
    # A slot past its deadline no longer counts on its session either (its count expired
    # with it, and the next call started it again from itself): lowering the count for it
    # would discount a live call, and a pause could freeze the sandbox under that call.
    now = timezone.now()
    per_session = Counter(session_id for _, session_id, deadline in slots if deadline > now)
    for session_id, count in per_session.items():
        Session.objects.filter(pk=session_id).update(
            execs_in_flight=Case(When(execs_in_flight__gt=count, then=F("execs_in_flight") - count), default=0),
            exec_deadline=Case(When(execs_in_flight__gt=count, then=F("exec_deadline")), default=None),
        )
    return f"{len(slots)} exec slot(s) freed"


def check_background_commands(space: Space, *, locked: bool = False) -> None:
    """Refuse a background command past the space's limit. `locked=True` inside the
    transaction that records the command: the count and the insert then hold the space's
    limits lock together, so racing starts never pass the limit (the early check without
    it only spares a sandbox resume when the space is already full)."""
    if not locked:
        with transaction.atomic():
            check_background_commands(space, locked=True)
        return
    maximum = lock_limits(space)["background_commands"]
    running = BackgroundCommand.objects.filter(session__space=space, status=CommandStatus.RUNNING).count()
    if running >= maximum:
        raise LimitExceeded(
            "background_commands",
            maximum,
            f"{running} background commands are running in this space, its limit ({maximum}); "
            "kill one or wait for one to end.",
            retry_after_s=QUOTA_RETRY_AFTER_S,
        )


# --- API requests per minute, per space ------------------------------------------------------

# Without Redis, the per-minute counters live here (state, not a cache): counter -> (window,
# calls counted in it, calls counted in the window before it).
_local_windows: dict[str, tuple[int, int, int]] = {}
_local_lock = threading.Lock()
# Measured (bench/module_caches.py): a count on the kept client 134 us, on a new client 1,629 us.
_redis: dict[str, tuple[Any, Any]] = {}  # URL -> (client, its script counting a call)

# KEYS: the window before, this window. ARGV: the seconds of the one before still within the
# last minute, the window's seconds, the maximum, the keys' TTL. Counts the call unless it
# would not fit (`_fits`, the same sum); returns [counted, before, this one's].
_COUNT_CALL = """
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local window = tonumber(ARGV[2])
if before * tonumber(ARGV[1]) + (current + 1) * window > tonumber(ARGV[3]) * window then
  return {0, before, current}
end
current = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {1, before, current}
"""


def _fits(before: int, left: float, current: int, maximum: int) -> bool:
    """Whether one more call fits: the window before weighs `left` / WINDOW_S. Multiplied out
    rather than divided: `left` is exact (a difference of close times), so are these products
    and sums, and a client that waits Retry-After lands on the limit exactly, never a rounding
    above it."""
    return before * left + (current + 1) * WINDOW_S <= maximum * WINDOW_S


def _count_request(counter: str, window: int, left: float, maximum: int) -> tuple[bool, int, int, float]:
    """Count one call in `window` unless the calls of the last minute would pass `maximum`
    with it (the window before weighs `left` / WINDOW_S); whether it was counted, the counts of
    the window before and of this one, and `left` as weighed (in this process, a call timed
    before a turn that another already counted past counts at the start of the newer window:
    one window is kept, and forgetting it would let the limit through again). Refused calls
    are not counted."""
    if settings.REDIS_URL:
        kept = _redis.get(settings.REDIS_URL)
        if kept is None:
            import redis

            client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
            kept = _redis[settings.REDIS_URL] = (client, client.register_script(_COUNT_CALL))
        keys = [f"console:api-rate:{{{counter}}}:{w}" for w in (window - 1, window)]
        counted, before, current = kept[1](keys=keys, args=[repr(left), WINDOW_S, maximum, WINDOW_S * 2])
        return bool(counted), int(before), int(current), left
    with _local_lock:
        seen, current, before = _local_windows.get(counter, (window, 0, 0))
        if window < seen:  # timed before a turn another call already counted past (threads)
            window, left = seen, float(WINDOW_S)  # counted at the start of that newer window
        elif seen != window:
            current, before = 0, (current if seen == window - 1 else 0)
        counted = _fits(before, left, current, maximum)
        current += counted
        _local_windows[counter] = (window, current, before)
        if len(_local_windows) > 10_000:  # forget other spaces' old windows
            for stale in [k for k, (w, _, _) in _local_windows.items() if w < window - 1]:
                del _local_windows[stale]
        return counted, before, current, left


def _retry_after_s(left: float, before: int, current: int, maximum: int) -> int:
    """Whole seconds until one more call fits (`_fits`) if no other is counted meanwhile, at
    least one; `left`: the seconds left in this window."""
    if maximum <= 0:
        wait = left
    elif current < maximum:  # when the window before weighs little enough
        wait = left - (maximum - current - 1) * WINDOW_S / before
    else:  # in the next window, when this one weighs little enough
        wait = left + WINDOW_S - (maximum - 1) * WINDOW_S / current
    return max(1, math.ceil(wait))


def check_api_rate(space: Space, *, now: float | None = None) -> None:
    """Count one API request of the space (whichever of its tokens sent it); refuse it past
    the space's per-minute limit. Counted per space, not per token: a space admin may make
    tokens (up to limits.api_tokens_per_space), and each must not bring a limit of its own.

    The last minute's calls: this fixed minute's, and the minute before's weighted by the
    share of it still within the last 60 s (a fixed window alone lets twice the limit
    through around its turn). `now`: the time of the call (a test picks the turn)."""
    maximum = limits_of(space, max_age_s=LIMITS_CACHE_S)["api_requests_per_minute"]
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    left = WINDOW_S - (now - window * WINDOW_S)  # exact: both differences are of close numbers
    try:
        counted, before, current, left = _count_request(f"space:{space.pk}", window, left, maximum)
    except (OSError, RedisError):
        return  # a limiter that cannot count lets the call through rather than fail it
    if not counted:
        raise LimitExceeded(
            "api_requests_per_minute",
            maximum,
            f"This space's API tokens sent more than {maximum} requests in the last minute, the space's limit.",
            retry_after_s=_retry_after_s(left, before, current, maximum),
        )
