"""The database session store: bindings, lifecycle locks and turn leases in SQL tables.

The embedded default (and any deployment without Redis): SQLite on the defaults, PostgreSQL
works too. It keeps the semantics of `RedisSessionStore` with single SQL statements, never a
read followed by a write, so two processes (or threads) racing on one key are decided by the
database itself:

- insert-if-absent: `INSERT ... ON CONFLICT (key) DO NOTHING`; the row count says who won;
- compare-and-delete: `DELETE ... WHERE key = ? AND value = ?`;
- leased lock: an upsert that replaces the row only when its lease has run out, renewal and
  release conditional on the token (and, for renewal, on the lease not having run out);
- one-shot ticket: `UPDATE ... SET value = 'used' WHERE value = 'ticket' AND <not expired>`.

Leases are wall-clock milliseconds (`expires_ms`), written by the processes themselves, so
the console's hosts need synchronised clocks (NTP) when several share one PostgreSQL.

Statements run in autocommit on the caller's connection for `alias`; the runtime never holds
a transaction open around them, so a lock row is visible to every process the moment it is
written. On PostgreSQL each is prepared once per database session
(`console.compiled.execute_planned`): the warm path's read is one round trip, with no planning.
Tables: `SessionBinding` and `SessionLease` (sandboxes.models).
"""

# ruff: noqa: S608 - the only interpolations are quoted table/column names; values are parameters

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from console.compiled import execute_planned

from .store import (
    TICKET_UNUSED,
    TICKET_USED,
    Binding,
    ReadWith,
    SessionStoreUnavailable,
    T,
    TurnLease,
    log_binding_write,
    read_after,
)

# Keys per `IN (...)` of a batched read (SQLite's variable limit is 32766 on 3.32+; stay modest).
BATCH = 500


def _now_ms() -> int:
    return int(time.time() * 1000)


class DatabaseSessionStore:
    """Bindings, locks and turn leases in the console's own database."""

    name = "database"

    def __init__(self, alias: str = DEFAULT_DB_ALIAS) -> None:
        from ..models import SessionBinding, SessionLease

        self.alias = alias
        quote = connections[alias].ops.quote_name
        self._bindings = quote(SessionBinding._meta.db_table)
        self._leases = quote(SessionLease._meta.db_table)
        self._k, self._v, self._e = quote("key"), quote("value"), quote("expires_ms")
        b, l, k, v, e = self._bindings, self._leases, self._k, self._v, self._e  # noqa: E741
        self._sql = {
            "get_binding": f"SELECT {v} FROM {b} WHERE {k} = %s",
            "set_binding": f"INSERT INTO {b} ({k}, {v}) VALUES (%s, %s) ON CONFLICT ({k}) DO NOTHING",
            "delete_binding": f"DELETE FROM {b} WHERE {k} = %s AND {v} = %s",
            "acquire": (
                f"INSERT INTO {l} ({k}, {v}, {e}) VALUES (%s, %s, %s) ON CONFLICT ({k}) DO UPDATE"
                f" SET {v} = excluded.{v}, {e} = excluded.{e}"
                f" WHERE {l}.{e} IS NOT NULL AND {l}.{e} <= %s"
            ),
            "renew": f"UPDATE {l} SET {e} = %s WHERE {k} = %s AND {v} = %s AND {e} > %s",
            "release": f"DELETE FROM {l} WHERE {k} = %s AND {v} = %s",
            "lease": f"SELECT {v}, {e} FROM {l} WHERE {k} = %s AND ({e} IS NULL OR {e} > %s)",
            "begin_turn": (
                f"INSERT INTO {l} ({k}, {v}, {e}) VALUES (%s, %s, %s) ON CONFLICT ({k}) DO UPDATE"
                f" SET {v} = excluded.{v}, {e} = excluded.{e}"
            ),
            "consume": f"UPDATE {l} SET {v} = %s WHERE {k} = %s AND {v} = %s AND ({e} IS NULL OR {e} > %s)",
            "end_turn": f"DELETE FROM {l} WHERE {k} = %s",
            # The warm path: binding and turn lease in one round trip.
            "read_session": (
                f"SELECT 0, {v}, NULL FROM {b} WHERE {k} = %s"
                f" UNION ALL SELECT 1, {v}, {e} FROM {l} WHERE {k} = %s AND ({e} IS NULL OR {e} > %s)"
            ),
            "purge": f"DELETE FROM {l} WHERE {e} IS NOT NULL AND {e} <= %s",
        }
        # The binding and the turn lease as columns of the session's own statement (the warm
        # path: `read_session_with`), given the binding key, then the turn key twice.
        self._columns = {
            "store_binding": f"SELECT {v} FROM {b} WHERE {k} = %s",
            "store_turn": f"SELECT {v} FROM {l} WHERE {k} = %s",
            "store_turn_expires_ms": f"SELECT {e} FROM {l} WHERE {k} = %s",
        }

    @contextmanager
    def _cursor(self, what: str) -> Iterator[Any]:
        try:
            with connections[self.alias].cursor() as cursor:
                yield cursor
        except DatabaseError as exc:
            # An IntegrityError never reaches here (ON CONFLICT), so this is the database
            # not answering or refusing: nothing was decided.
            raise SessionStoreUnavailable(f"{what}: {exc}") from exc

    def _execute(self, what: str, statement: str, params: Iterable[object]) -> int:
        with self._cursor(what) as cursor:
            execute_planned(cursor, self._sql[statement], list(params))
            return int(cursor.rowcount)

    def _fetch(self, what: str, statement: str, params: Iterable[object]) -> list[tuple[Any, ...]]:
        with self._cursor(what) as cursor:
            execute_planned(cursor, self._sql[statement], list(params))
            return list(cursor.fetchall())

    # Bindings ---------------------------------------------------------------------------

    def get_binding(self, key: str) -> Binding | None:
        rows = self._fetch("reading the binding", "get_binding", [key])
        return Binding.from_json(rows[0][0]) if rows else None

    def get_bindings(self, keys: Iterable[str]) -> dict[str, Binding]:
        wanted = list(dict.fromkeys(keys))
        found: dict[str, Binding] = {}
        for start in range(0, len(wanted), BATCH):
            chunk = wanted[start : start + BATCH]
            marks = ", ".join(["%s"] * len(chunk))
            sql = f"SELECT {self._k}, {self._v} FROM {self._bindings} WHERE {self._k} IN ({marks})"
            with self._cursor("reading bindings") as cursor:
                cursor.execute(sql, chunk)
                found.update((key, Binding.from_json(value)) for key, value in cursor.fetchall())
        return found

    def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
        written = self._execute("writing the binding", "set_binding", [key, binding.to_json()]) == 1
        log_binding_write("bind", key, binding, written, self.name)
        return written

    def delete_binding_if(self, key: str, expected: Binding) -> bool:
        # Bindings are written by `to_json` only (sorted keys), so equal bindings are equal text.
        removed = self._execute("removing the binding", "delete_binding", [key, expected.to_json()]) == 1
        log_binding_write("unbind", key, expected, removed, self.name)
        return removed

    # Lifecycle locks --------------------------------------------------------------------

    def acquire_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        now = _now_ms()
        return self._execute("taking the lifecycle lock", "acquire", [key, token, now + ttl_ms, now]) == 1

    def renew_lock(self, key: str, token: str, ttl_ms: int) -> bool:
        now = _now_ms()
        return self._execute("renewing the lifecycle lock", "renew", [now + ttl_ms, key, token, now]) == 1

    def release_lock(self, key: str, token: str) -> bool:
        return self._execute("releasing the lifecycle lock", "release", [key, token]) == 1

    def lock_holder(self, key: str) -> str | None:
        rows = self._fetch("reading the lifecycle lock", "lease", [key, _now_ms()])
        return str(rows[0][0]) if rows else None

    # Turn leases ------------------------------------------------------------------------

    def begin_turn(self, key: str, ttl_s: int) -> None:
        self._execute("starting the turn", "begin_turn", [key, TICKET_UNUSED, _now_ms() + ttl_s * 1000])

    def consume_ticket(self, key: str) -> bool:
        params = [TICKET_USED, key, TICKET_UNUSED, _now_ms()]
        return self._execute("consuming the rebuild ticket", "consume", params) == 1

    @staticmethod
    def _lease(value: str | None, expires_ms: int | None, now: int) -> TurnLease:
        if value is None:
            return TurnLease(in_flight=False, ticket_unused=False)
        ttl = None if expires_ms is None else max(0, (int(expires_ms) - now) // 1000)
        return TurnLease(in_flight=True, ticket_unused=value == TICKET_UNUSED, ttl_s=ttl)

    def turn_lease(self, key: str) -> TurnLease:
        now = _now_ms()
        rows = self._fetch("reading the turn lease", "lease", [key, now])
        return self._lease(rows[0][0], rows[0][1], now) if rows else self._lease(None, None, now)

    def end_turn(self, key: str) -> None:
        self._execute("ending the turn", "end_turn", [key])

    def read_session(self, binding_key: str, turn_key: str) -> tuple[Binding | None, TurnLease]:
        """The binding and the turn lease in one query (the warm resolve path)."""
        now = _now_ms()
        binding: Binding | None = None
        lease = TurnLease(in_flight=False, ticket_unused=False)
        for which, value, expires_ms in self._fetch(
            "reading the session", "read_session", [binding_key, turn_key, now]
        ):
            if int(which) == 0:
                binding = Binding.from_json(value)
            else:
                lease = self._lease(value, expires_ms, now)
        return binding, lease

    def read_session_with(self, binding_key: str, turn_key: str, other: Callable[[], T]) -> ReadWith[T]:
        """With the session's row (`lookup.SessionRow` in this store's database): one statement
        reads the row, the binding and the turn lease. Any other: one after the other."""
        with_columns = getattr(other, "with_columns", None)
        if with_columns is None or getattr(other, "db", None) != self.alias:
            return read_after(self, binding_key, turn_key, other)
        now = _now_ms()
        found: tuple[T, list[Any]] = with_columns(self._columns, [binding_key, turn_key, turn_key])
        row, values = found
        if not values:
            return row, None  # no session: nothing was read beside it
        raw_binding, turn, expires_ms = values
        if expires_ms is not None and int(expires_ms) <= now:  # as the "lease" statement's WHERE
            turn = None
        binding = Binding.from_json(raw_binding) if raw_binding is not None else None
        return row, (binding, self._lease(turn, expires_ms, now))

    # Housekeeping -----------------------------------------------------------------------

    def purge_expired(self) -> int:
        """Drop run-out locks and turn leases (they are ignored anyway; this keeps the table small)."""
        return self._execute("purging expired leases", "purge", [_now_ms()])
