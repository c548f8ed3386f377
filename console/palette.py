"""The command palette's search (Ctrl-K / ⌘K): pages, spaces, and what other apps register.

Scoped to what the user may see, always through `spaces_for_user`: a space the user is not a
member of never appears, even when its id is typed (an id only finds a thing inside the
user's own spaces). The console app cannot import the apps to its left, so each registers
its kinds (`@palette_source(order, kind)`: sessions and configs in `sandboxes/sessions/
palette.py`, skills in `skills/palette.py`). A source gets the user, the query and the
user's spaces as a queryset, and returns at most `limit` hits. `search_view` answers JSON to
the palette (static/js/palette.js) and a plain results page to everyone else (no JavaScript
needed).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from .access import get_space_for_user, is_platform_admin, spaces_for_user
from .context_processors import nav_groups
from .models import Space

QUERY_MAX = 100
PER_KIND = 6


@dataclass(frozen=True)
class Hit:
    kind: str  # "page", "space", "session", "config", "skill"
    label: str
    url: str
    detail: str = ""


Source = Callable[[Any, str, QuerySet[Space], int], list[Hit]]
_SOURCES: list[tuple[int, str, Source]] = []


def palette_source(order: int, kind: str) -> Callable[[Source], Source]:
    """Register what the palette finds of one kind; `order` places its hits after pages (0)
    and spaces (10)."""

    def register(func: Source) -> Source:
        if all(existing is not func for _, _, existing in _SOURCES):
            _SOURCES.append((order, kind, func))
            _SOURCES.sort(key=lambda entry: entry[0])
        return func

    return register


def clean_query(text: str) -> str:
    """The query as searched: control characters (PostgreSQL refuses NUL) dropped, trimmed, capped."""
    return "".join(char for char in text if char.isprintable()).strip()[:QUERY_MAX]


def as_uuid(text: str) -> uuid.UUID | None:
    """The query as an id, when it is one (a pasted session or space id)."""
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        return None


def _pages(user: Any, query: str) -> list[Hit]:
    words = query.lower()
    hits = []
    for group, items in nav_groups(user):
        for _key, label, url_name in items:
            if not words or words in label.lower() or words in group.lower():
                hits.append(Hit("page", label, reverse(url_name), group))
    return hits


def _spaces(query: str, spaces: QuerySet[Space], limit: int) -> list[Hit]:
    found = spaces
    if (ident := as_uuid(query)) is not None:
        found = found.filter(pk=ident)
    elif query:
        found = found.filter(name__icontains=query) | found.filter(slug__icontains=query)
    rows = found.distinct().order_by("name").only("id", "name", "slug")[:limit]
    return [Hit("space", space.name, space.get_absolute_url(), space.slug) for space in rows]


def search(user: Any, query: str, *, space_id: str = "", limit: int = PER_KIND) -> list[Hit]:
    """Everything the user may open that matches `query` (case-insensitive), pages first.

    `space_id` narrows to one space (Http404 for a space the user is not a member of)."""
    query = clean_query(query)
    spaces = spaces_for_user(user)
    if space_id:
        spaces = Space.objects.filter(pk=get_space_for_user(user, space_id).pk)
    hits = [] if space_id else _pages(user, query)
    hits += _spaces(query, spaces, limit)
    if query:
        for _order, _kind, source in _SOURCES:
            hits += source(user, query, spaces, limit)
    return hits


@login_required
@require_GET
def search_view(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "")
    try:
        hits = search(request.user, query, space_id=request.GET.get("space", "").strip())
    except Http404:
        if _wants_json(request):
            return JsonResponse({"error": "No such space."}, status=404)
        raise
    if _wants_json(request):
        return JsonResponse({"query": clean_query(query), "results": [asdict(hit) for hit in hits]})
    return render(
        request,
        "console/search.html",
        {"query": clean_query(query), "hits": hits, "is_platform_admin": is_platform_admin(request.user)},
    )


def _wants_json(request: HttpRequest) -> bool:
    return request.GET.get("format") == "json" or "application/json" in request.headers.get("Accept", "")
