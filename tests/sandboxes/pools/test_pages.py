"""The Pools pages (a space's, the platform's) and the same numbers on /metrics: what a real
pool on Docker holds and how its claims went; who may see and set a pool's size."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import PoolClaim, PoolMember, SandboxConfig, SessionImage
from sandboxes.pools.keeper import refill
from sandboxes.pools.stats import percentile, read_pools
from sandboxes.sessions.runtime import Runtime
from tests.personas import World

pytestmark = [pytest.mark.docker]


def page(client: Any, space_id: Any) -> Any:
    return client.get(reverse("sandboxes:space_pools", args=[space_id]))


@pytest.mark.django_db
def test_the_pools_page_and_metrics_show_a_filled_pool_and_its_claims(
    world: World, session_config: SandboxConfig, settings: Any
) -> None:
    alice = world.client_for("alice")
    answer = alice.post(reverse("sandboxes:pool_size", args=[world.space_a.pk, session_config.pk]), {"pool_size": "2"})
    assert answer.status_code == 302
    session_config.refresh_from_db()
    assert session_config.pool_size == 2
    audit = AuditEvent.objects.filter(action="sandbox_config.update").latest("time")
    assert audit.details["after"] == {"pool_size": "2"}
    refill(session_config)
    resolved = Runtime().resolve(world.space_a, "paged")
    assert resolved.action == "pooled"

    html = page(world.client_for("carol"), world.space_a.pk).content.decode()  # a viewer sees it
    assert 'class="pool-ready">1<' in html
    assert 'class="pool-hit-rate">100%' in html
    assert "1 ready, unclaimed" in html
    assert 'name="pool_size"' not in html  # ... and cannot set it
    (reading,) = read_pools([session_config])
    assert (reading.size, reading.ready, reading.claimed, reading.hits, reading.misses) == (2, 1, 1, 1, 0)
    assert reading.p50_ms is not None
    assert f"{reading.p50_ms:.1f} /" in html
    # Beside the claim, the whole resolve as its caller waited for it (the claim is a step).
    assert reading.ready_p50_ms is not None
    assert reading.ready_p50_ms > reading.p50_ms
    assert f'class="pool-ready-in">{reading.ready_p50_ms:.1f} / {reading.ready_p95_ms:.1f} ms<' in html
    assert re.search(r'class="pool-memory" id="[^"]+">[0-9.]+</td>', html)  # read from the engine

    assert 'hx-trigger="every 3s"' in html  # one short of its size: the page follows it
    refill(session_config)
    full = page(world.client_for("carol"), world.space_a.pk).content.decode()
    assert 'class="pool-ready">2<' in full
    assert 'hx-trigger="every 3s"' not in full

    settings.METRICS_TOKEN = "t0k3n-for-the-scraper"
    scraped = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0k3n-for-the-scraper").content.decode()
    labels = f'config="{session_config.name}",space="{world.space_a.name}"'
    assert f"sandbox_pool_ready{{{labels}}} 2.0" in scraped
    assert f"sandbox_pool_size{{{labels}}} 2.0" in scraped
    assert f"sandbox_pool_hit_ratio{{{labels}}} 1.0" in scraped
    assert "sandbox_pool_claim_p95_ms{" in scraped
    assert f"sandbox_pool_ready_p50_ms{{{labels}}} {reading.ready_p50_ms}" in scraped

    root = world.client_for("root").get(reverse("sandboxes:platform_pools")).content.decode()
    assert session_config.name in root
    assert "Space A" in root


def followed_part(html: str) -> str:
    """What the page's HTMX follow replaces: the numbers that change without a reload."""
    return html.split('<section id="pool-readings"', 1)[1].split("</section>", 1)[0]


@pytest.mark.django_db
def test_a_full_pool_is_still_followed_and_shows_the_image_its_sandboxes_run(
    world: World, session_config: SandboxConfig, docker_base_image: str
) -> None:
    SandboxConfig.objects.filter(pk=session_config.pk).update(pool_size=2)
    session_config.refresh_from_db()
    refill(session_config)
    full = followed_part(page(world.client_for("carol"), world.space_a.pk).content.decode())
    # A full pool drains and refills when a skill is installed elsewhere: the page keeps
    # following it (slower), and its quota line moves with the numbers.
    assert 'hx-trigger="every 10s"' in full
    assert "2 ready, unclaimed" in full
    assert f'class="pool-image"><div>2: <code>{docker_base_image}</code></div>' in full
    # A skill install: the space's image on this config changes; the ready ones are outdated.
    SessionImage.objects.create(
        space=world.space_a,
        config=session_config,
        snapshot_id="snap-walk",
        fingerprint=config_fingerprint(session_config),
    )
    outdated = followed_part(page(world.client_for("carol"), world.space_a.pk).content.decode())
    assert f'2: <code>{docker_base_image}</code> <small class="pool-outdated">outdated, draining</small>' in outdated


@pytest.mark.django_db
def test_following_the_page_keeps_the_memory_it_shows_instead_of_asking_the_engine_again(
    world: World, session_config: SandboxConfig
) -> None:
    """The engine answers a memory reading only at its next stats tick (about a second on
    Docker): the page reads it on a full load, and its follows every few seconds keep it."""
    SandboxConfig.objects.filter(pk=session_config.pk).update(pool_size=1)
    session_config.refresh_from_db()
    refill(session_config)
    carol = world.client_for("carol")
    cell = f'id="pool-memory-{session_config.id}"'
    loaded = page(carol, world.space_a.pk).content.decode()
    assert re.search(cell + r">[0-9.]+</td>", loaded)  # read from the engine
    follow = re.search(r'hx-get="([^"]+)"', followed_part(loaded))
    assert follow is not None
    assert f"shown={session_config.id}" in follow.group(1)
    followed = carol.get(follow.group(1).replace("&amp;", "&"), HTTP_HX_REQUEST="true").content.decode()
    assert f"{cell} hx-preserve></td>" in followed  # HTMX keeps the figure on the page
    assert f"shown={session_config.id}" in followed
    # A follow from a page that showed no figure reads one.
    fresh = carol.get(reverse("sandboxes:space_pools", args=[world.space_a.pk]), HTTP_HX_REQUEST="true")
    assert re.search(cell + r">[0-9.]+</td>", fresh.content.decode())


@pytest.mark.django_db
def test_the_quota_line_tells_ready_sandboxes_from_those_being_made(
    world: World, session_config: SandboxConfig
) -> None:
    """Both count against the quota; only the ready ones are called ready, as in the table."""
    PoolMember.objects.create(space=world.space_a, config=session_config, template_id="x")  # being made
    quota = re.sub(r"\s+", " ", page(world.client_for("carol"), world.space_a.pk).content.decode())
    assert "<strong>1 pooled sandbox(es)</strong> (0 ready, unclaimed; 1 being made) count against it" in quota
    assert "1 ready" not in quota


@pytest.mark.django_db
def test_a_missed_claim_says_why_on_the_page(world: World, session_config: SandboxConfig) -> None:
    SandboxConfig.objects.filter(pk=session_config.pk).update(pool_size=1)
    assert Runtime().resolve(world.space_a, "missed").action == "created"
    html = page(world.client_for("alice"), world.space_a.pk).content.decode()
    assert "1: the pool had no ready sandbox" in html
    assert 'class="pool-hit-rate">0%' in html


@pytest.mark.django_db
def test_only_the_spaces_admins_set_a_size_and_bad_input_changes_nothing(
    world: World, session_config: SandboxConfig
) -> None:
    url = reverse("sandboxes:pool_size", args=[world.space_a.pk, session_config.pk])
    assert world.client_for("bob").post(url, {"pool_size": "1"}).status_code == 403
    assert world.client_for("charlie").post(url, {"pool_size": "1"}).status_code == 404
    assert page(world.client_for("charlie"), world.space_a.pk).status_code == 404
    assert world.client_for("alice").get(reverse("sandboxes:platform_pools")).status_code == 404
    alice = world.client_for("alice")
    for bad in ("lots", "-3", "100000", ""):
        answer = alice.post(url, {"pool_size": bad}, follow=True)
        assert answer.status_code == 200
        assert "message-error" in answer.content.decode()
    session_config.refresh_from_db()
    assert session_config.pool_size == 0
    assert not PoolClaim.objects.exists()
    # Another space's config is not reachable under this space's id.
    theirs = SandboxConfig.objects.create(
        space=world.space_b, backend=session_config.backend, name="b", default_template="x"
    )
    other = reverse("sandboxes:pool_size", args=[world.space_a.pk, theirs.pk])
    assert alice.post(other, {"pool_size": "1"}).status_code == 404


def test_percentiles_are_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([30.0, 10.0, 20.0], 0.5) == 20.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.95) == 95.0
    assert percentile(values, 0.5) == 50.0
