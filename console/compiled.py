"""A query the ORM compiles once per database connection and runs many times.

For readers tuning a hot path. Compiling a joined queryset costs more than running it:
`Session.objects.select_related("config__backend").get(space_id=..., key=...)` took 1.13 ms,
0.46 ms of it compiling, against 0.37 ms for its SQL alone (2026-12-02, PostgreSQL, measured
beside bench/session_resolve.py). `Compiled.first(*values)` keeps what the ORM made for the
connection — its SQL, its converters, its row-to-object mapping — and runs it again with new
values: the same objects `.filter(...).first()` gives, with no hand-written SQL.

Only equality filters on the named fields. The cache is per connection (a connection is one
thread's), so nothing is shared between threads and a closed connection drops its entry.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.query import get_related_populators

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Plan:
    sql: str
    order: tuple[int, ...]  # compiled parameter i is the value at order[i]
    converters: dict[int, Any]
    init_list: list[str]
    start: int
    end: int
    populators: list[Any]


class Compiled(Generic[M]):
    """`queryset.filter(field=value, ...).first()` for the named fields, compiled once per
    connection. The lookup must match one row at most (a unique key): no ORDER BY is kept."""

    def __init__(self, queryset: QuerySet[M], *fields: str) -> None:
        self.queryset = queryset
        self.fields = fields
        self._plans: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _Plan] = weakref.WeakKeyDictionary()

    def first(self, *values: Any) -> M | None:
        using = self.queryset.db
        connection = connections[using]
        prepared = self._prepare(connection, values)
        plan = self._plans.get(connection)
        if plan is None:
            plan = self._plan(connection, values, prepared)
            if plan is None:  # two values alike: which parameter is which cannot be told
                return self.queryset.filter(**dict(zip(self.fields, values, strict=True))).first()
            self._plans[connection] = plan
        with connection.cursor() as cursor:
            cursor.execute(plan.sql, [prepared[i] for i in plan.order])
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
        return obj

    def _prepare(self, connection: BaseDatabaseWrapper, values: Sequence[Any]) -> list[Any]:
        meta = self.queryset.model._meta
        return [
            cast("Field[Any, Any]", meta.get_field(name)).get_db_prep_value(value, connection)
            for name, value in zip(self.fields, values, strict=True)
        ]

    def _plan(self, connection: BaseDatabaseWrapper, values: Sequence[Any], prepared: list[Any]) -> _Plan | None:
        if len({repr(value) for value in prepared}) != len(prepared):
            return None
        queryset = self.queryset.filter(**dict(zip(self.fields, values, strict=True)))
        compiler = queryset.query.get_compiler(connection=connection)
        sql, params = compiler.as_sql()
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
        )
