"""Cursor pagination of the agent API's lists (keyset: newest first, stable under inserts).

A cursor is opaque to clients: the URL-safe base64 of the last row's (time, id). A page
answers `next_cursor` (null on the last page); `?cursor=` continues after it, `?limit=`
sets the page size (1..MAX_LIMIT). Rows created meanwhile never shift a page: they sort
before the cursor.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest


class InvalidPage(ValueError):
    """A `cursor` or `limit` parameter the API cannot use; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


MAX_LIMIT = 500
M = TypeVar("M", bound=Model)


def encode_cursor(when: datetime, pk: Any) -> str:
    raw = json.dumps([when.isoformat(), str(pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        when, pk = json.loads(raw)
        if not isinstance(when, str) or not isinstance(pk, str):
            raise ValueError("a cursor is two strings")
        return datetime.fromisoformat(when), uuid.UUID(pk)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise InvalidPage("cursor", "'cursor' is not a cursor this API gave out.") from None


def page_size(request: HttpRequest, default: int) -> int:
    raw = request.GET.get("limit", "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise InvalidPage("limit", f"'limit' is an integer from 1 to {MAX_LIMIT}.")
    return value


def cursor_page(
    request: HttpRequest, queryset: QuerySet[M], *, time_field: str, default_limit: int
) -> tuple[list[M], str | None]:
    """One page of `queryset`, newest first by (time_field, pk), and the next page's cursor."""
    limit = page_size(request, default_limit)
    rows = queryset.order_by(f"-{time_field}", "-pk")
    cursor = request.GET.get("cursor", "")
    if cursor:
        when, pk = decode_cursor(cursor)
        rows = rows.filter(Q(**{f"{time_field}__lt": when}) | Q(**{time_field: when, "pk__lt": pk}))
    page = list(rows[: limit + 1])
    if len(page) <= limit:
        return page, None
    last = page[limit - 1]
    return page[:limit], encode_cursor(getattr(last, time_field), last.pk)
