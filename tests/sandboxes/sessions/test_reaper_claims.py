"""The reaper claims before it deletes, one pass at a time; the idle sweep leaves busy sessions
alone; housekeeping jobs are pruned and kept out of the default lists. Real Docker, the
database store (the embedded default) and Redis; nothing of ours mocked.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from console.jobs import run_job, start_job
from console.models import AdminJob, JobStatus
from console.services import SYSTEM
from sandboxes.backends.base import ExecRequest, SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import BackgroundCommand, SandboxConfig, Session, SessionState, Terminal
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.reaper import REAPER_LOCK, ReaperBusy, idle_sweep, reap_all
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore, SessionStore, lifecycle_lock
from sandboxes.sessions.store_db import DatabaseSessionStore
from tests.conftest import REDIS_URL
from tests.personas import World
from tests.support.tuning import Tuned

from .test_reaper import exists, plant_orphan
from .test_runtime import RedisServer, own_redis, sandboxes_of  # noqa: F401 - the fixture

pytestmark = [pytest.mark.docker]


@pytest.fixture
def config(session_config: SandboxConfig) -> SandboxConfig:
    return session_config


@pytest.fixture(params=["database", "redis"])
def store(request: pytest.FixtureRequest) -> SessionStore:
    if request.param == "redis":
        from tests.conftest import require_service

        require_service("redis")
        return RedisSessionStore(REDIS_URL)
    return DatabaseSessionStore()


def forget_binding(runtime: Runtime, session: Session) -> None:
    """What a restart with the memory store did, or Redis coming back empty (FLUSHDB)."""
    bkey = runtime.keys(session)[0]
    binding = runtime.store.get_binding(bkey)
    assert binding is not None
    assert runtime.store.delete_binding_if(bkey, binding)


@pytest.mark.django_db
def test_an_unbound_sandbox_of_a_live_session_is_claimed_never_deleted(
    world: World, config: SandboxConfig, store: SessionStore
) -> None:
    runtime = Runtime(store)
    paused = runtime.resolve(world.space_a, "reap-live-paused")
    runtime.pause(paused.session, actor=SYSTEM)
    running = runtime.resolve(world.space_a, "reap-live-running")
    for resolved in (paused, running):
        forget_binding(runtime, resolved.session)
    orphan = plant_orphan(config, "reap-no-session")  # no such session: a true leftover

    reports = reap_all(store, grace=timedelta(0))

    assert sorted(reports[0].claimed) == sorted([paused.sandbox.sandbox_id, running.sandbox.sandbox_id])
    assert reports[0].deleted == [orphan]
    assert exists(paused.sandbox.sandbox_id)
    assert exists(running.sandbox.sandbox_id)
    assert get_backend(config).get(paused.sandbox.sandbox_id).state == SandboxState.PAUSED  # claimed, not resumed
    # The next resolves find their own sandboxes bound: the same ids, nothing created.
    assert runtime.resolve(world.space_a, "reap-live-paused").action == "bound"
    again = runtime.resolve(world.space_a, "reap-live-running")
    assert again.action == "bound"
    assert again.sandbox.sandbox_id == running.sandbox.sandbox_id
    # The claim kept the sandbox's own start time.
    assert again.binding.created_at == get_backend(config).get(running.sandbox.sandbox_id).started_at


@pytest.mark.django_db
def test_duplicates_of_a_session_are_deleted_oldest_kept(world: World, config: SandboxConfig) -> None:
    store = DatabaseSessionStore()
    runtime = Runtime(store)
    first = runtime.resolve(world.space_a, "reap-dupes")
    forget_binding(runtime, first.session)
    duplicate = plant_orphan(config, "reap-dupes")  # younger, same session metadata

    reports = reap_all(store, grace=timedelta(0))

    assert reports[0].claimed == [first.sandbox.sandbox_id]
    assert reports[0].deleted == [duplicate]
    assert sandboxes_of(config, "reap-dupes") == [first.sandbox.sandbox_id]
    # And a duplicate of a session that is bound goes too, the bound one stays.
    extra = plant_orphan(config, "reap-dupes")
    assert reap_all(store, grace=timedelta(0))[0].deleted == [extra]
    assert sandboxes_of(config, "reap-dupes") == [first.sandbox.sandbox_id]


@pytest.mark.django_db(transaction=True)
def test_one_reaper_pass_at_a_time(world: World, config: SandboxConfig) -> None:
    store = DatabaseSessionStore()
    orphan = plant_orphan(config, "reap-one-pass")
    with lifecycle_lock(store, REAPER_LOCK, wait_s=0, holder="another process"):
        with pytest.raises(ReaperBusy):
            reap_all(store, grace=timedelta(0))
        assert exists(orphan)
    assert reap_all(store, grace=timedelta(0))[0].deleted == [orphan]


@pytest.mark.django_db(transaction=True)
def test_a_session_being_resolved_is_left_to_its_lock_holder(world: World, config: SandboxConfig) -> None:
    store = DatabaseSessionStore()
    session = get_or_create_session(world.space_a, "reap-busy")
    mid_create = plant_orphan(config, "reap-busy")  # a resolve's sandbox, not bound yet
    with lifecycle_lock(store, Runtime.keys(session)[1], wait_s=0, holder="a resolve"):
        report = reap_all(store, grace=timedelta(0))[0]
    assert report.busy == 1
    assert report.deleted == []
    assert exists(mid_create)


# --- Housekeeping jobs ----------------------------------------------------------------------


@pytest.mark.django_db
def test_housekeeping_jobs_are_pruned_failed_ones_too_and_hidden_by_default(
    tuned: Tuned, world: World, config: SandboxConfig, settings: Any
) -> None:
    tuned({"jobs.housekeeping_retention_s": 3600})
    old = timezone.now() - timedelta(hours=2)
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        for kind in ("sandboxes.reap", "sandboxes.idle_sweep"):
            job = AdminJob.objects.create(kind=kind, status=status)
            AdminJob.objects.filter(pk=job.pk).update(created=old)
    for kind in ("sandboxes.reap", "sandboxes.idle_sweep"):
        run_job(str(start_job(kind, actor=SYSTEM).id))
    assert AdminJob.objects.filter(created__lt=timezone.now() - timedelta(hours=1)).count() == 0
    assert AdminJob.objects.filter(kind__in=["sandboxes.reap", "sandboxes.idle_sweep"]).count() == 2

    mine = AdminJob.objects.create(kind="sandboxes.test_connection", status=JobStatus.SUCCEEDED)
    client = world.client_for("root")
    dashboard = client.get("/").content.decode()
    assert str(mine.id) in dashboard
    assert "Reaper pass" not in dashboard
    # The results only: the kind filter offers every kind, these included.
    default = client.get("/jobs/").content.decode().split('id="job-results"', 1)[1]
    assert str(mine.id) in default
    assert "Reaper pass" not in default
    assert "Idle sweep" not in default
    shown = client.get("/jobs/", {"housekeeping": "only"}).content.decode().split('id="job-results"', 1)[1]
    assert "Reaper pass" in shown
    assert "Idle sweep" in shown
    assert str(mine.id) not in shown


# --- The idle sweep ---------------------------------------------------------------------------


def _age(session: Session) -> None:
    Session.objects.filter(pk=session.pk).update(last_activity=timezone.now() - timedelta(hours=2))


@pytest.mark.django_db(transaction=True)
def test_the_idle_sweep_skips_sessions_with_work_in_them(world: World, config: SandboxConfig) -> None:
    store = DatabaseSessionStore()
    runtime = Runtime(store)
    keys = ["idle-command", "idle-terminal", "idle-turn", "idle-exec", "idle-quiet"]
    sessions = {key: runtime.resolve(world.space_a, key).session for key in keys}
    BackgroundCommand.objects.create(session=sessions["idle-command"], shell="sleep 600")
    Terminal.objects.create(session=sessions["idle-terminal"], user=world.alice, opened=timezone.now())
    runtime.begin_turn(sessions["idle-turn"])

    # A long exec: in flight while the sweep runs.
    started = threading.Event()

    def long_exec() -> None:
        try:
            started.set()
            runtime.exec(sessions["idle-exec"], ExecRequest(shell="sleep 4", timeout_s=30))
        finally:
            connections.close_all()

    worker = threading.Thread(target=long_exec)
    worker.start()
    started.wait()
    deadline = timezone.now() + timedelta(seconds=10)
    while not Session.objects.filter(pk=sessions["idle-exec"].pk, execs_in_flight__gt=0).exists():
        assert timezone.now() < deadline
    for session in sessions.values():
        _age(session)

    assert idle_sweep(runtime) == 1
    worker.join(timeout=60)
    states = dict(Session.objects.filter(key__in=keys).values_list("key", "state"))
    assert states == {
        "idle-command": SessionState.RUNNING,
        "idle-terminal": SessionState.RUNNING,
        "idle-turn": SessionState.RUNNING,
        "idle-exec": SessionState.RUNNING,
        "idle-quiet": SessionState.PAUSED,
    }
    # The exec's end counts as activity: not idle yet.
    assert idle_sweep(runtime) == 0


@pytest.mark.django_db(transaction=True)
def test_the_idle_sweep_idles_under_the_sessions_lock(world: World, config: SandboxConfig) -> None:
    store = DatabaseSessionStore()
    runtime = Runtime(store)
    resolved = runtime.resolve(world.space_a, "idle-locked")
    _age(resolved.session)
    with lifecycle_lock(store, runtime.keys(resolved.session)[1], wait_s=0, holder="a resolve"):
        assert idle_sweep(runtime) == 0  # a resolve (or delete) holds the session: not now
    assert get_backend(config).get(resolved.sandbox.sandbox_id).state == SandboxState.RUNNING
    assert idle_sweep(runtime) == 1


# --- Restarts and an emptied store ------------------------------------------------------------


def _first_console_process(space_id: str, out: Any) -> None:
    """A console process of the embedded mode: resolves two sessions, pauses one, exits."""
    connections.close_all()  # never share the parent's database sockets
    from django.conf import settings

    from console.models import Space
    from sandboxes.sessions import store_select as binding

    settings.REDIS_URL = ""
    binding.set_store(None)  # what settings choose when REDIS_URL is unset
    space = Space.objects.get(pk=space_id)
    runtime = Runtime()
    kept = runtime.resolve(space, "restart-running")
    paused = runtime.resolve(space, "restart-paused")
    runtime.pause(paused.session, actor=SYSTEM)
    out.put((runtime.store.name, kept.sandbox.sandbox_id, paused.sandbox.sandbox_id))
    connections.close_all()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_restart_of_the_embedded_console_loses_no_session(world: World, config: SandboxConfig, settings: Any) -> None:
    import multiprocessing

    from sandboxes.sessions import store_select as binding

    context = multiprocessing.get_context("fork")
    out = context.Queue()
    connections.close_all()
    child = context.Process(target=_first_console_process, args=(str(world.space_a.id), out))
    child.start()
    store_name, running_id, paused_id = out.get(timeout=120)
    child.join(timeout=30)
    assert store_name == "database"

    # The console starts again: a new process, the store its settings choose.
    settings.REDIS_URL = ""
    binding.set_store(None)
    try:
        reports = reap_all(grace=timedelta(0))  # the first pass, past the grace
        assert reports[0].deleted == []
        runtime = Runtime()
        again = runtime.resolve(world.space_a, "restart-running")
        back = runtime.resolve(world.space_a, "restart-paused")
    finally:
        binding.set_store(None)
    assert (again.action, again.sandbox.sandbox_id) == ("bound", running_id)
    assert (back.action, back.sandbox.sandbox_id) == ("bound", paused_id)


@pytest.mark.redis
@pytest.mark.django_db
def test_redis_flushed_then_a_reaper_pass_claims_every_live_sandbox(
    world: World,
    config: SandboxConfig,
    own_redis: RedisServer,  # noqa: F811
) -> None:
    import redis

    store = RedisSessionStore(own_redis.url)
    runtime = Runtime(store)
    ids = {key: runtime.resolve(world.space_a, key).sandbox.sandbox_id for key in ("flush-1", "flush-2", "flush-3")}
    redis.Redis.from_url(own_redis.url).flushdb()

    report = reap_all(store, grace=timedelta(0))[0]

    assert sorted(report.claimed) == sorted(ids.values())
    assert report.deleted == []
    for key, sandbox_id in ids.items():
        resolved = runtime.resolve(world.space_a, key)
        assert (resolved.action, resolved.sandbox.sandbox_id) == ("bound", sandbox_id)
