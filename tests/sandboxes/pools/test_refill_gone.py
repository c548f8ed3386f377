"""A refill of a pool whose space or config is deleted, before the refill starts or while it
makes sandboxes (the refill of `pools.keeper`, as the background thread and the Celery task
run it: autocommit, the config loaded before the rows went). It ends with the reason in
`skipped`, writes no row for the vanished space or config, raises nothing and leaves no
sandbox: one it made is deleted by the refill itself (its member row went). Real Docker and
PostgreSQL; nothing of ours mocked (Django's model signals pick the moment of the delete)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db.models.signals import ModelSignal, post_save, pre_save

from console.models import NetworkPolicy, Space
from console.services import SYSTEM, do_delete_space
from sandboxes.backends.base import META_CONFIG, META_INSTALLATION, META_POOL, ListQuery
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.services import do_delete_config
from sandboxes.models import PoolMember, SandboxConfig
from sandboxes.pools.keeper import refill, refill_config
from sandboxes.pools.services import do_set_pool_size
from tests.personas import World

pytestmark = [pytest.mark.docker]


def pooled_sandboxes(config: SandboxConfig) -> list[str]:
    """The config's pool sandboxes the engine still lists."""
    from django.conf import settings

    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_CONFIG: str(config.pk)})
    return [i.sandbox_id for i in get_backend(config).iter_sandboxes(query) if i.metadata.get(META_POOL)]


def loaded(config: SandboxConfig) -> SandboxConfig:
    """The config as `refill_config` loads it."""
    return SandboxConfig.objects.select_related("space", "backend").get(pk=config.pk)


def assert_nothing_left(config: SandboxConfig) -> None:
    """No member row and no pool sandbox of the config is left."""
    assert not PoolMember.objects.filter(config_id=config.pk).exists()
    assert pooled_sandboxes(config) == []


@pytest.mark.django_db(transaction=True)
def test_a_refill_of_a_config_whose_space_was_deleted_writes_nothing(
    world: World, session_config: SandboxConfig
) -> None:
    do_set_pool_size(session_config, 2, actor=SYSTEM)
    config = loaded(session_config)
    do_delete_space(Space.objects.get(pk=config.space_id), actor=SYSTEM)
    report = refill(config)
    assert report.skipped == "the pool's space was deleted"
    assert (report.made, report.drained, report.errors) == ([], [], [])
    assert not NetworkPolicy.objects.filter(space_id=config.space_id).exists()
    assert_nothing_left(config)
    assert refill_config(str(config.pk)) is None  # the id of a config that is no more: nothing to refill


@pytest.mark.django_db(transaction=True)
def test_a_refill_of_a_deleted_config_writes_nothing(world: World, session_config: SandboxConfig) -> None:
    do_set_pool_size(session_config, 1, actor=SYSTEM)
    config = loaded(session_config)
    do_delete_config(loaded(session_config), actor=SYSTEM)
    report = refill(config)
    assert report.skipped == "the pool's config was deleted"
    assert (report.made, report.errors) == ([], [])
    assert NetworkPolicy.objects.filter(space=world.space_a).exists()  # the space's own row stays
    assert_nothing_left(config)


@pytest.fixture
def space_deleted_at(request: pytest.FixtureRequest, world: World) -> Iterator[ModelSignal]:
    """The space deleted (its rows, as the teardown ends) when a refill saves a member row:
    just before its INSERT (pre_save) or just after (post_save, before the sandbox is made)."""
    signal: ModelSignal = request.param

    def delete_the_space(**_: Any) -> None:
        Space.objects.filter(pk=world.space_a.pk).delete()

    signal.connect(delete_the_space, sender=PoolMember, weak=False, dispatch_uid="test-delete-the-space")
    yield signal
    signal.disconnect(sender=PoolMember, dispatch_uid="test-delete-the-space")


@pytest.mark.parametrize(
    "space_deleted_at", [pre_save, post_save], ids=["before-the-row", "after-the-row"], indirect=True
)
@pytest.mark.django_db(transaction=True)
def test_a_space_deleted_while_its_pool_refills_ends_the_refill_quietly(
    world: World, session_config: SandboxConfig, space_deleted_at: ModelSignal
) -> None:
    do_set_pool_size(session_config, 1, actor=SYSTEM)  # one sandbox to make: one delete, no second racing it
    config = loaded(session_config)
    report = refill(config)
    assert report.skipped == "the pool's space was deleted"
    assert report.made == []
    assert report.errors == []
    assert not Space.objects.filter(pk=world.space_a.pk).exists()
    assert not NetworkPolicy.objects.filter(space_id=world.space_a.pk).exists()
    assert_nothing_left(config)
