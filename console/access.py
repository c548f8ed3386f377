"""The one access check: which spaces a user sees, and with which role.

Every view, API call and websocket resolves its space through `get_space_for_user`. An
outsider gets 404 (the space's existence is not revealed); a member whose role is too low
gets 403.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404

from .models import ROLE_RANK, Membership, Role, Space


def is_platform_admin(user: Any) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_superuser)


def require_platform_admin(user: Any) -> None:
    """For the platform's pages: anyone but a platform admin gets 404, so a section's
    existence is not revealed (as for a space the user is not a member of)."""
    if not is_platform_admin(user):
        raise Http404("No such page")


def spaces_for_user(user: Any, role: Role = Role.VIEWER) -> QuerySet[Space]:
    """The spaces `user` holds at least `role` in (every space for platform admins)."""
    if is_platform_admin(user):
        return Space.objects.all()
    if user is None or not user.is_authenticated or not user.is_active:
        return Space.objects.none()
    roles = [r for r, rank in ROLE_RANK.items() if rank >= ROLE_RANK[role]]
    return Space.objects.filter(memberships__user=user, memberships__role__in=roles)


def role_in_space(user: Any, space: Space) -> Role | None:
    """The user's effective role; platform admins act as admins everywhere."""
    if is_platform_admin(user):
        return Role.ADMIN
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    membership = Membership.objects.filter(user=user, space=space).only("role").first()
    return Role(membership.role) if membership else None


def has_role(user: Any, space: Space, role: Role) -> bool:
    current = role_in_space(user, space)
    return current is not None and ROLE_RANK[current] >= ROLE_RANK[role]


def get_space_for_user(
    user: Any, space_id: uuid.UUID | str, role: Role = Role.VIEWER, *, related: tuple[str, ...] = ()
) -> Space:
    """The space, if `user` may see it with at least `role` (with `related` one-to-one rows
    read in the same query).

    Raises Http404 for a space the user is not a member of (or that does not exist) and
    PermissionDenied for a member whose role is too low.
    """
    try:
        space = Space.objects.select_related(*related).get(pk=space_id)
    except (Space.DoesNotExist, ValueError, ValidationError):
        raise Http404("No such space") from None
    current = role_in_space(user, space)
    if current is None:
        raise Http404("No such space")
    if ROLE_RANK[current] < ROLE_RANK[role]:
        raise PermissionDenied(f"This needs the {role.label.lower()} role in {space.name}.")
    space.user_role = current  # type: ignore[attr-defined]
    return space
