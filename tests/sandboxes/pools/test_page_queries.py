"""What the Pools pages (the platform's, a space's) cost as pools grow: their database queries
do not grow with the pooled configs they list; their calls to the engine (a ready sandbox's
memory) stay within `pools.memory_reads`, the follows reading the rest; pools a backend keeps
itself (Kubernetes, on the fake cluster) are listed once per platform backend and account."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from console.models import Space
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import MemberState, PlatformBackend, PoolClaim, PoolMember, SandboxConfig, SessionImage
from tests.factories import make_backend, make_config, make_space
from tests.fakes.kube.cluster import FakeCluster
from tests.personas import World
from tests.support.kube_backend import make_kube_backend
from tests.support.sqlite_rerun import rerun_on_sqlite
from tests.support.tuning import Tuned

pytestmark = [pytest.mark.docker]


def pooled(space: Space, backend: PlatformBackend, n: int) -> SandboxConfig:
    """A pooled config with a ready member (its sandbox gone: the engine answers not found),
    one being made, a claim and, every other one, a skill image of the space."""
    config = make_config(space, backend=backend, name=f"pooled {n}", pool_size=2)
    now = timezone.now()
    PoolMember.objects.create(
        space=space,
        config=config,
        state=MemberState.READY,
        sandbox_id=f"sandbox-console-absent-{config.pk}",
        template_id=config.default_template,
        ready_at=now,
    )
    PoolMember.objects.create(space=space, config=config, template_id=config.default_template)
    PoolClaim.objects.create(space=space, config=config, hit=True, duration_ms=3.0 + n, resolve_ms=20.0 + n)
    PoolClaim.objects.create(space=space, config=config, hit=False, reason="the pool had no ready sandbox")
    if n % 2:
        SessionImage.objects.create(
            space=space, config=config, snapshot_id=f"snap-{n}", fingerprint=config_fingerprint(config)
        )
    return config


def engine_reads() -> float:
    """Memory readings asked of the Docker engine (the console's own count of backend calls)."""
    labels = {"backend_kind": "docker", "operation": "stats.memory_bytes"}
    return REGISTRY.get_sample_value("sandbox_backend_calls_total", labels) or 0.0


def load(client: Any, url: str) -> tuple[int, float, str]:
    """One full load of a page: its queries, its engine reads and its HTML. The load before it
    builds the configs' adapters (once per config, kept by the bridge)."""
    assert client.get(url).status_code == 200
    before = engine_reads()
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(url)
    assert answer.status_code == 200
    return len(queries), engine_reads() - before, answer.content.decode()


def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr id="pool-[^"]+">', html)


@pytest.mark.django_db
def test_the_platform_page_queries_the_same_for_one_pool_and_for_ten_over_three_spaces(
    world: World, tuned: Tuned
) -> None:
    tuned({"pools.memory_reads": 4})
    space_c = make_space("Space C", slug="space-c")
    spaces = [world.space_a, world.space_b, space_c]
    backend = make_backend(*spaces)
    root = world.client_for("root")
    url = reverse("sandboxes:platform_pools")

    pooled(spaces[0], backend, 0)
    one, one_reads, html = load(root, url)
    assert len(rows_of(html)) == 1
    assert one_reads == 1

    for n in range(1, 10):
        pooled(spaces[n % 3], backend, n)
    ten, ten_reads, html = load(root, url)
    assert len(rows_of(html)) == 10
    assert ten == one, f"{ten} queries for ten pools, {one} for one"
    assert ten_reads == 4  # the rest are read by the page's follows, from the fifth row on
    assert "snap-1" not in html  # the ready sandboxes run the default template: outdated
    assert html.count('<small class="pool-outdated">outdated, draining</small>') == 5

    ids = [row.split('"')[1].removeprefix("pool-") for row in rows_of(html)]
    follow = re.search(r'hx-get="([^"]+)"', html)
    assert follow is not None
    assert follow.group(1).endswith(f"?after={ids[3]}")  # none read gave a figure to keep
    before = engine_reads()
    followed = root.get(follow.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true").content.decode()
    assert engine_reads() - before == 4
    assert f"?after={ids[7]}" in followed


@pytest.mark.django_db
def test_a_spaces_page_queries_the_same_for_one_pool_and_for_ten(world: World, tuned: Tuned) -> None:
    tuned({"pools.memory_reads": 4})
    backend = make_backend(world.space_a)
    alice = world.client_for("alice")
    url = reverse("sandboxes:space_pools", args=[world.space_a.pk])

    pooled(world.space_a, backend, 0)
    one, one_reads, html = load(alice, url)
    assert len(rows_of(html)) == 1
    assert one_reads == 1

    for n in range(1, 10):
        pooled(world.space_a, backend, n)
    ten, ten_reads, html = load(alice, url)
    assert len(rows_of(html)) == 10
    assert ten == one, f"{ten} queries for ten pools, {one} for one"
    assert ten_reads == 4
    assert html.count('<small class="pool-outdated">outdated, draining</small>') == 5


def warm_pool_lists(cluster: FakeCluster) -> int:
    return sum(n for request, n in cluster.server.served.items() if request.endswith("/sandboxwarmpools"))


@pytest.mark.django_db
def test_pools_the_backend_keeps_are_listed_once_for_any_number_of_configs(
    world: World, fake_cluster: FakeCluster, tuned: Tuned, settings: Any
) -> None:
    settings.CONSOLE_INSTALLATION_ID = "test-native-pool-pages"
    space_c = make_space("Space C", slug="space-c")
    spaces = [world.space_a, world.space_b, space_c]
    backend = make_kube_backend(fake_cluster, *spaces, max_pool_size=4)
    root = world.client_for("root")
    url = reverse("sandboxes:platform_pools")

    make_config(spaces[0], backend=backend, name="native 0", pool_size=1)
    lists = warm_pool_lists(fake_cluster)
    one, _, html = load(root, url)
    assert warm_pool_lists(fake_cluster) - lists == 2  # the load before and the counted one
    assert html.count("kept by the backend itself") == 1

    for n in range(1, 10):
        config = make_config(spaces[n % 3], backend=backend, name=f"native {n}", pool_size=1)
        if n % 2:
            SessionImage.objects.create(
                space=config.space, config=config, snapshot_id=f"snap-{n}", fingerprint=config_fingerprint(config)
            )
    lists = warm_pool_lists(fake_cluster)
    ten, _, html = load(root, url)
    assert warm_pool_lists(fake_cluster) - lists == 2
    assert html.count("kept by the backend itself") == 10
    assert ten == one, f"{ten} queries for ten pools, {one} for one"


def test_the_pages_read_the_pools_memory_on_sqlite_too(tmp_path: Path) -> None:
    # SQLite has no DISTINCT ON: the first ready member of each pool is read without it.
    rerun_on_sqlite(__file__, "a_spaces_page_queries_the_same", tmp_path)
