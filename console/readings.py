"""Several small reads in one round trip to the database.

A page that shows a dozen numbers and yes/no checks (the dashboard's counts, its
getting-started steps) would otherwise pay one query each. Here each read is a scalar
subquery — a count (`RowCount`), an exists, the first row's fields — and `read_together` selects them all in
one statement, as columns of one row (the reader's own user row, which always exists).
Each subquery still uses its own indexes; the saving is the round trips.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, IntegerField, QuerySet, Subquery
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
    """The first row of `queryset` (order it) as a dict of `fields` (name -> lookup path), or None."""
    return Subquery(queryset.values(_row=JSONObject(**fields))[:1])


def exists(queryset: QuerySet[Any]) -> Exists:
    return Exists(queryset)


def read_together(user: Any, reads: dict[str, Any]) -> dict[str, Any]:
    """The value of every read, in one query."""
    if not reads:
        return {}
    row = get_user_model().objects.filter(pk=user.pk).annotate(**reads).values(*reads).first()
    if row is None:  # the user was deleted mid-request: nothing is theirs
        raise PermissionDenied("This account no longer exists.")
    return {name: _with_uuids(value) for name, value in row.items()}


def _with_uuids(value: Any) -> Any:
    """A `first` row as PostgreSQL gives it: JSON carries a UUID column's stored text, which
    SQLite keeps as 32 hex digits; URLs and comparisons want the dashed form."""
    if not isinstance(value, dict):
        return value
    return {key: _dashed(item) if key == "id" or key.endswith("_id") else item for key, item in value.items()}


def _dashed(item: Any) -> Any:
    if isinstance(item, str) and len(item) == 32:
        try:
            return str(uuid.UUID(hex=item))
        except ValueError:
            return item
    return item
