"""The runtime's invariants under the races that broke them (issue 10, "What was seen"), on the
real Docker engine with the database store (the embedded default) or Redis.

Each test is the adversary of one promise: a lease running out mid-create, a losing SET NX, a
claim after binding loss, a turn whose first resolve created the sandbox, an id changed by
connect, a DELETE racing the agent's other calls.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.test import Client

from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import META_INSTALLATION, ListQuery, NetworkSpec, SandboxSpec
from sandboxes.catalog.services import mark_space_stale
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions import store_select as binding_module
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.provisioning import backend_for
from sandboxes.sessions.reaper import reap_config
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import Binding, RedisSessionStore, SessionStore, lock_key
from sandboxes.sessions.store_db import DatabaseSessionStore
from tests.conftest import REDIS_URL
from tests.factories import make_config
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
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
    theirs = backend_for(config).create(
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
    started = backend_for(config).get(first.sandbox.sandbox_id).started_at
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
        backend = backend_for(cfg)
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
    backend_for(e2b_config).pause(first.sandbox.sandbox_id)
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
    tail = rerun_on_sqlite(__file__, "racing or locked", tmp_path)
    assert "2 passed" in tail, tail
