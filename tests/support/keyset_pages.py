"""Walking a list page's keyset links (console.keyset) as a reader would, and reading the plan
the database picks for a page: shared by the tests of every list in keyset pages."""

from __future__ import annotations

import html
import re
from typing import Any

from django.db import connection
from django.db.models import QuerySet

from console.keyset import Keyset

NEXT = re.compile(r'<a href="\?([^"]*)" rel="next"')
PREVIOUS = re.compile(r'<a href="\?([^"]*)" rel="prev"')


def walk(client: Any, url: str, rows: re.Pattern[str], query: str = "", *, backwards: bool = False) -> list[list[str]]:
    """Every page's rows (what `rows` finds), following "Next" from the page at `query`; with
    `backwards`, then back from the last page following "Previous"."""
    pages: list[list[str]] = []
    body = client.get(f"{url}?{query}").content.decode()
    while True:
        pages.append(rows.findall(body))
        link = NEXT.search(body)
        if link is None:
            break
        body = client.get(f"{url}?{html.unescape(link.group(1))}").content.decode()
        assert len(pages) < 60, "the pages never end"
    if not backwards:
        return pages
    back: list[list[str]] = [rows.findall(body)]
    while (link := PREVIOUS.search(body)) is not None:
        body = client.get(f"{url}?{html.unescape(link.group(1))}").content.decode()
        back.insert(0, rows.findall(body))
        assert len(back) < 60, "the pages never end"
    return back


def cursor_after(queryset: QuerySet[Any], keyset: Keyset, position: int) -> str:
    """The query of the page after the row at `position`, as the page's "Next" link makes it."""
    keyed = keyset.annotate(queryset).order_by(*keyset.order())
    return f"after={keyset.encode(keyed[position])}"


def page_plans(queryset: QuerySet[Any], keyset: Keyset, size: int) -> list[str]:
    """PostgreSQL's plans for the first page, a page after a cursor and a page before one,
    with sequential scans and sorts made as dear as the planner allows: a plan that still
    sorts has no index holding the order."""
    keyed = keyset.annotate(queryset)
    last = keyset.values_of(keyed.order_by(*keyset.order())[size + 5])
    plans = []
    for page in (
        keyed.order_by(*keyset.order())[: size + 1],
        keyed.filter(keyset.beyond(last)).order_by(*keyset.order())[: size + 1],
        keyed.filter(keyset.beyond(last, reverse=True)).order_by(*keyset.order(reverse=True))[: size + 1],
    ):
        sql, params = page.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute("SET LOCAL enable_incremental_sort = off")
            cursor.execute("EXPLAIN " + sql, params)
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return plans
