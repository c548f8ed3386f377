"""A query the ORM compiles once per database connection and runs many times.

For readers tuning a hot path. Compiling a joined queryset costs more than running it:
`Session.objects.select_related("config__backend").get(space_id=..., key=...)` took 1.13 ms,
0.46 ms of it compiling, against 0.37 ms for its SQL alone (2026-12-02, PostgreSQL, measured
beside bench/session_resolve.py). `Compiled.first(*values)` keeps what the ORM made for the
connection — its SQL, its converters, its row-to-object mapping — and runs it again with new
values: the same objects `.filter(...).first()` gives, with no hand-written SQL.

Only equality filters on the named fields. The cache is per connection (a connection is one
thread's), so nothing is shared between threads and a closed connection drops its entry.

On PostgreSQL the server's share is cut too (`execute_planned`): the statement is prepared
once per database session (`PREPARE`), then run as `EXECUTE` with the new values. Planning the
warm path's session lookup (three tables joined) took 0.12-0.17 ms of its 0.33 ms; executed
prepared it took 0.12 ms in all (2026-12-02). Django keeps psycopg's own prepared statements
off (for poolers that hand each transaction another server session), so this is done in SQL,
only in autocommit, and given up for the database when a prepared statement does not last
from one statement to the next (such a pooler): then the plain statement runs, as before.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.query import get_related_populators

M = TypeVar("M", bound=Model)

logger = logging.getLogger(__name__)

# Names of the statements prepared on each server session (psycopg's connection object: a
# pooled one keeps its statements when it goes back to the pool and comes out again).
_prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
# Databases (aliases) whose sessions keep no prepared statement: run plain from then on.
_unprepared: set[str] = set()
# Statements PostgreSQL would not prepare: run plain.
_unpreparable: set[str] = set()
_PLACEHOLDER = re.compile(r"%([s%])")
# PostgreSQL's "prepared statement does not exist", and "... already exists".
_NO_SUCH_STATEMENT, _ALREADY_PREPARED = "26000", "42P05"
# "cached plan must not change result type": a table the statement reads was altered (a
# migration) since it was prepared; the statement fails on every EXECUTE until deallocated.
_RESULT_TYPE_CHANGED = "0A000"
# Class 42 (syntax error or access rule violation): PREPARE refused the text itself.
_STATEMENT_REFUSED = "42"


def _numbered(sql: str) -> str:
    """`%s` placeholders as `$1, $2, ...` (and `%%` as `%`), for PREPARE."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(1) == "%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(number, sql)


_NAMED = re.compile(r"%\((\w+)\)s")


def _positional(sql: str, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`%(name)s` placeholders as `%s`, and their values in that order (a name used twice, twice)."""
    values = [params[name] for name in _NAMED.findall(sql)]
    return _NAMED.sub("%s", sql), values


@functools.cache
def _name(sql: str) -> str:
    return "console_" + hashlib.sha256(sql.encode()).hexdigest()[:24]


def _sqlstate(exc: DatabaseError) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def _deallocate(cursor: CursorWrapper, name: str) -> None:
    try:
        cursor.execute(f"DEALLOCATE {name}")
    except DatabaseError as exc:
        if _sqlstate(exc) != _NO_SUCH_STATEMENT:  # a pooler's other server session
            raise


def execute_planned(cursor: CursorWrapper, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> None:
    """`cursor.execute(sql, params)`, planned once per PostgreSQL session: the first call on a
    session prepares `sql`, every call executes the prepared statement. Anywhere else (SQLite,
    inside a transaction, a database whose sessions keep no prepared statement): as it is.
    The statement's name is its text's digest, so two texts never share a name. Named
    parameters (`%(name)s` with a mapping) are taken in the order they appear."""
    if isinstance(params, Mapping):
        sql, params = _positional(sql, params)
    connection = cursor.db
    name = _name(sql)
    if (
        connection.vendor != "postgresql"
        or connection.in_atomic_block
        or connection.alias in _unprepared
        or name in _unpreparable
    ):
        cursor.execute(sql, params)
        return
    names = _prepared.setdefault(connection.connection, set())
    call = f"EXECUTE {name}({', '.join(['%s'] * len(params))})" if params else f"EXECUTE {name}"
    for attempt in range(2):
        if name not in names:
            try:
                cursor.execute(f"PREPARE {name} AS {_numbered(sql)}")
            except DatabaseError as exc:
                state = _sqlstate(exc)
                if state != _ALREADY_PREPARED:
                    if state is not None and state.startswith(_STATEMENT_REFUSED):
                        # The text itself (a parameter's type left open, say): for good.
                        logger.warning("statement %s not prepared (%s): planned at each call", name, exc)
                        _unpreparable.add(name)
                    # Else a passing failure (a lock timeout, a lost connection): prepared
                    # at the next call; this one fares as the plain statement does.
                    cursor.execute(sql, params)
                    return
            names.add(name)
        try:
            cursor.execute(call, params)
            return
        except DatabaseError as exc:
            state = _sqlstate(exc)
            if state == _RESULT_TYPE_CHANGED and attempt == 0:
                _deallocate(cursor, name)  # planned again for the table as it is now
            elif state != _NO_SUCH_STATEMENT:
                raise
            names.discard(name)  # gone from the session (DISCARD ALL): prepared again once
    logger.warning(
        "database %s keeps no prepared statement from one statement to the next (a pooler in"
        " transaction mode?): hot-path statements are planned at each call from now on",
        connection.alias,
    )
    _unprepared.add(connection.alias)
    cursor.execute(sql, params)


@dataclass(frozen=True)
class _Plan:
    sql: str
    order: tuple[int, ...]  # compiled parameter i is the value at order[i]
    converters: dict[int, Any]
    init_list: list[str]
    start: int
    end: int
    populators: list[Any]
    columns: tuple[tuple[str, int], ...]  # the more columns: (name, position in the row)


class Compiled(Generic[M]):
    """`queryset.filter(field=value, ...).first()` for the named fields, compiled once per
    connection. The lookup must match one row at most (a unique key): no ORDER BY is kept.

    `columns`: more columns read with the row, each a name and an SQL expression (a scalar
    subquery, say) whose `%s` take `first`'s `column_params`, in order; each is set on the
    object under its name (as `QuerySet.extra(select=...)` does)."""

    def __init__(self, queryset: QuerySet[M], *fields: str, columns: Mapping[str, str] | None = None) -> None:
        self.queryset = queryset
        self.fields = fields
        self.columns = dict(columns or {})
        self._plans: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Plan] = weakref.WeakKeyDictionary()

    def _filtered(self, values: Sequence[Any], column_params: Sequence[Any]) -> QuerySet[M]:
        queryset = self.queryset.filter(**dict(zip(self.fields, values, strict=True)))
        if self.columns:
            # The SQL is the caller's own constant text; the values are parameters.
            queryset = queryset.extra(select=self.columns, select_params=list(column_params))  # noqa: S610
        return queryset

    def first(self, *values: Any, column_params: Sequence[Any] = ()) -> M | None:
        using = self.queryset.db
        connection = connections[using]
        prepared = self._prepare(connection, values)
        plan = self._plans.get(connection)
        if plan is None:
            plan = self._plan(connection, values, prepared, column_params)
            if plan is None:  # two values alike: which parameter is which cannot be told
                return self._filtered(values, column_params).first()
            self._plans[connection] = plan
        with connection.cursor() as cursor:
            execute_planned(cursor, plan.sql, [*column_params, *(prepared[i] for i in plan.order)])
            row = cursor.fetchone()
        if row is None:
            return None
        if plan.converters:  # as SQLCompiler.apply_converters does
            row = list(row)
            for position, (converters, expression) in plan.converters.items():
                value = row[position]
                for converter in converters:
                    value = converter(value, expression, connection)
                row[position] = value
        obj = self.queryset.model.from_db(using, plan.init_list, row[plan.start : plan.end])
        for populator in plan.populators:
            populator.populate(row, obj)
        for name, position in plan.columns:
            setattr(obj, name, row[position])
        return obj

    def _prepare(self, connection: BaseDatabaseWrapper, values: Sequence[Any]) -> list[Any]:
        meta = self.queryset.model._meta
        return [
            cast("Field[Any, Any]", meta.get_field(name)).get_db_prep_value(value, connection)
            for name, value in zip(self.fields, values, strict=True)
        ]

    def _plan(
        self, connection: BaseDatabaseWrapper, values: Sequence[Any], prepared: list[Any], column_params: Sequence[Any]
    ) -> _Plan | None:
        if len({repr(value) for value in prepared}) != len(prepared):
            return None
        # One row at most: the model's default ordering would only cost a sort.
        queryset = self._filtered(values, column_params).order_by()
        compiler = queryset.query.get_compiler(connection=connection)
        sql, params = compiler.as_sql()
        # The more columns come first in the SELECT list, so do their parameters.
        head, params = params[: len(column_params)], params[len(column_params) :]
        if [repr(param) for param in head] != [repr(param) for param in column_params]:
            return None
        reprs = [repr(value) for value in prepared]
        if sorted(repr(param) for param in params) != sorted(reprs):
            return None  # the ORM added parameters of its own: not a shape this class keeps
        select, klass_info = compiler.select, compiler.klass_info
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        fields = [column[0] for column in select[: compiler.col_count]]
        return _Plan(
            sql=sql,
            order=tuple(reprs.index(repr(param)) for param in params),
            converters=compiler.get_converters(fields),
            init_list=[column[0].target.attname for column in select[start:end]],
            start=start,
            end=end,
            populators=get_related_populators(klass_info, select, connection.alias),  # type: ignore[call-arg]  # Django 5.2's
            columns=tuple((name, position) for name, position in compiler.annotation_col_map.items()),
        )
