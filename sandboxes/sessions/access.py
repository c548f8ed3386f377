"""A session as a page looks it up: by id, through the access helper (outsider 404, too-low
role 403)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404

from console.access import get_space_for_user
from console.models import Role

from ..models import Session


def get_session_for_user(user: Any, session_id: Any, role: Role = Role.VIEWER) -> Session:
    session = get_object_or_404(Session.objects.select_related("space", "config__backend"), pk=session_id)
    get_space_for_user(user, session.space_id, role)
    return session
