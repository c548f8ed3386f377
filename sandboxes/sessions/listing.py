"""What the sessions list shows: the user's spaces (one query), the filters, and the sort key
its keyset pages follow (console.keyset).

The order is last activity, newest first, never-active sessions last, then creation, then id;
`Session.Meta.indexes` hold it whole, alone and behind the space and the state, so the first
page, a filter and a page 75,000 rows down each read about one page of an index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import DateTimeField, Exists, F, OuterRef, Q, QuerySet, Subquery, UUIDField, Value
from django.http import Http404

from console.access import is_platform_admin
from console.keyset import KeyPart, Keyset
from console.models import ROLE_RANK, Membership, Role, Space

from ..models import SandboxConfig, Session, list_activity
from .labels import has_label

SESSION_ORDER = Keyset(
    (
        KeyPart("activity", DateTimeField(), list_activity()),
        KeyPart("created", DateTimeField()),
        KeyPart("id", UUIDField()),
    )
)

STATE_FILTERS = [("running", "Running"), ("paused", "Paused"), ("stopped", "Stopped"), ("stale", "Out of date")]


@dataclass(frozen=True)
class VisibleSpace:
    """A space of the list's filter, with what the page needs to know about it."""

    space: Space
    role: Role
    has_config: bool

    @property
    def can_start(self) -> bool:
        return self.has_config and ROLE_RANK[self.role] >= ROLE_RANK[Role.MEMBER]


def visible_spaces(user: Any) -> list[VisibleSpace]:
    """The spaces `user` sees, by name, each with their role and whether it has a config: one
    query (platform admins act as admins everywhere, as in console.access)."""
    spaces: QuerySet[Space] = Space.objects.order_by("name").annotate(
        has_config=Exists(SandboxConfig.objects.filter(space=OuterRef("pk")))
    )
    if is_platform_admin(user):
        spaces = spaces.annotate(role=Value(Role.ADMIN.value))
    elif user is not None and user.is_authenticated and user.is_active:
        membership = Membership.objects.filter(space=OuterRef("pk"), user=user)
        spaces = spaces.filter(Exists(membership)).annotate(role=Subquery(membership.values("role")[:1]))
    else:
        return []
    return [VisibleSpace(space, Role(space.role), space.has_config) for space in spaces]  # type: ignore[attr-defined]


def chosen_space(spaces: list[VisibleSpace], space_id: str) -> Space:
    """The space the filter names, among the user's: 404 for any other (as get_space_for_user)."""
    for visible in spaces:
        if str(visible.space.id) == space_id:
            return visible.space
    raise Http404("No such space")


def filtered_sessions(
    user: Any, spaces: list[VisibleSpace], *, space: Space | None, state: str, query: str, label: str = ""
) -> QuerySet[Session]:
    sessions = Session.objects.select_related("space", "config__backend")
    if space is not None:
        sessions = sessions.filter(space=space)
    elif not is_platform_admin(user):
        sessions = sessions.filter(space__in=[visible.space.id for visible in spaces])
    if state == "stale":
        sessions = sessions.filter(stale_at__isnull=False).filter(
            Q(bound_at__isnull=True) | Q(bound_at__lt=F("stale_at"))
        )
    elif state in {"running", "paused", "stopped"}:
        sessions = sessions.filter(state=state)
    if query:
        sessions = sessions.filter(key__icontains=query)
    if label:
        sessions = sessions.filter(has_label(label))
    return sessions
