"""Factories for test objects: explicit, no hidden fixtures."""

from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth import get_user_model

from console.models import Membership, NetworkPolicy, Role, Space
from sandboxes.catalog.platform import BACKEND_FIELDS

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


# What make_config passes to the platform backend rather than to the config itself.
BACKEND_KWARGS = tuple(field for field in BACKEND_FIELDS if field != "name")


def make_backend(*spaces: Space, api_key: str = "", **extra: Any) -> Any:
    """A platform backend granted to `spaces`; Docker on the local engine by default."""
    from console.crypto import encrypt
    from sandboxes.models import PlatformBackend

    values: dict[str, Any] = {"name": f"backend {next(_counter)}", "kind": "docker"}
    values.update(extra)
    backend = PlatformBackend.objects.create(api_key_encrypted=encrypt(api_key), **values)
    backend.spaces.set(spaces)
    return backend


def make_config(space: Space, **extra: Any) -> Any:
    """A sandbox config; Docker on the local engine with the base template by default.

    Infrastructure keywords (kind, endpoint, api_key, pip_find_links, ...) go to a platform
    backend made for it and granted to the space, unless `backend=` names one.
    """
    from sandboxes.models import SandboxConfig

    backend = extra.pop("backend", None)
    infra = {key: extra.pop(key) for key in BACKEND_KWARGS if key in extra}
    api_key = extra.pop("api_key", "")
    if backend is None:
        backend = make_backend(space, api_key=api_key, **infra)
    elif infra or api_key:
        raise TypeError("pass infrastructure to make_backend, not with backend=")
    values: dict[str, Any] = {
        "name": f"config {next(_counter)}",
        "default_template": "sandbox-console/base:latest",
        "cpus": 1,
        "memory_mb": 256,
        "pids_limit": 128,
    }
    values.update(extra)
    return SandboxConfig.objects.create(space=space, backend=backend, **values)


def config_form(backend: Any, /, **overrides: Any) -> dict[str, Any]:
    """A valid config form's fields on `backend` (a platform backend), `overrides` on top (a
    test may override or blank `backend` itself)."""
    data = {
        "name": "main",
        "backend": str(backend.pk),
        "api_key": "",
        "default_template": "sandbox-console/base:latest",
        "cpus": "1",
        "memory_mb": "512",
        "pids_limit": "256",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
        "persistent_workspace": "on",
    }
    data.update(overrides)
    return data


def set_policy(space: Space, **changes: Any) -> None:
    """Save `space`'s network policy through the service: outbound on with empty lists and no
    public traffic, `changes` on top."""
    from console.services import SYSTEM, do_update_network_policy

    values: dict[str, Any] = {
        "allow_internet_access": True,
        "allow_out": [],
        "deny_out": [],
        "l7_rules": [],
        "allow_public_traffic": False,
    }
    values.update(changes)
    do_update_network_policy(space, actor=SYSTEM, **values)
