"""What the command palette (console.palette) finds of the skill catalog: skills by name.
The catalog is the platform's, readable by every signed-in user (as on the Skills page)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from console.models import Space
from console.palette import Hit, as_uuid, palette_source

from .models import Skill


@palette_source(40, "skill")
def skills(user: Any, query: str, spaces: QuerySet[Space], limit: int) -> list[Hit]:
    ident = as_uuid(query)
    found = Skill.objects.filter(pk=ident) if ident is not None else Skill.objects.filter(name__icontains=query)
    rows = found.filter(latest_version__isnull=False).order_by("name")[:limit]
    return [Hit("skill", skill.name, skill.get_absolute_url(), "skill") for skill in rows]
