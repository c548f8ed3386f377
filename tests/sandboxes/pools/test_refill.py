"""Keeping a warm pool: it fills to its size within the platform's limit and the space's
quota (ready sandboxes count against it), drains and refills when a skill image or the
network policy changes, refills by itself after a claim, and goes with its space's teardown.
Real Docker and the database; nothing of ours mocked."""

from __future__ import annotations

import time
from typing import Any

import pytest

from console.models import JobStatus, SpaceLimits
from console.services import SYSTEM, ServiceError
from sandboxes.backends.base import META_INSTALLATION, META_POOL, ExecRequest, ListQuery
from sandboxes.catalog.bridge import config_fingerprint, get_backend
from sandboxes.catalog.services import do_set_session_image
from sandboxes.models import MemberState, PoolMember, SandboxConfig
from sandboxes.pools.keeper import refill
from sandboxes.pools.services import do_set_pool_size
from sandboxes.pools.stats import quota_line
from sandboxes.sessions import limits, teardown
from sandboxes.sessions.runtime import Runtime
from tests.factories import set_policy
from tests.personas import World
from tests.support.jobs import run_to_end
from tests.support.tuning import Tuned

pytestmark = [pytest.mark.docker]


def labelled_pool(config: SandboxConfig) -> dict[str, str]:
    """Pool sandboxes on the engine: sandbox id -> template."""
    from django.conf import settings

    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
    return {i.sandbox_id: i.template_id for i in get_backend(config).iter_sandboxes(query) if i.metadata.get(META_POOL)}


def ready(config: SandboxConfig) -> list[PoolMember]:
    return list(PoolMember.objects.filter(config=config, state=MemberState.READY))


@pytest.mark.django_db
def test_the_size_stays_within_the_platform_limit_and_the_quota(world: World, session_config: SandboxConfig) -> None:
    session_config.backend.max_pool_size = 3
    session_config.backend.save(update_fields=["max_pool_size"])
    SpaceLimits.objects.update_or_create(space=world.space_a, defaults={"live_sessions": 3})
    with pytest.raises(ServiceError, match="at most 3"):
        do_set_pool_size(session_config, 4, actor=SYSTEM)
    with pytest.raises(ServiceError, match="whole number"):
        do_set_pool_size(session_config, "many", actor=SYSTEM)
    with pytest.raises(ServiceError, match="0 or more"):
        do_set_pool_size(session_config, -1, actor=SYSTEM)
    do_set_pool_size(session_config, 3, actor=SYSTEM)
    # Two live sessions leave room for one ready sandbox in a quota of three.
    runtime = Runtime()
    runtime.resolve(world.space_a, "live-1")
    runtime.resolve(world.space_a, "live-2")
    report = refill(session_config)
    assert len(report.made) == 1
    line = quota_line(world.space_a)
    assert (line.maximum, line.live_sessions, line.pooled) == (3, 2, 1)
    # A smaller size drains what is over it.
    do_set_pool_size(session_config, 0, actor=SYSTEM)
    assert len(refill(session_config).drained) == 1
    assert not labelled_pool(session_config)


@pytest.mark.django_db
def test_a_new_skill_image_drains_the_pool_and_refills_it_from_the_image(
    world: World, session_config: SandboxConfig, test_run_id: str
) -> None:
    do_set_pool_size(session_config, 2, actor=SYSTEM)
    refill(session_config)
    old = {m.sandbox_id for m in ready(session_config)}
    backend = get_backend(session_config)
    snapshots = backend.snapshots()
    assert snapshots is not None
    image = snapshots.create(next(iter(old)), labels={"test-run": test_run_id})
    do_set_session_image(
        world.space_a,
        session_config,
        snapshot_id=image.snapshot_id,
        fingerprint=config_fingerprint(session_config),
        label="a skill",
        actor=SYSTEM,
    )
    report = refill(session_config)
    assert set(report.drained) == old
    assert len(report.made) == 2
    assert {m.template_id for m in ready(session_config)} == {image.snapshot_id}
    assert set(labelled_pool(session_config)) == {m.sandbox_id for m in ready(session_config)}
    resolved = Runtime().resolve(world.space_a, "after-install")
    assert resolved.action == "pooled"
    assert resolved.session.template_id == image.snapshot_id


@pytest.mark.django_db
def test_a_policy_change_drains_the_pool(world: World, session_config: SandboxConfig) -> None:
    do_set_pool_size(session_config, 1, actor=SYSTEM)
    refill(session_config)
    (before,) = ready(session_config)
    set_policy(world.space_a, allow_internet_access=False, allow_public_traffic=True)
    report = refill(session_config)
    assert report.drained == [before.sandbox_id]
    (after,) = ready(session_config)
    assert after.policy_fingerprint != before.policy_fingerprint
    assert set(labelled_pool(session_config)) == {after.sandbox_id}


@pytest.mark.django_db(transaction=True)
def test_a_claim_refills_the_pool_in_the_background(world: World, session_config: SandboxConfig, tuned: Tuned) -> None:
    tuned({"pools.refill_on_change": True})
    do_set_pool_size(session_config, 1, actor=SYSTEM)
    deadline = time.monotonic() + 60
    while not ready(session_config) and time.monotonic() < deadline:
        time.sleep(0.2)
    (first,) = ready(session_config)
    resolved = Runtime().resolve(world.space_a, "kicks")
    assert resolved.sandbox.sandbox_id == first.sandbox_id
    while not ready(session_config) and time.monotonic() < deadline:
        time.sleep(0.2)
    (second,) = ready(session_config)
    assert second.sandbox_id != first.sandbox_id
    # Let this process's refill threads end before the test's rows go.
    while PoolMember.objects.filter(config=session_config, state=MemberState.REFILLING).exists():
        time.sleep(0.2)


@pytest.mark.django_db
def test_the_teardown_of_a_space_removes_its_pools(world: World, session_config: SandboxConfig, engine: Any) -> None:
    do_set_pool_size(session_config, 2, actor=SYSTEM)
    refill(session_config)
    Runtime().resolve(world.space_a, "torn")
    assert len(labelled_pool(session_config)) == 2  # one ready, one claimed
    volumes = {m.workspace_volume for m in PoolMember.objects.filter(config=session_config)}
    job = teardown.start_teardown(teardown.KIND_SPACE, world.space_a, str(world.space_a.pk), actor=SYSTEM)
    # While the space is being deleted, its pool only drains.
    report = refill(session_config)
    assert report.made == []
    assert len(report.drained) == 1
    finished = run_to_end(str(job.pk))
    assert finished.status == JobStatus.SUCCEEDED, finished.log
    assert not labelled_pool(session_config)
    assert not PoolMember.objects.exists()
    left = {v["Name"] for v in engine.volumes().get("Volumes") or []}
    assert not left & volumes


@pytest.mark.django_db
def test_a_ready_sandbox_gone_behind_the_pools_back_is_replaced_not_handed_out(
    world: World, session_config: SandboxConfig
) -> None:
    do_set_pool_size(session_config, 2, actor=SYSTEM)
    refill(session_config)
    lost, kept = ready(session_config)
    get_backend(session_config).delete(lost.sandbox_id)  # an engine restart, an admin's docker rm
    report = refill(session_config)
    assert report.drained == [lost.sandbox_id]
    assert len(report.made) == 1
    assert {m.sandbox_id for m in ready(session_config)} == {kept.sandbox_id, *report.made}
    runtime = Runtime()
    for key in ("after-loss-1", "after-loss-2"):
        resolved = runtime.resolve(world.space_a, key)
        assert resolved.action == "pooled"
        result = runtime.exec(resolved.session, ExecRequest(shell="true", timeout_s=30))
        assert result.exit_code == 0


@pytest.mark.django_db
def test_a_config_change_drains_the_pool_so_no_claim_gets_the_old_resources(
    world: World, session_config: SandboxConfig
) -> None:
    from sandboxes.backends.docker.backend import DockerBackend
    from sandboxes.catalog.services import do_update_config

    do_set_pool_size(session_config, 1, actor=SYSTEM)
    refill(session_config)
    (before,) = ready(session_config)
    memory = (session_config.memory_mb or 512) // 2
    do_update_config(session_config, data={"memory_mb": memory}, api_key=None, actor=SYSTEM)
    session = Runtime().resolve(world.space_a, "after-the-change").session
    assert session.sandbox_id != before.sandbox_id, "a sandbox made under the old config was handed out"
    backend = get_backend(session_config)
    assert isinstance(backend, DockerBackend)
    assert backend.engine.api.inspect_container(session.sandbox_id)["HostConfig"]["Memory"] == memory * 1024 * 1024
    assert before.sandbox_id in refill(session_config).drained  # the next refill drains it
    assert before.sandbox_id not in labelled_pool(session_config)


@pytest.mark.django_db
def test_a_lowered_quota_drains_ready_sandboxes_past_it(world: World, session_config: SandboxConfig) -> None:
    SpaceLimits.objects.update_or_create(space=world.space_a, defaults={"live_sessions": 3})
    do_set_pool_size(session_config, 2, actor=SYSTEM)
    refill(session_config)
    Runtime().resolve(world.space_a, "live-1")  # takes one over; the refill makes it up
    refill(session_config)
    assert quota_line(world.space_a).pooled == 2
    SpaceLimits.objects.filter(space=world.space_a).update(live_sessions=2)
    limits._limits_cache.clear()
    report = refill(session_config)
    assert len(report.drained) == 1
    line = quota_line(world.space_a)
    assert (line.maximum, line.live_sessions, line.pooled) == (2, 1, 1)
    assert len(labelled_pool(session_config)) == 2  # the claimed one and one ready
