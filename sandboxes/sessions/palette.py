"""What the command palette (console.palette) finds here: sessions by key or id, configs by
name or id, only in the spaces it is given (the user's own)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from console.models import Space
from console.palette import Hit, as_uuid, palette_source

from ..models import SandboxConfig, Session


@palette_source(20, "session")
def sessions(user: Any, query: str, spaces: QuerySet[Space], limit: int) -> list[Hit]:
    found = Session.objects.filter(space__in=spaces)
    ident = as_uuid(query)
    found = found.filter(pk=ident) if ident is not None else found.filter(key__icontains=query)
    rows = found.select_related("space").order_by("-last_activity", "key")[:limit]
    return [
        Hit("session", session.key, session.get_absolute_url(), f"{session.space.name} · {session.get_state_display()}")
        for session in rows
    ]


@palette_source(30, "config")
def configs(user: Any, query: str, spaces: QuerySet[Space], limit: int) -> list[Hit]:
    found = SandboxConfig.objects.filter(space__in=spaces)
    ident = as_uuid(query)
    found = found.filter(pk=ident) if ident is not None else found.filter(name__icontains=query)
    rows = found.select_related("space", "backend").order_by("name")[:limit]
    return [
        Hit("config", config.name, config.get_absolute_url(), f"{config.space.name} · {config.get_kind_display()}")
        for config in rows
    ]
