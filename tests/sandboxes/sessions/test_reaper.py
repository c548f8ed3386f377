"""The reaper and the idle sweep against the real Docker engine and real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import docker
import pytest

from console.jobs import run_job, start_job
from console.models import AdminJob, AuditEvent, JobStatus
from console.services import SYSTEM
from sandboxes.backends.base import NetworkSpec, SandboxSpec, SandboxState
from sandboxes.catalog.bridge import console_metadata, get_backend
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions.reaper import idle_sweep, reap_all
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from tests.conftest import REDIS_URL
from tests.personas import World
from tests.support.tuning import Tuned

from .test_runtime import RedisServer, own_redis  # noqa: F401 - the fixture

pytestmark = [pytest.mark.django_db, pytest.mark.docker, pytest.mark.redis]


@pytest.fixture
def config(session_config: SandboxConfig) -> SandboxConfig:
    return session_config


def plant_orphan(config: SandboxConfig, key: str) -> str:
    """A sandbox with this installation's session metadata that no binding owns."""
    info = get_backend(config).create(
        SandboxSpec(
            template_id=config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={**console_metadata(config), "console-session": key},
        )
    )
    return info.sandbox_id


@pytest.fixture
def foreign_container(docker_base_image: str, test_run_id: str) -> Iterator[str]:
    client = docker.from_env()
    container = client.containers.run(
        docker_base_image, detach=True, network_mode="none", labels={"test-run": test_run_id}
    )
    try:
        yield container.id
    finally:
        container.remove(force=True)
        client.close()


def exists(container_id: str) -> bool:
    try:
        docker.from_env().containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_reaper_deletes_orphans_keeps_bound_paused_and_ignores_foreign(
    world: World, config: SandboxConfig, foreign_container: str
) -> None:
    store = RedisSessionStore(REDIS_URL)
    runtime = Runtime(store)
    bound = runtime.resolve(world.space_a, "reaper-bound")
    runtime.pause(bound.session, actor=SYSTEM)
    orphan = plant_orphan(config, "reaper-orphan")

    young = reap_all(store, grace=timedelta(hours=1))
    assert young[0].deleted == []
    assert young[0].too_young == 1
    assert exists(orphan)

    reports = reap_all(store, grace=timedelta(0))
    assert reports[0].deleted == [orphan]
    assert reports[0].bound == 1
    assert not exists(orphan)
    assert get_backend(config).get(bound.sandbox.sandbox_id).state == SandboxState.PAUSED
    assert exists(foreign_container)


def test_reaper_deletes_nothing_when_the_store_does_not_answer(
    world: World,
    config: SandboxConfig,
    own_redis: RedisServer,  # noqa: F811
) -> None:
    orphan = plant_orphan(config, "reaper-unknown")
    own_redis.stop()
    reports = reap_all(RedisSessionStore(own_redis.url, timeout_s=0.5), grace=timedelta(0))
    assert reports[0].deleted == []
    assert "session store unavailable" in reports[0].errors[0]
    assert exists(orphan)
    own_redis.start()


def test_reaper_pass_is_an_audited_job(tuned: Tuned, world: World, config: SandboxConfig, settings: Any) -> None:
    tuned({"sessions.reaper_grace_s": 0})
    orphan = plant_orphan(config, "reaper-job")
    job = start_job("sandboxes.reap", actor=SYSTEM)
    run_job(str(job.id))
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert job.result["deleted"] >= 1
    assert not exists(orphan)
    assert AuditEvent.objects.filter(action="job.start", details__kind="sandboxes.reap").count() == 1
    assert AdminJob.objects.filter(kind="sandboxes.reap").count() == 1


def test_idle_sweep_pauses_idle_sessions_and_resolve_brings_them_back(world: World, config: SandboxConfig) -> None:
    runtime = Runtime(RedisSessionStore(REDIS_URL))
    busy = runtime.resolve(world.space_a, "idle-busy")
    idle = runtime.resolve(world.space_a, "idle-idle")
    from sandboxes.backends.base import ExecRequest

    runtime.exec(idle.session, ExecRequest(shell="echo still-here > /workspace/keep"))
    from django.utils import timezone

    Session.objects.filter(pk=idle.session.pk).update(last_activity=timezone.now() - timedelta(hours=2))
    assert idle_sweep(runtime) == 1
    idle.session.refresh_from_db()
    busy.session.refresh_from_db()
    assert idle.session.state == SessionState.PAUSED
    assert busy.session.state == SessionState.RUNNING
    assert get_backend(config).get(idle.sandbox.sandbox_id).state == SandboxState.PAUSED
    back = runtime.resolve(world.space_a, "idle-idle")
    assert back.sandbox.state == SandboxState.RUNNING
    assert runtime.exec(back.session, ExecRequest(shell="cat /workspace/keep")).stdout == b"still-here\n"


def test_a_jobs_sandbox_gets_the_longer_job_grace(world: World, config: SandboxConfig) -> None:
    from sandboxes.backends.base import META_PURPOSE

    build = get_backend(config).create(
        SandboxSpec(
            template_id=config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata=console_metadata(config, **{META_PURPOSE: "skill-build"}),
        )
    )
    orphan = plant_orphan(config, "reaper-plain")
    reports = reap_all(RedisSessionStore(REDIS_URL), grace=timedelta(0))
    assert reports[0].deleted == [orphan]
    assert exists(build.sandbox_id)  # a build may run longer than the session grace


def test_a_jobs_sandbox_whose_job_ended_gets_the_session_grace(world: World, config: SandboxConfig) -> None:
    # A restart fails the job of a skill build; its build sandbox must not run on for the hour
    # a live build may take.
    from sandboxes.backends.base import META_JOB, META_PURPOSE

    ended = start_job("sandboxes.reap", actor=SYSTEM)
    AdminJob.objects.filter(pk=ended.pk).update(status=JobStatus.FAILED, error="Interrupted by a restart")
    running = start_job("sandboxes.reap", actor=SYSTEM)
    AdminJob.objects.filter(pk=running.pk).update(status=JobStatus.RUNNING)
    builds = {
        name: get_backend(config).create(
            SandboxSpec(
                template_id=config.default_template,
                network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
                metadata=console_metadata(config, **{META_PURPOSE: "skill-build", META_JOB: str(job.pk)}),
            )
        )
        for name, job in (("ended", ended), ("running", running))
    }
    reports = reap_all(RedisSessionStore(REDIS_URL), grace=timedelta(0))
    assert reports[0].deleted == [builds["ended"].sandbox_id]
    assert not exists(builds["ended"].sandbox_id)
    assert exists(builds["running"].sandbox_id)  # its job still runs: the job grace holds
