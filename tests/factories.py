"""Factories for test objects: explicit, no hidden fixtures."""

from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth import get_user_model

from console.models import Membership, NetworkPolicy, Role, Space

_counter = itertools.count(1)


def make_user(username: str | None = None, *, superuser: bool = False, **extra: Any) -> Any:
    username = username or f"user{next(_counter)}"
    model = get_user_model()
    if superuser:
        return model.objects.create_superuser(username=username, password="pw-" + username, email="")
    return model.objects.create_user(username=username, password="pw-" + username, **extra)


def make_space(name: str | None = None, **extra: Any) -> Space:
    name = name or f"Space {next(_counter)}"
    space = Space.objects.create(name=name, slug=extra.pop("slug", None) or name.lower().replace(" ", "-"), **extra)
    NetworkPolicy.objects.create(space=space)
    return space


def add_member(space: Space, user: Any, role: Role) -> Membership:
    return Membership.objects.create(space=space, user=user, role=role)
