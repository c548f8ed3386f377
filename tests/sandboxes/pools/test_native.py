"""Pools a backend keeps itself (Kubernetes' SandboxWarmPool, on the fake cluster): sized from
the Pools page, shown there and on /metrics as the backend counts them, drained when the
config moves to another template (as a skill install moves it) and when the config goes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.signals import post_delete
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.services import SYSTEM
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import PoolMember, SandboxConfig, is_native_pool_of
from sandboxes.pools.keeper import refill
from sandboxes.pools.stats import read_pools
from sandboxes.sessions.teardown import Report, tear_down_config
from tests.factories import make_config
from tests.fakes.kube.cluster import FakeCluster
from tests.fakes.kube.crds import SANDBOX_WARM_POOLS
from tests.personas import World
from tests.support.kube_backend import make_kube_backend

pytestmark = [pytest.mark.docker]

POOL_NAME = "console.sandbox-console/pool-name"


@pytest.fixture
def kube_config(world: World, fake_cluster: FakeCluster, settings: Any) -> Iterator[SandboxConfig]:
    settings.CONSOLE_INSTALLATION_ID = "test-native-pools"
    backend = make_kube_backend(fake_cluster, world.space_a, max_pool_size=4)
    config = make_config(world.space_a, backend=backend, name="on the cluster")
    yield config
    native = get_backend(config).warm_pools()
    assert native is not None
    for name in native.pools():
        native.drain(name)


def _kept(cluster: FakeCluster, config: SandboxConfig) -> dict[str, int]:
    """The SandboxWarmPools the cluster holds for the config: console pool name -> replicas."""
    kept = {}
    for item in cluster.store.items(SANDBOX_WARM_POOLS, "default"):
        name = (item["metadata"].get("annotations") or {}).get(POOL_NAME, "")
        if is_native_pool_of(name, config.pk):
            kept[name] = item["spec"].get("replicas", 0)
    return kept


@pytest.mark.django_db(transaction=True)
def test_a_native_pool_is_sized_shown_and_drained_from_the_console(
    world: World, kube_config: SandboxConfig, fake_cluster: FakeCluster, settings: Any
) -> None:
    alice = world.client_for("alice")
    answer = alice.post(reverse("sandboxes:pool_size", args=[world.space_a.pk, kube_config.pk]), {"pool_size": "2"})
    assert answer.status_code == 302
    kube_config.refresh_from_db()
    report = refill(kube_config)
    assert not report.errors
    (first,) = _kept(fake_cluster, kube_config).items()
    assert first[1] == 2

    (reading,) = read_pools([kube_config])
    assert reading.native
    assert not reading.unread
    assert reading.size == 2
    html = alice.get(reverse("sandboxes:space_pools", args=[world.space_a.pk])).content.decode()
    assert "kept by the backend itself" in html
    assert f'class="pool-ready">{reading.ready}<' in html

    settings.METRICS_TOKEN = "t0k3n-for-the-scraper"
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0k3n-for-the-scraper").content.decode()
    labels = f'config="{kube_config.name}",space="{world.space_a.name}"'
    assert f"sandbox_pool_size{{{labels}}} 2.0" in scraped
    assert f"sandbox_pool_ready{{{labels}}} {float(reading.ready)}" in scraped

    # Another template (a skill install points the config at its image): the old pool goes.
    SandboxConfig.objects.filter(pk=kube_config.pk).update(default_template="sandbox-console/base:other")
    kube_config.refresh_from_db()
    report = refill(kube_config)
    assert report.drained == [first[0]]
    kept = _kept(fake_cluster, kube_config)
    assert first[0] not in kept
    assert list(kept.values()) == [2]

    # The config's teardown drains what the backend keeps for it.
    teardown = Report()
    tear_down_config(kube_config, actor=SYSTEM, report=teardown)
    assert teardown.deleted.get("warm pool") == list(kept)
    assert _kept(fake_cluster, kube_config) == {}


@pytest.mark.django_db(transaction=True)
def test_a_config_torn_down_while_its_native_pool_refills_leaves_no_pool(
    world: World, kube_config: SandboxConfig, fake_cluster: FakeCluster
) -> None:
    """The refill passed its check that the config is there, then the teardown drained the
    backend's pools and deleted the config's row: the pool the refill goes on to ensure would
    be kept by the cluster for a config no longer anywhere, refilled for ever. The refill
    drains it and ends saying why."""
    SandboxConfig.objects.filter(pk=kube_config.pk).update(pool_size=2)
    config = SandboxConfig.objects.select_related("space", "backend").get(pk=kube_config.pk)
    # A member left being made long ago: the refill forgets it first, the moment the teardown runs.
    stale = PoolMember.objects.create(space=world.space_a, config=config, template_id="t", policy_fingerprint="f")
    PoolMember.objects.filter(pk=stale.pk).update(created=timezone.now() - timedelta(days=1))

    def tear_down(**_: Any) -> None:
        post_delete.disconnect(sender=PoolMember, dispatch_uid="test-tear-down")
        tear_down_config(SandboxConfig.objects.get(pk=config.pk), actor=SYSTEM, report=Report())
        SandboxConfig.objects.filter(pk=config.pk).delete()

    post_delete.connect(tear_down, sender=PoolMember, weak=False, dispatch_uid="test-tear-down")
    try:
        report = refill(config)
    finally:
        post_delete.disconnect(sender=PoolMember, dispatch_uid="test-tear-down")
    assert not SandboxConfig.objects.filter(pk=config.pk).exists()
    assert _kept(fake_cluster, config) == {}
    assert report.skipped == "the pool's config was deleted"
    assert report.errors == []
