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


def make_config(space: Space, **extra: Any) -> Any:
    """A sandbox config; Docker on the local engine with the base template by default."""
    from console.crypto import encrypt
    from sandboxes.models import SandboxConfig

    api_key = extra.pop("api_key", "")
    values: dict[str, Any] = {
        "name": f"config {next(_counter)}",
        "kind": "docker",
        "default_template": "sandbox-console/base:latest",
        "cpus": 1,
        "memory_mb": 256,
        "pids_limit": 128,
    }
    values.update(extra)
    return SandboxConfig.objects.create(space=space, api_key_encrypted=encrypt(api_key), **values)
