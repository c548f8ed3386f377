"""Personas: alice (admin of A), bob (member of A), carol (viewer of A), charlie (admin of B).

root is a platform admin (superuser). Used by every app's view tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

from console.models import Role, Space
from tests.factories import add_member, make_space, make_user


@dataclass
class World:
    space_a: Space
    space_b: Space
    alice: Any
    bob: Any
    carol: Any
    charlie: Any
    root: Any

    def client_for(self, name: str) -> Client:
        client = Client()
        if name != "anonymous":
            client.force_login(getattr(self, name))
        return client


@pytest.fixture
def world(db: None) -> World:
    return build_world()


def build_world() -> World:
    """The personas and their two spaces (for a fixture that shares them over a module)."""
    space_a = make_space("Space A", slug="space-a")
    space_b = make_space("Space B", slug="space-b")
    alice, bob, carol, charlie = (make_user(n) for n in ("alice", "bob", "carol", "charlie"))
    add_member(space_a, alice, Role.ADMIN)
    add_member(space_a, bob, Role.MEMBER)
    add_member(space_a, carol, Role.VIEWER)
    add_member(space_b, charlie, Role.ADMIN)
    root = make_user("root", superuser=True)
    return World(space_a, space_b, alice, bob, carol, charlie, root)
