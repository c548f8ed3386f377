"""Several small reads in one round trip to the database.

A page that shows a dozen numbers and yes/no checks (the dashboard's counts, its
getting-started steps) would otherwise pay one query each. Here each read is a scalar
subquery — a count (`RowCount`), an exists, the first row's fields — and `read_together` selects them all in
one statement, as columns of one row (the reader's own user row, which always exists).
Each subquery still uses its own indexes; the saving is the round trips.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, Func, IntegerField, QuerySet, Subquery, UUIDField
from django.db.models.functions import JSONObject


class RowCount(Subquery):
    """How many rows `queryset` has (of its selected columns: `.values("user").distinct()`
    counts distinct users)."""

    template = "(SELECT COUNT(*) FROM (%(subquery)s) _counted)"
    output_field = IntegerField()

    def __init__(self, queryset: QuerySet[Any], **extra: Any) -> None:
        if not queryset.query.values_select:
            queryset = queryset.values("pk")
        super().__init__(queryset.order_by(), output_field=IntegerField(), **extra)


def first(queryset: QuerySet[Any], **fields: str) -> Subquery:
    """The first row of `queryset` (order it) as a dict of `fields` (name -> lookup path), or
    None. A UUID column comes as its dashed text on every database (`UuidText`)."""
    return Subquery(queryset.values(_row=JSONObject(**{name: UuidText(path) for name, path in fields.items()}))[:1])


class UuidText(Func):
    """A column as JSON carries it, a UUID one as its dashed text: PostgreSQL's uuid type gives
    that, SQLite (and others without a uuid type) stores 32 hex digits, dashed here. Any other
    column is left as it is."""

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> Any:  # type: ignore[override]
        (source,) = self.get_source_expressions()
        field = source.output_field
        field = getattr(field, "target_field", field)  # a foreign key stores its target's type
        if not isinstance(field, UUIDField) or connection.features.has_native_uuid_field:
            return compiler.compile(source)
        sql, params = compiler.compile(source)
        parts = [f"SUBSTR({sql}, {start}, {length})" for start, length in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))]
        return "(" + " || '-' || ".join(parts) + ")", tuple(params) * len(parts)


def exists(queryset: QuerySet[Any]) -> Exists:
    return Exists(queryset)


def read_together(user: Any, reads: dict[str, Any]) -> dict[str, Any]:
    """The value of every read, in one query."""
    if not reads:
        return {}
    row = get_user_model().objects.filter(pk=user.pk).annotate(**reads).values(*reads).first()
    if row is None:  # the user was deleted mid-request: nothing is theirs
        raise PermissionDenied("This account no longer exists.")
    return row
