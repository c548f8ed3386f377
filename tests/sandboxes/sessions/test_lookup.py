"""The warm path's session lookup: the session, its config and backend in one query, scoped to its space."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from sandboxes.models import PlatformBackend, SandboxConfig, Session
from sandboxes.sessions.lookup import session_by_key
from tests.factories import make_config, make_space
from tests.personas import World

pytestmark = pytest.mark.django_db


def field_values(instance: Session | SandboxConfig | PlatformBackend) -> dict[str, object]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_it_returns_the_session_its_config_and_backend_in_one_query(
    world: World, django_assert_num_queries: Any
) -> None:
    config = make_config(world.space_a, api_key="secret-key", cpus=Decimal("1.5"), endpoint="http://127.0.0.1:9")
    Session.objects.create(
        space=world.space_a,
        key="agent-7",
        config=config,
        stale_at=timezone.now() - timedelta(minutes=3),
        last_activity=timezone.now(),
        sandbox_id="sbx-1",
        binding_version=4,
    )
    expected = Session.objects.select_related("config__backend").get(space=world.space_a, key="agent-7")

    with django_assert_num_queries(1):
        found = session_by_key(world.space_a, "agent-7")

    assert found is not None
    assert field_values(found) == field_values(expected)
    assert field_values(found.config) == field_values(expected.config)
    assert field_values(found.config.backend) == field_values(expected.config.backend)
    assert found._state.db == found.config._state.db == found.config.backend._state.db == expected._state.db
    assert not found._state.adding
    assert isinstance(found.config.cpus, Decimal)
    assert found.config.cpus == Decimal("1.5")
    assert not found.get_deferred_fields()
    assert not found.config.get_deferred_fields()


def test_it_finds_nothing_for_an_unknown_key_or_another_space(world: World) -> None:
    config = make_config(world.space_a)
    Session.objects.create(space=world.space_a, key="mine", config=config)

    assert session_by_key(world.space_a, "other") is None
    assert session_by_key(world.space_b, "mine") is None
    assert session_by_key(make_space("Third"), "mine") is None


def test_it_reads_the_row_anew_each_time(world: World) -> None:
    # Never cached rows: a stale time or config edit shows at once.
    config = make_config(world.space_a, memory_mb=256)
    Session.objects.create(space=world.space_a, key="k", config=config)
    first = session_by_key(world.space_a, "k")
    assert first is not None
    assert first.stale_at is None

    stale_at = timezone.now()
    Session.objects.filter(space=world.space_a, key="k").update(stale_at=stale_at)
    SandboxConfig.objects.filter(pk=config.pk).update(memory_mb=512)
    again = session_by_key(world.space_a, "k")

    assert again is not None
    assert again.stale_at == stale_at
    assert again.config.memory_mb == 512
