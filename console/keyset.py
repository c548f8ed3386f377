"""Keyset (cursor) pagination for list pages that run deep.

A numbered page N makes the database sort and skip (N - 1) x size rows: at 100,000 rows a deep
page costs as much as sorting the table. A keyset page instead continues from the last row
shown: `?after=<cursor>` gives the rows that sort after it, `?before=<cursor>` the rows that
sort before it. With an index on the sort key the database starts right at the cursor, so
every page costs the same. Rows inserted meanwhile never shift a page.

The sort key is a few values, all descending, the last unique (a primary key), so ties in the
others (rows created in the same instant) still have one place each: every row is on exactly
one page. A cursor is the URL-safe base64 of the row's key values, opaque to readers; a
cursor the page did not make is ignored (the first page is shown).

Instead of "page N of M" the page says how many rows match when that is cheap: it counts up to
`COUNT_CAP` + 1 rows (one index walk of at most that length) and shows "more than COUNT_CAP"
beyond.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.core.exceptions import ValidationError
from django.db.models import Expression, F, Field, Model, Q, QuerySet
from django.http import HttpRequest, QueryDict

M = TypeVar("M", bound=Model)
COUNT_CAP = 1000
PARAMETERS = ("after", "before")


@dataclass(frozen=True)
class KeyPart:
    """One value of the sort key: a field name or an expression (named `name`), descending."""

    name: str
    field: Field[Any, Any]
    expression: Expression | F | None = None

    def ref(self) -> Expression | F:
        return self.expression if self.expression is not None else F(self.name)


@dataclass(frozen=True)
class Keyset:
    """The sort key of a list, most significant first; the last part must be unique."""

    parts: tuple[KeyPart, ...]

    def alias(self, index: int) -> str:
        return f"_keyset_{index}"

    def order(self, *, reverse: bool = False) -> list[Any]:
        return [part.ref().asc() if reverse else part.ref().desc() for part in self.parts]

    def values_of(self, row: Model) -> list[Any]:
        values = []
        for index, part in enumerate(self.parts):
            values.append(getattr(row, self.alias(index)) if part.expression is not None else getattr(row, part.name))
        return values

    def encode(self, row: Model) -> str:
        raw = json.dumps([_plain(value) for value in self.values_of(row)]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def decode(self, cursor: str) -> list[Any] | None:
        """The key values in `cursor`, or None for anything this keyset did not make."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            values = json.loads(raw)
            if not isinstance(values, list) or len(values) != len(self.parts):
                return None
            decoded = [part.field.to_python(value) for part, value in zip(self.parts, values, strict=True)]
        except (binascii.Error, ValueError, TypeError, OverflowError, ValidationError, RecursionError):
            # OverflowError: an infinite number (1e400) where an integer key belongs
            return None
        if any(value is None or (isinstance(value, datetime) and value.tzinfo is None) for value in decoded):
            return None  # the page's cursors carry every value, times with their offset
        return decoded

    def beyond(self, values: list[Any], *, reverse: bool = False) -> Q:
        """Rows after `values` in the order (before them with `reverse`).

        Written as `k0 <= v0 AND (k0 < v0 OR (k0 = v0 AND (k1 < v1 OR ...)))`: the leading
        bound lets the database start its index scan at the cursor instead of filtering from
        the top."""
        op = "gt" if reverse else "lt"
        bound = "gte" if reverse else "lte"
        condition: Q | None = None
        for index in reversed(range(len(self.parts))):
            name = self.alias(index)
            strict = Q(**{f"{name}__{op}": values[index]})
            condition = strict if condition is None else strict | (Q(**{name: values[index]}) & condition)
        assert condition is not None
        return Q(**{f"{self.alias(0)}__{bound}": values[0]}) & condition

    def annotate(self, queryset: QuerySet[M]) -> QuerySet[M]:
        """The key values as aliases, for filtering, and expressions also as annotations, for
        reading a row's cursor."""
        aliases = {self.alias(i): part.ref() for i, part in enumerate(self.parts)}
        shown = {self.alias(i): part.ref() for i, part in enumerate(self.parts) if part.expression is not None}
        return queryset.alias(**{k: v for k, v in aliases.items() if k not in shown}).annotate(**shown)


def _plain(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value if isinstance(value, int | float | str) else str(value)


@dataclass
class KeysetPage(Generic[M]):
    """What a list template needs: the rows and the queries of the pages around them."""

    object_list: list[M]
    newer: str = ""  # the query string of the previous page ("" if none)
    older: str = ""  # of the next page
    first: str = ""  # of the first page
    is_first: bool = True
    count: int = 0
    count_capped: bool = False

    @property
    def has_previous(self) -> bool:
        return bool(self.newer)

    @property
    def has_next(self) -> bool:
        return bool(self.older)

    @property
    def count_label(self) -> str:
        return f"more than {COUNT_CAP:,}" if self.count_capped else f"{self.count:,}"


def keyset_page(request: HttpRequest, queryset: QuerySet[M], keyset: Keyset, per_page: int = 25) -> KeysetPage[M]:
    """The page of `queryset` that the request's `after` or `before` cursor names (the first
    page without one): 2 queries, the rows (one more than a page, to know whether more
    follow) and a count capped at COUNT_CAP + 1; 3 when no row is left past the cursor."""
    keyed = keyset.annotate(queryset)
    after = keyset.decode(request.GET.get("after", ""))
    before = keyset.decode(request.GET.get("before", "")) if after is None else None
    rows, more_before, more_after = _rows(keyed, keyset, per_page, after=after, before=before)
    if not rows and (after is not None or before is not None):
        # The rows around the cursor are gone (deleted meanwhile): the first page, not an empty one.
        after = before = None
        rows, more_before, more_after = _rows(keyed, keyset, per_page, after=None, before=None)
    count = queryset.select_related(None).order_by().values("pk")[: COUNT_CAP + 1].count()
    page: KeysetPage[M] = KeysetPage(object_list=rows, count=min(count, COUNT_CAP), count_capped=count > COUNT_CAP)
    params = _without_cursor(request.GET)
    if rows and more_after:
        page.older = _query(params, "after", keyset.encode(rows[-1]))
    if rows and more_before:
        page.newer = _query(params, "before", keyset.encode(rows[0]))
    page.first = params.urlencode()
    page.is_first = after is None and before is None
    return page


def _rows(
    keyed: QuerySet[M], keyset: Keyset, per_page: int, *, after: list[Any] | None, before: list[Any] | None
) -> tuple[list[M], bool, bool]:
    """A page of rows, and whether rows come before and after it."""
    if before is not None:
        rows = list(
            keyed.filter(keyset.beyond(before, reverse=True)).order_by(*keyset.order(reverse=True))[: per_page + 1]
        )
        return rows[:per_page][::-1], len(rows) > per_page, True  # the cursor's own row, at least, follows
    if after is not None:
        keyed = keyed.filter(keyset.beyond(after))
    rows = list(keyed.order_by(*keyset.order())[: per_page + 1])
    return rows[:per_page], after is not None, len(rows) > per_page


def _without_cursor(params: QueryDict) -> QueryDict:
    copy = params.copy()
    for name in (*PARAMETERS, "page"):
        copy.pop(name, None)
    return copy


def _query(params: QueryDict, name: str, cursor: str) -> str:
    copy = params.copy()
    copy[name] = cursor
    return copy.urlencode()
