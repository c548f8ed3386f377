"""An adversarial review of issue 10's promises: interleavings the first tests left out, on the
real Docker engine (or the fake E2B server where a slow control plane is the fault), the
database store on the test database, and real threads with their own connections.
"""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from console.services import SYSTEM, Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import ExecRequest, SandboxState
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.provisioning import backend_for
from sandboxes.sessions.reaper import idle_sweep
from sandboxes.sessions.runtime import Resolved, Runtime
from sandboxes.sessions.store import SessionStore, lock_key
from sandboxes.sessions.store_db import DatabaseSessionStore
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.sandboxes.backends.docker.test_engine_loss import proxied_config, proxy  # noqa: F401 - fixtures
from tests.sandboxes.sessions.test_runtime import sandboxes_of
from tests.sandboxes.sessions.test_runtime_invariants import db_store, e2b_config  # noqa: F401 - fixtures
from tests.support.engine_proxy import EngineProxy
from tests.support.sqlite_rerun import rerun_on_sqlite

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def config(session_config: SandboxConfig) -> SandboxConfig:
    return session_config


def _expire_lease(key: str) -> None:
    """The lease of `key` runs out now (as a stalled holder's would): its row says so."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE sandboxes_store_lease SET expires_ms = 0 WHERE key = %s", [key])


def _wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.e2b
def test_a_holder_whose_lease_ran_out_mid_create_leaves_no_orphan_when_another_bound(
    world: World,
    e2b_config: SandboxConfig,  # noqa: F811
    fake_e2b: FakeHandle,
) -> None:
    """A's create is slow; its lease runs out; B takes the lock, sees nothing yet (A's create
    has not reached the control plane's list), creates and binds. A must end on B's sandbox
    and delete its own, not leave it for the reaper's grace."""
    key = "s-lease-orphan"
    get_or_create_session(world.space_a, key)
    lkey = lock_key(world.space_a.id, key)
    fake_e2b.set_fault("latency", delay=3.0, method="POST", path="/v2/sandboxes$", plane="api", times=1)
    results: dict[str, Resolved | BaseException] = {}

    def holder_a() -> None:
        try:
            results["a"] = Runtime(DatabaseSessionStore(), lock_ttl_ms=3000).resolve(world.space_a, key)
        except BaseException as exc:  # reported by the assertion below
            results["a"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder_a)
    thread.start()
    store = DatabaseSessionStore()
    _wait_for(lambda: store.lock_holder(lkey) is not None)
    time.sleep(0.5)  # A is inside its slow create now
    _expire_lease(lkey)
    b = Runtime(DatabaseSessionStore()).resolve(world.space_a, key)
    assert b.action == "created"
    thread.join(timeout=60)
    a = results["a"]
    assert isinstance(a, Resolved), a
    assert a.sandbox.sandbox_id == b.sandbox.sandbox_id  # one binding
    # A's own sandbox was deleted by A, not left unbound (an orphan until the reaper's grace).
    assert sandboxes_of(e2b_config, key) == [b.sandbox.sandbox_id]


# --- A DELETE racing the agent's calls on a session whose sandbox is running ------------------


def test_calls_racing_a_delete_of_a_running_session_never_answer_5xx(
    world: World,
    config: SandboxConfig,
    db_store: SessionStore,  # noqa: F811
) -> None:
    """The first race test began with no sandbox (every call queued on the lock). Here the
    sandbox runs, so the calls take the fast path beside the DELETE: exec, PUT input, resolve,
    a background command, a collect and a terminal opened from the UI, all while the sandbox
    and then the row are deleted."""
    _, token = do_create_api_token(world.space_a, name="racer", actor=Actor(user=world.alice))
    headers = {"Authorization": f"Bearer {token}"}
    base = f"/api/v1/spaces/{world.space_a.id}/sessions"
    seen: list[tuple[str, int, bytes]] = []
    for round_ in range(3):
        key = f"s-delete-running-{round_}"
        Runtime(db_store).resolve(world.space_a, key)
        session_id = Session.objects.get(space=world.space_a, key=key).id
        barrier = threading.Barrier(8)

        def call(kind: str, key: str = key, barrier: threading.Barrier = barrier, sid: Any = session_id) -> None:
            client = Client(raise_request_exception=False)
            try:
                barrier.wait()
                for _ in range(12 if kind != "delete" else 1):
                    time.sleep(0.08)
                    if kind == "delete":
                        time.sleep(0.2)
                        response = client.delete(f"{base}/{key}", headers=headers)
                    elif kind == "exec":
                        response = client.post(
                            f"{base}/{key}/exec",
                            {"shell": "sleep 0.3; echo hi"},
                            content_type="application/json",
                            headers=headers,
                        )
                    elif kind == "input":
                        response = client.put(
                            f"{base}/{key}/input/f.txt", b"x", content_type="application/octet-stream", headers=headers
                        )
                    elif kind == "resolve":
                        response = client.post(
                            f"{base}/{key}/resolve", "", content_type="application/json", headers=headers
                        )
                    elif kind == "command":
                        response = client.post(
                            f"{base}/{key}/commands",
                            {"shell": "sleep 0.1"},
                            content_type="application/json",
                            headers=headers,
                        )
                    elif kind == "collect":
                        response = client.post(
                            f"{base}/{key}/artifacts/collect", "", content_type="application/json", headers=headers
                        )
                    elif kind == "files":
                        response = client.get(f"{base}/{key}/files", headers=headers)
                    else:
                        client.force_login(world.bob)
                        response = client.post(f"/sessions/{sid}/terminals/")
                    seen.append((kind, response.status_code, response.content[:300]))
            finally:
                connections.close_all()

        kinds = ["delete", "exec", "input", "resolve", "command", "collect", "files", "terminal"]
        threads = [threading.Thread(target=call, args=(kind,)) for kind in kinds]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        # The resolve and the PUT may re-create the session after the DELETE: delete it again.
        again = Session.objects.filter(space=world.space_a, key=key).first()
        if again is not None:
            Runtime(db_store).delete(again, actor=SYSTEM)
    server_errors = [s for s in seen if s[1] >= 500]
    assert server_errors == [], server_errors
    assert [s[1] for s in seen if s[0] == "delete"] == [204, 204, 204]


# --- An exec whose process was killed never keeps its session from idling ---------------------


def _exec_then_get_killed(space_id: str, key: str) -> None:
    """A console process running a long exec (it is killed -9 by the test mid-way)."""
    from sandboxes.sessions import provisioning

    provisioning._backends.clear()  # the parent's engine connections are not ours
    session = Session.objects.select_related("config", "space").get(space_id=space_id, key=key)
    Runtime(DatabaseSessionStore()).exec(session, ExecRequest(shell="sleep 60", timeout_s=5))


def test_an_exec_killed_mid_way_does_not_make_its_session_unidleable(world: World, config: SandboxConfig) -> None:
    import multiprocessing
    import os
    import signal

    runtime = Runtime(DatabaseSessionStore())
    session = runtime.resolve(world.space_a, "s-exec-leak").session
    connections.close_all()
    child = multiprocessing.get_context("fork").Process(
        target=_exec_then_get_killed, args=(str(world.space_a.id), "s-exec-leak")
    )
    child.start()
    _wait_for(lambda: Session.objects.filter(pk=session.pk, execs_in_flight__gt=0).exists(), 60)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)  # its `finally` never runs: the count stays up
    child.join(timeout=30)
    # Past that exec's timeout and grace (the trust in its count ran out) ...
    Session.objects.filter(pk=session.pk).update(exec_deadline=timezone.now() - timedelta(seconds=1))
    # ... the agent runs one more short exec, which ends normally.
    result = runtime.exec(session, ExecRequest(shell="true", timeout_s=5))
    assert result.exit_code == 0
    row = Session.objects.get(pk=session.pk)
    assert row.execs_in_flight == 0, "a dead exec is still counted in flight"
    # Quiet since: the sweep idles it (it used to wait for that last exec's timeout + grace,
    # and with every further exec again, so a busy-ish agent's session never idled).
    Session.objects.filter(pk=session.pk).update(last_activity=timezone.now() - timedelta(hours=2))
    assert idle_sweep(runtime) == 1
    assert Session.objects.get(pk=session.pk).state == SessionState.PAUSED


# --- The idle sweep racing an exec that starts right after its check ---------------------------


def test_an_exec_starting_while_the_sweep_idles_its_session_runs_to_the_end(
    world: World,
    proxy: EngineProxy,  # noqa: F811
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    """The sweep has checked (nothing in flight) and its pause is on its way to the engine;
    an exec starts now. The exec must not run into a frozen (or freezing) sandbox: it waits
    for the sweep, then resumes the sandbox, and ends with its output."""
    runtime = Runtime(DatabaseSessionStore())
    session = runtime.resolve(world.space_a, "s-sweep-exec").session
    Session.objects.filter(pk=session.pk).update(last_activity=timezone.now() - timedelta(hours=2))
    proxy.hold(r"^POST /[^ ]*/containers/[^/]+/pause")
    swept: list[int] = []

    def sweep() -> None:
        try:
            swept.append(idle_sweep(Runtime(DatabaseSessionStore())))
        finally:
            connections.close_all()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    _wait_for(lambda: proxy.requests(r"/pause$"), 30)
    results: list[Any] = []

    def agent_exec() -> None:
        try:
            request = ExecRequest(shell="sleep 1; echo done", timeout_s=8)
            results.append(runtime.exec(Session.objects.select_related("config", "space").get(pk=session.pk), request))
        except Exception as exc:  # reported by the assertion below
            results.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=agent_exec)
    worker.start()
    # Let the exec get as far as it can (to its process, on the old code), then let the pause on.
    with contextlib.suppress(AssertionError):
        _wait_for(lambda: proxy.requests(r"^POST /[^ ]*/exec/[^/]+/start"), 3)
    time.sleep(0.3)
    proxy.release()
    sweeper.join(timeout=60)
    worker.join(timeout=60)
    assert swept == [1]  # the sweep did idle it ...
    (result,) = results
    assert not isinstance(result, Exception), result
    assert (result.exit_code, result.timed_out, result.stdout.strip()) == (0, False, b"done")
    sandbox_id = Session.objects.get(pk=session.pk).sandbox_id
    assert backend_for(proxied_config).get(sandbox_id).state == SandboxState.RUNNING  # resumed


# --- Processes resolving one session at once (PostgreSQL here, SQLite in a child run) ----------


def _resolve_in_a_process(space_id: str, key: str, start_at: float, out: Any) -> None:
    from console.models import Space
    from sandboxes.sessions import provisioning

    provisioning._backends.clear()  # the parent's engine connections are not ours
    try:
        space = Space.objects.get(pk=space_id)
        time.sleep(max(0.0, start_at - time.time()))
        resolved = Runtime(DatabaseSessionStore()).resolve(space, key)
        out.put(("ok", resolved.sandbox.sandbox_id, resolved.action))
    except BaseException as exc:  # reported by the parent
        out.put(("error", f"{exc.__class__.__name__}: {exc}", ""))
    finally:
        connections.close_all()


def test_processes_resolving_one_new_session_at_once_share_one_sandbox(world: World, config: SandboxConfig) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    out = context.Queue()
    key = "s-processes"
    connections.close_all()
    start_at = time.time() + 1.0
    children = [
        context.Process(target=_resolve_in_a_process, args=(str(world.space_a.id), key, start_at, out))
        for _ in range(4)
    ]
    for child in children:
        child.start()
    answers = [out.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=30)
    assert [a for a in answers if a[0] != "ok"] == []
    assert len({a[1] for a in answers}) == 1, answers
    assert sorted(a[2] for a in answers).count("created") == 1, answers
    assert sandboxes_of(config, key) == [answers[0][1]]


@pytest.mark.slow
def test_the_review_races_hold_on_sqlite_too(tmp_path: Any) -> None:
    """The process race, the killed exec and the sweep races in a child run on SQLite."""
    tail = rerun_on_sqlite(__file__, "processes or unidleable or sweep", tmp_path)
    assert "4 passed" in tail, tail


# --- One turn, many resolves at once: the ticket is used once ----------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("store_name", ["database", "redis"])
def test_concurrent_resolves_of_one_turn_rebuild_a_stale_sandbox_once(
    world: World, config: SandboxConfig, store_name: str
) -> None:
    from sandboxes.catalog.services import mark_space_stale
    from sandboxes.sessions.store import RedisSessionStore
    from tests.conftest import REDIS_URL

    def store() -> SessionStore:
        return DatabaseSessionStore() if store_name == "database" else RedisSessionStore(REDIS_URL)

    key = f"s-turn-burst-{store_name}"
    first = Runtime(store()).resolve(world.space_a, key)
    time.sleep(1.1)  # Docker's creation times are to the second
    mark_space_stale(world.space_a)
    Runtime(store()).begin_turn(first.session)
    barrier = threading.Barrier(6)
    answers: list[Any] = []

    def resolve() -> None:
        try:
            barrier.wait()
            answers.append(Runtime(store()).resolve(world.space_a, key).action)
        except Exception as exc:  # reported by the assertion below
            answers.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resolve) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(map(str, answers)) == ["bound"] * 5 + ["rebuilt"], answers
    later = Runtime(store()).resolve(world.space_a, key)  # same turn: never a second rebuild
    assert later.action == "bound"
    assert sandboxes_of(config, key) == [later.sandbox.sandbox_id]
    assert later.sandbox.sandbox_id != first.sandbox.sandbox_id


# --- The store emptied, then reaper passes in two processes racing a resolve, a rebuild, a delete


def _reap_in_a_process(start_at: float, out: Any) -> None:
    from sandboxes.sessions import provisioning
    from sandboxes.sessions.reaper import ReaperBusy, reap_all

    provisioning._backends.clear()  # the parent's engine connections are not ours
    try:
        time.sleep(max(0.0, start_at - time.time()))
        reports = reap_all(DatabaseSessionStore(), grace=timedelta(0))
        out.put(("ran", [r.as_json() for r in reports]))
    except ReaperBusy:
        out.put(("busy", []))
    except BaseException as exc:  # reported by the parent
        out.put(("error", f"{exc.__class__.__name__}: {exc}"))
    finally:
        connections.close_all()


def test_reaper_passes_after_the_store_was_emptied_race_resolve_rebuild_and_delete(
    world: World, config: SandboxConfig
) -> None:
    import multiprocessing

    from tests.sandboxes.sessions.test_reaper import plant_orphan

    runtime = Runtime(DatabaseSessionStore())
    live = {key: runtime.resolve(world.space_a, key) for key in ("r-running", "r-paused", "r-resolved", "r-rebuilt")}
    runtime.pause(live["r-paused"].session, actor=SYSTEM)
    doomed = runtime.resolve(world.space_a, "r-deleted")
    time.sleep(1.1)  # Docker's creation times are to the second: the duplicate is younger
    duplicate = plant_orphan(config, "r-running")
    with connection.cursor() as cursor:  # the store's tables emptied (a restore, a TRUNCATE)
        cursor.execute("DELETE FROM sandboxes_store_binding")
        cursor.execute("DELETE FROM sandboxes_store_lease")
    connections.close_all()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start_at = time.time() + 1.0
    reapers = [context.Process(target=_reap_in_a_process, args=(start_at, out)) for _ in range(2)]
    for reaper in reapers:
        reaper.start()
    time.sleep(max(0.0, start_at - time.time()))
    resolved = runtime.resolve(world.space_a, "r-resolved")
    rebuilt = runtime.rebuild(live["r-rebuilt"].session, actor=SYSTEM)
    runtime.delete(Session.objects.select_related("config", "space").get(pk=doomed.session.pk), actor=SYSTEM)
    outcomes = [out.get(timeout=120) for _ in reapers]
    for reaper in reapers:
        reaper.join(timeout=30)
    assert [o for o in outcomes if o[0] == "error"] == []
    assert sorted(o[0] for o in outcomes) in (["busy", "ran"], ["ran", "ran"]), outcomes
    # After one more pass (what the racing ones left busy), every live session has one sandbox:
    # its own, paused still paused; the duplicate and the deleted session's sandbox are gone.
    from sandboxes.sessions.reaper import reap_all

    reap_all(DatabaseSessionStore(), grace=timedelta(0))
    assert resolved.sandbox.sandbox_id == live["r-resolved"].sandbox.sandbox_id
    for key in ("r-running", "r-paused", "r-resolved"):
        assert sandboxes_of(config, key) == [live[key].sandbox.sandbox_id], key
    assert duplicate not in sandboxes_of(config, "r-running")
    assert sandboxes_of(config, "r-rebuilt") == [rebuilt.sandbox.sandbox_id]
    assert sandboxes_of(config, "r-deleted") == []
    assert backend_for(config).get(live["r-paused"].sandbox.sandbox_id).state == SandboxState.PAUSED
    for key in ("r-running", "r-paused", "r-resolved"):
        again = runtime.resolve(world.space_a, key)
        assert (again.action, again.sandbox.sandbox_id) == ("bound", live[key].sandbox.sandbox_id), key


# --- Moving a deployment from Redis to the database store ----------------------------------------


@pytest.mark.redis
def test_moving_from_redis_to_the_database_store_keeps_every_session(world: World, config: SandboxConfig) -> None:
    """Bindings in Redis, then REDIS_URL unset (the database store, empty): the first reaper
    pass claims every live sandbox, paused ones included, and deletes none; each session then
    answers with its own sandbox."""
    from sandboxes.sessions.reaper import reap_all
    from sandboxes.sessions.store import RedisSessionStore
    from tests.conftest import REDIS_URL

    before = Runtime(RedisSessionStore(REDIS_URL))
    running = before.resolve(world.space_a, "m-running")
    paused = before.resolve(world.space_a, "m-paused")
    before.pause(paused.session, actor=SYSTEM)

    after = Runtime(DatabaseSessionStore())
    reports = reap_all(after.store, grace=timedelta(0))
    assert reports[0].deleted == []
    assert sorted(reports[0].claimed) == sorted([running.sandbox.sandbox_id, paused.sandbox.sandbox_id])
    assert backend_for(config).get(paused.sandbox.sandbox_id).state == SandboxState.PAUSED
    for old in (running, paused):
        again = after.resolve(world.space_a, old.session.key)
        assert (again.action, again.sandbox.sandbox_id) == ("bound", old.sandbox.sandbox_id)
        assert again.binding.version == old.binding.version


def test_a_command_starting_while_the_sweep_idles_its_session_runs(
    world: World,
    proxy: EngineProxy,  # noqa: F811
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    """As above with a background command (and so a terminal: both resolve, then open a
    process): it must not open its process in the sandbox the sweep is freezing."""
    from sandboxes.sessions.commands import start_command

    runtime = Runtime(DatabaseSessionStore())
    session = runtime.resolve(world.space_a, "s-sweep-command").session
    Session.objects.filter(pk=session.pk).update(last_activity=timezone.now() - timedelta(hours=2))
    proxy.hold(r"^POST /[^ ]*/containers/[^/]+/pause")
    swept: list[int] = []

    def sweep() -> None:
        try:
            swept.append(idle_sweep(Runtime(DatabaseSessionStore())))
        finally:
            connections.close_all()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    _wait_for(lambda: proxy.requests(r"/pause$"), 30)
    results: list[Any] = []

    def agent_command() -> None:
        try:
            fresh = Session.objects.select_related("config", "space").get(pk=session.pk)
            results.append(start_command(runtime, fresh, shell="echo started", actor=SYSTEM))
        except Exception as exc:  # reported by the assertion below
            results.append(exc)
        finally:
            connections.close_all()

    worker = threading.Thread(target=agent_command)
    worker.start()
    with contextlib.suppress(AssertionError):
        _wait_for(lambda: proxy.requests(r"^POST /[^ ]*/exec/[^/]+/start"), 3)
    time.sleep(0.3)
    proxy.release()
    sweeper.join(timeout=60)
    worker.join(timeout=60)
    (result,) = results
    assert not isinstance(result, Exception), result
    sandbox_id = Session.objects.get(pk=session.pk).sandbox_id
    assert backend_for(proxied_config).get(sandbox_id).state == SandboxState.RUNNING
