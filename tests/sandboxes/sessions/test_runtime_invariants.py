"""The runtime's invariants under the races that broke them, on the
real Docker engine with the database store (the embedded default) or Redis.

Each test is the adversary of one promise: a lease running out mid-create, a losing SET NX, a
claim after binding loss, a turn whose first resolve created the sandbox, an id changed by
connect, a DELETE racing the agent's other calls.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from console.services import SYSTEM, Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import META_INSTALLATION, ExecRequest, ListQuery, NetworkSpec, SandboxSpec, SandboxState
from sandboxes.catalog import bridge
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.services import mark_space_stale
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions import store_select as binding_module
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.reaper import idle_sweep, reap_config
from sandboxes.sessions.runtime import Resolved, Runtime
from sandboxes.sessions.store import Binding, RedisSessionStore, SessionStore, lock_key
from sandboxes.sessions.store_db import DatabaseSessionStore
from tests.conftest import REDIS_URL
from tests.factories import make_config
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.sandboxes.backends.docker.test_engine_loss import proxied_config, proxy  # noqa: F401 - fixtures
from tests.support.engine_proxy import EngineProxy
from tests.support.sqlite_rerun import rerun_on_sqlite

from .test_runtime import sandboxes_of

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def config(session_config: SandboxConfig) -> SandboxConfig:
    return session_config


@pytest.fixture
def db_store() -> Iterator[DatabaseSessionStore]:
    """The database store, also as the process's store (the API's `Runtime()`)."""
    store = DatabaseSessionStore()
    binding_module.set_store(store)
    try:
        yield store
    finally:
        binding_module.set_store(None)
        connections.close_all()


# --- A lease that runs out mid-create ------------------------------------------------------


class LeaseStolenInside(DatabaseSessionStore):
    """The real database store; while its holder works under the lock, the lease runs out and
    another process takes the lock for a while (a stalled holder, a store it could not reach)."""

    def __init__(self) -> None:
        super().__init__()
        self.stolen = threading.Event()
        self.bound_while_stolen: list[str] = []
        self._intruder = DatabaseSessionStore()

    def get_binding(self, key: str) -> Binding | None:
        found = super().get_binding(key)
        if not self.stolen.is_set():
            self.stolen.set()
            lkey = key.replace("console:binding:", "console:lock:")
            holder = self.lock_holder(lkey)
            assert holder is not None
            self.release_lock(lkey, holder)  # the lease ran out ...
            assert self._intruder.acquire_lock(lkey, "intruder", 60_000)  # ... and was taken

            def give_back() -> None:
                time.sleep(1.0)
                self._intruder.release_lock(lkey, "intruder")
                connections.close_all()

            threading.Thread(target=give_back, daemon=True).start()
        return found

    def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
        lkey = key.replace("console:binding:", "console:lock:")
        if self.lock_holder(lkey) == "intruder":
            self.bound_while_stolen.append(binding.sandbox_id)
        return super().set_binding_if_absent(key, binding)


def test_a_holder_whose_lease_ran_out_does_not_bind(world: World, config: SandboxConfig) -> None:
    store = LeaseStolenInside()
    resolved = Runtime(store).resolve(world.space_a, "s-lease-lost")
    assert store.bound_while_stolen == []  # never bound on a lease someone else held
    # It started over behind the intruder and claimed what it had made: one sandbox, bound.
    assert resolved.action == "claimed"
    assert sandboxes_of(config, "s-lease-lost") == [resolved.sandbox.sandbox_id]
    assert store.get_binding(Runtime.keys(resolved.session)[0]) == resolved.binding


# --- Losing the SET NX race ---------------------------------------------------------------


class AnotherWriterBindsFirst(DatabaseSessionStore):
    """The real database store; just before our binding write, another writer binds its own
    sandbox (as a holder whose lease had run out would)."""

    def __init__(self, winner: str) -> None:
        super().__init__()
        self.winner = winner

    def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
        if self.winner:
            theirs = Binding(self.winner, binding.version, binding.config_id, binding.created)
            assert super().set_binding_if_absent(key, theirs)
            self.winner = ""
        return super().set_binding_if_absent(key, binding)


def test_losing_the_bind_race_deletes_our_sandbox_and_answers_the_winners(world: World, config: SandboxConfig) -> None:
    session = get_or_create_session(world.space_a, "s-nx-lost")
    # The winner's sandbox, made by "the other writer" outside this session's metadata so the
    # loser's claim step does not find it.
    theirs = get_backend(config).create(
        SandboxSpec(
            template_id=config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={META_INSTALLATION: str(Runtime.session_metadata(session)[META_INSTALLATION]), "other": "1"},
        )
    )
    resolved = Runtime(AnotherWriterBindsFirst(theirs.sandbox_id)).resolve(world.space_a, "s-nx-lost")
    assert resolved.sandbox.sandbox_id == theirs.sandbox_id
    assert resolved.action == "bound"
    assert sandboxes_of(config, "s-nx-lost") == []  # ours was deleted, not left as an orphan


# --- A claim keeps the sandbox's own start time ----------------------------------------------


def test_a_claimed_stale_sandbox_stays_stale(world: World, config: SandboxConfig, db_store: SessionStore) -> None:
    runtime = Runtime(db_store)
    first = runtime.resolve(world.space_a, "s-claim-time")
    started = get_backend(config).get(first.sandbox.sandbox_id).started_at
    assert started is not None
    time.sleep(1.1)
    mark_space_stale(world.space_a)
    runtime.store.delete_binding_if(runtime.keys(first.session)[0], first.binding)  # binding lost
    claimed = runtime.resolve(world.space_a, "s-claim-time")
    assert claimed.action == "claimed"
    assert claimed.sandbox.sandbox_id == first.sandbox.sandbox_id
    assert claimed.binding.created_at == started  # not "now"
    # So it is still known stale, and the next resolve (no turn in flight) rebuilds it.
    again = runtime.resolve(world.space_a, "s-claim-time")
    assert again.action == "rebuilt"
    assert again.sandbox.sandbox_id != first.sandbox.sandbox_id


# --- Every resolve of a turn consumes its ticket -------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("store_name", ["database", "redis"])
def test_a_turn_whose_first_resolve_created_the_sandbox_never_rebuilds_it(
    world: World, config: SandboxConfig, store_name: str
) -> None:
    store: SessionStore = DatabaseSessionStore() if store_name == "database" else RedisSessionStore(REDIS_URL)
    runtime = Runtime(store)
    key = f"s-turn-create-{store_name}"
    session = get_or_create_session(world.space_a, key)
    runtime.begin_turn(session)
    created = runtime.resolve(world.space_a, key)  # the turn's first exec creates the sandbox
    assert created.action == "created"
    mark_space_stale(world.space_a)  # a skill install lands mid-turn
    later = runtime.resolve(world.space_a, key)
    assert later.action == "bound"
    assert later.sandbox.sandbox_id == created.sandbox.sandbox_id
    runtime.end_turn(session)


# --- A sandbox id changed by connect ---------------------------------------------------------


@pytest.fixture
def e2b_config(world: World, fake_e2b: FakeHandle, settings: Any, test_run_id: str) -> Iterator[SandboxConfig]:
    settings.CONSOLE_INSTALLATION_ID = f"test-rebind-{test_run_id}-{uuid.uuid4().hex[:6]}"
    cfg: SandboxConfig = make_config(
        world.space_a,
        # envd on loopback: never a DNS lookup of the domain
        **fake_e2b.platform_fields(sandbox_url=fake_e2b.sandbox_url),
        default_template="base",
        persistent_workspace=False,
        is_default=True,
    )
    try:
        yield cfg
    finally:
        fake_e2b.configure(new_id_on_resume=0)
        backend = get_backend(cfg)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            backend.delete(info.sandbox_id)


@pytest.mark.e2b
def test_a_claimed_sandbox_keeps_its_traffic_token(
    world: World, e2b_config: SandboxConfig, db_store: SessionStore
) -> None:
    runtime = Runtime(db_store)
    first = runtime.resolve(world.space_a, "s-token")
    token = runtime.traffic_token(first.session)
    assert token
    # The binding and the session's copy of the token are lost: the claim brings both back.
    db_store.delete_binding_if(runtime.keys(first.session)[0], first.binding)
    Session.objects.filter(pk=first.session.pk).update(traffic_token_encrypted="")
    claimed = runtime.resolve(world.space_a, "s-token")
    assert claimed.action == "claimed"
    assert claimed.sandbox.sandbox_id == first.sandbox.sandbox_id
    claimed.session.refresh_from_db()
    assert runtime.traffic_token(claimed.session) == token


@pytest.mark.e2b
def test_a_sandbox_id_changed_by_connect_is_rebound_and_not_reaped(
    world: World, e2b_config: SandboxConfig, fake_e2b: FakeHandle, db_store: SessionStore
) -> None:
    runtime = Runtime(db_store)
    first = runtime.resolve(world.space_a, "s-moved")
    get_backend(e2b_config).pause(first.sandbox.sandbox_id)
    fake_e2b.configure(new_id_on_resume=1)  # the control plane answers the resume with a new id
    moved = runtime.resolve(world.space_a, "s-moved")
    assert moved.sandbox.sandbox_id != first.sandbox.sandbox_id
    bound = db_store.get_binding(runtime.keys(first.session)[0])
    assert bound is not None
    assert bound.sandbox_id == moved.sandbox.sandbox_id
    # The reaper, comparing ids, keeps the live sandbox.
    report = reap_config(e2b_config, db_store, grace=timedelta(0))
    assert report.deleted == []
    assert runtime.resolve(world.space_a, "s-moved").sandbox.sandbox_id == moved.sandbox.sandbox_id


# --- A DELETE racing the agent's other calls ---------------------------------------------------


def test_calls_racing_a_session_delete_answer_404_or_409_never_500(
    world: World, config: SandboxConfig, db_store: SessionStore
) -> None:
    _, token = do_create_api_token(world.space_a, name="racer", actor=Actor(user=world.alice))
    headers = {"Authorization": f"Bearer {token}"}
    base = f"/api/v1/spaces/{world.space_a.id}/sessions"
    statuses: list[int] = []
    for round_ in range(4):
        key = f"s-delete-race-{round_}"
        # The session exists, its sandbox not yet: every PUT takes the slow path, one creates,
        # the others and the DELETE queue on the lifecycle lock.
        begun = Client().post(f"{base}/{key}/turns/begin", "", content_type="application/json", headers=headers)
        assert begun.status_code == 200, begun.content
        barrier = threading.Barrier(4)

        def call(kind: str, i: int, key: str = key, barrier: threading.Barrier = barrier) -> None:
            client = Client(raise_request_exception=False)
            try:
                barrier.wait()
                if kind == "delete":
                    time.sleep(0.3)  # behind the creating PUT, beside the waiting ones
                    response = client.delete(f"{base}/{key}", headers=headers)
                else:
                    response = client.put(
                        f"{base}/{key}/input/f{i}.txt",
                        b"data",
                        content_type="application/octet-stream",
                        headers=headers,
                    )
                statuses.append(response.status_code)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=call, args=("put", i)) for i in range(3)]
        threads.append(threading.Thread(target=call, args=("delete", 0)))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not Session.objects.filter(space=world.space_a, key=key).exists()
        assert sandboxes_of(config, key) == []  # nothing created after the delete
        assert db_store.lock_holder(lock_key(world.space_a.id, key)) is None
    assert len(statuses) == 16
    assert set(statuses) <= {201, 204, 404, 409}, statuses
    assert statuses.count(204) == 4


# --- Staleness follows the image that changed ------------------------------------------------


@pytest.mark.django_db
def test_a_new_skill_image_marks_only_the_sessions_of_its_config(world: World, config: SandboxConfig) -> None:
    from sandboxes.catalog.bridge import config_fingerprint
    from sandboxes.catalog.services import do_clear_session_image, do_set_session_image

    other = make_config(world.space_a, name="other", default_template=config.default_template)
    on_image = get_or_create_session(world.space_a, "s-on-image", config=config)
    elsewhere = get_or_create_session(world.space_a, "s-elsewhere", config=other)
    do_set_session_image(
        world.space_a,
        config,
        snapshot_id="snap-new",
        fingerprint=config_fingerprint(config),
        label="skills",
        actor=Actor(user=world.alice),
    )
    on_image.refresh_from_db()
    elsewhere.refresh_from_db()
    assert on_image.stale_at is not None
    assert elsewhere.stale_at is None  # its sessions never start from that image
    do_clear_session_image(world.space_a, config, actor=Actor(user=world.alice))
    elsewhere.refresh_from_db()
    assert elsewhere.stale_at is None


# --- Many writers at once (SQLite: "database is locked") ---------------------------------------


def test_concurrent_agent_calls_never_fail_on_a_locked_database(world: World, db_store: SessionStore) -> None:
    """Session creates (a transaction with its audit row), turn leases, token bookkeeping and
    transactions that read before they write (a skill image recorded) from many threads at
    once: every call answers, none with "database is locked"."""
    from sandboxes.catalog.bridge import config_fingerprint
    from sandboxes.catalog.services import do_set_session_image

    writers = make_config(world.space_a, name="writers", default_template="unused", is_default=True)
    _, token = do_create_api_token(world.space_a, name="writers", actor=Actor(user=world.alice))
    headers = {"Authorization": f"Bearer {token}"}
    base = f"/api/v1/spaces/{world.space_a.id}/sessions"
    statuses: list[int] = []
    barrier = threading.Barrier(24)

    errors: list[str] = []

    def record_images(i: int) -> None:
        try:
            barrier.wait()
            for round_ in range(5):
                do_set_session_image(
                    world.space_a,
                    writers,
                    snapshot_id=f"snap-{i}-{round_}",
                    fingerprint=config_fingerprint(writers),
                    label="race",
                    actor=Actor(user=world.alice),
                )
        except Exception as exc:
            errors.append(f"{exc.__class__.__name__}: {exc}")
        finally:
            connections.close_all()

    def call(i: int) -> None:
        client = Client(raise_request_exception=False)
        try:
            barrier.wait()
            for round_ in range(5):
                key = f"writer-{i}-{round_}" if round_ % 2 else "writer-shared"
                for suffix in ("turns/begin", "turns/end"):
                    response = client.post(
                        f"{base}/{key}/{suffix}", "", content_type="application/json", headers=headers
                    )
                    statuses.append(response.status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    threads += [threading.Thread(target=record_images, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert statuses == [200] * 160, sorted(set(statuses))
    assert Session.objects.filter(space=world.space_a, key__startswith="writer-").count() == 1 + 16 * 2


@pytest.mark.slow
def test_the_runtime_races_hold_on_sqlite_too(tmp_path: Any) -> None:
    """The races above in a child run on SQLite, the embedded default's database."""
    tail = rerun_on_sqlite(__file__, "racing_a_session_delete or locked_database", tmp_path)
    assert "2 passed" in tail, tail


# More interleavings of the same promises: a lease running out mid-create while another binds (a
# slow control plane on the fake E2B server), an exec killed mid-way, execs and commands starting
# while the sweep idles their session, processes resolving one new session at once, one turn's
# concurrent resolves of a stale sandbox, reaper passes after the store was emptied, and a move
# from Redis to the database store.


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
    e2b_config: SandboxConfig,
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
    db_store: SessionStore,
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

    bridge._backends.clear()  # the parent's engine connections are not ours
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
    proxy: EngineProxy,  # noqa: F811 - the fixture
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
    assert get_backend(proxied_config).get(sandbox_id).state == SandboxState.RUNNING  # resumed


# --- Processes resolving one session at once (PostgreSQL here, SQLite in a child run) ----------


def _resolve_in_a_process(space_id: str, key: str, start_at: float, out: Any) -> None:
    from console.models import Space

    bridge._backends.clear()  # the parent's engine connections are not ours
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
def test_the_process_kill_and_idle_races_hold_on_sqlite_too(tmp_path: Any) -> None:
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
    from sandboxes.sessions.reaper import ReaperBusy, reap_all

    bridge._backends.clear()  # the parent's engine connections are not ours
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
    assert get_backend(config).get(live["r-paused"].sandbox.sandbox_id).state == SandboxState.PAUSED
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
    assert get_backend(config).get(paused.sandbox.sandbox_id).state == SandboxState.PAUSED
    for old in (running, paused):
        again = after.resolve(world.space_a, old.session.key)
        assert (again.action, again.sandbox.sandbox_id) == ("bound", old.sandbox.sandbox_id)
        assert again.binding.version == old.binding.version


def test_a_command_starting_while_the_sweep_idles_its_session_runs(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
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
    assert get_backend(proxied_config).get(sandbox_id).state == SandboxState.RUNNING
