"""One conformance suite for every session store: the database (on whichever database the run
uses, and on SQLite in a child run), Redis, and the unit-test memory store.

Each promise the runtime builds on — insert-if-absent, compare-and-delete, a token-owned
leased lock whose loss its holder learns, a one-shot ticket — is checked alone and then under
threads racing on one key.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from sandboxes.models import Session
from sandboxes.sessions.lookup import SessionRow
from sandboxes.sessions.store import (
    Binding,
    LockLost,
    MemorySessionStore,
    RedisSessionStore,
    SessionStore,
    TurnLease,
    binding_key,
    lifecycle_lock,
    now_iso,
    turn_key,
)
from sandboxes.sessions.store_db import DatabaseSessionStore
from sandboxes.sessions.store_select import store_from_settings
from tests.conftest import REDIS_URL, require_service
from tests.factories import make_config
from tests.personas import World
from tests.support.sqlite_rerun import rerun_on_sqlite

# Committed rows and a connection per thread, as in production (the database store's rows).
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["database", "redis", "memory"])
def store(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    if request.param == "redis":
        require_service("redis")
        yield RedisSessionStore(REDIS_URL)
    elif request.param == "database":
        yield DatabaseSessionStore()
    else:
        yield MemorySessionStore()


def unique(prefix: str) -> str:
    return f"test:{prefix}:{uuid.uuid4().hex}"


def race(threads: int, work: Callable[[int], object]) -> tuple[list[object], list[str]]:
    """Run `work(i)` in `threads` threads released at once; results and errors."""
    barrier = threading.Barrier(threads)
    results: list[object] = []
    errors: list[str] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            results.append(work(i))
        except Exception as exc:
            errors.append(f"{exc.__class__.__name__}: {exc}")
        finally:
            connections.close_all()

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=120)
    return results, errors


# --- Semantics ------------------------------------------------------------------------------


def test_binding_is_set_once_and_removed_only_by_its_owner(store: SessionStore) -> None:
    key = unique("binding")
    first = Binding("sbx-1", 1, "cfg", now_iso())
    second = Binding("sbx-2", 2, "cfg", now_iso())
    assert store.set_binding_if_absent(key, first)
    assert not store.set_binding_if_absent(key, second)
    assert store.get_binding(key) == first
    assert not store.delete_binding_if(key, second)
    assert store.delete_binding_if(key, first)
    assert store.get_binding(key) is None
    assert not store.delete_binding_if(key, first)


def test_bindings_are_read_in_one_batch(store: SessionStore) -> None:
    keys = [unique("batch") for _ in range(7)]
    bindings = {key: Binding(f"sbx-{i}", i, "cfg", now_iso()) for i, key in enumerate(keys) if i % 2 == 0}
    for key, binding in bindings.items():
        assert store.set_binding_if_absent(key, binding)
    assert store.get_bindings([*keys, keys[0]]) == bindings
    assert store.get_bindings([]) == {}


def test_lock_is_token_owned_and_leased(store: SessionStore) -> None:
    key = unique("lock")
    assert store.acquire_lock(key, "a", 300)
    assert not store.acquire_lock(key, "b", 300)
    assert store.lock_holder(key) == "a"
    assert not store.release_lock(key, "b")
    assert store.renew_lock(key, "a", 300)
    assert not store.renew_lock(key, "b", 300)
    time.sleep(0.45)
    assert store.lock_holder(key) is None  # the lease ran out
    assert not store.renew_lock(key, "a", 300)  # a run-out lease is not renewed
    assert store.acquire_lock(key, "b", 300)
    assert not store.release_lock(key, "a")
    assert store.release_lock(key, "b")
    assert store.lock_holder(key) is None


def test_turn_ticket_is_one_shot_and_the_turn_expires(store: SessionStore) -> None:
    key = unique("turn")
    assert not store.turn_lease(key).in_flight
    store.begin_turn(key, 1)
    assert store.turn_lease(key).ticket_unused
    assert store.consume_ticket(key)
    assert not store.consume_ticket(key)
    lease = store.turn_lease(key)
    assert lease.in_flight
    assert not lease.ticket_unused
    time.sleep(2.1)
    assert not store.turn_lease(key).in_flight  # a leaked turn expires by itself
    assert not store.consume_ticket(key)
    store.begin_turn(key, 60)  # a new turn, a new ticket
    assert store.consume_ticket(key)
    store.end_turn(key)
    assert not store.turn_lease(key).in_flight


def test_read_session_gives_binding_and_lease_together(store: SessionStore) -> None:
    bkey, tkey = unique("binding"), unique("turn")
    assert store.read_session(bkey, tkey) == (None, store.turn_lease(tkey))
    binding = Binding("sbx-9", 3, "cfg", now_iso())
    store.set_binding_if_absent(bkey, binding)
    store.begin_turn(tkey, 60)
    found, lease = store.read_session(bkey, tkey)
    assert found == binding
    assert lease.in_flight
    assert lease.ticket_unused
    assert lease.ttl_s is not None
    assert 55 <= lease.ttl_s <= 60


def settled(read: tuple[Binding | None, TurnLease]) -> tuple[object, ...]:
    """What a session read says, its lease's seconds left aside (a second may tick between two reads)."""
    binding, lease = read
    return binding, lease.in_flight, lease.ticket_unused


def test_read_session_with_gives_the_other_result_and_what_read_session_gives(store: SessionStore) -> None:
    bkey, tkey = unique("binding"), unique("turn")
    assert store.read_session_with(bkey, tkey, lambda: "row") == ("row", (None, store.turn_lease(tkey)))
    binding = Binding("sbx-7", 2, "cfg", now_iso())
    store.set_binding_if_absent(bkey, binding)
    store.begin_turn(tkey, 60)
    store.consume_ticket(tkey)

    row, read = store.read_session_with(bkey, tkey, lambda: "row")

    assert row == "row"
    assert read is not None
    assert settled(read) == settled(store.read_session(bkey, tkey))
    assert read[0] == binding
    assert read[1].in_flight
    assert not read[1].ticket_unused


def test_a_failure_beside_read_session_with_leaves_no_answer_for_the_next_read(store: SessionStore) -> None:
    # Redis: the request went out before `other` failed; its answer must never be read as the
    # answer to the store's next command.
    first, second = unique("binding"), unique("binding")
    store.set_binding_if_absent(first, Binding("sbx-first", 1, "cfg", now_iso()))
    store.set_binding_if_absent(second, Binding("sbx-second", 1, "cfg", now_iso()))

    def fails() -> None:
        raise RuntimeError("the database did not answer")

    for _ in range(3):
        with pytest.raises(RuntimeError, match="did not answer"):
            store.read_session_with(first, unique("turn"), fails)
        found = store.get_binding(second)
        assert found is not None
        assert found.sandbox_id == "sbx-second"
    assert store.read_session_with(second, unique("turn"), lambda: None)[1] == store.read_session(second, unique("t"))


def test_the_database_store_reads_binding_and_lease_in_the_session_rows_statement(world: World) -> None:
    store = DatabaseSessionStore()
    session = Session.objects.create(space=world.space_a, key="row", config=make_config(world.space_a))
    bkey, tkey = binding_key(world.space_a.pk, "row"), turn_key(world.space_a.pk, "row")
    binding = Binding("sbx-row", 4, str(session.config_id), now_iso())
    store.set_binding_if_absent(bkey, binding)
    store.begin_turn(tkey, 60)

    with CaptureQueriesContext(connections["default"]) as captured:
        row, read = store.read_session_with(bkey, tkey, SessionRow(world.space_a, "row"))
    assert len([q for q in captured.captured_queries if not q["sql"].startswith("PREPARE")]) == 1
    assert row is not None
    assert row.pk == session.pk
    assert row.config.backend.pk == session.config.backend_id
    assert not {"store_binding", "store_turn", "store_turn_expires_ms"} & set(vars(row))
    assert read is not None
    assert settled(read) == settled(store.read_session(bkey, tkey))
    assert read[0] == binding
    assert read[1].in_flight
    assert read[1].ticket_unused
    assert read[1].ttl_s is not None
    assert 55 <= read[1].ttl_s <= 60

    store.end_turn(tkey)
    store.begin_turn(tkey, -1)  # a turn whose lease ran out: no turn in flight
    assert store.read_session_with(bkey, tkey, SessionRow(world.space_a, "row"))[1] == (
        binding,
        TurnLease(in_flight=False, ticket_unused=False),
    )
    assert store.read_session_with(bkey, tkey, SessionRow(world.space_a, "other")) == (None, None)


def test_a_holder_whose_lease_ran_out_knows_it(store: SessionStore) -> None:
    key = unique("lock")
    with lifecycle_lock(store, key, ttl_ms=3000) as held:
        held.check()  # ours
        # The lease runs out (a stall, the store unreachable) and another process takes it.
        store.release_lock(key, held.token)
        assert store.acquire_lock(key, "intruder", 3000)
        with pytest.raises(LockLost):
            held.check()
        assert held.lost.is_set()
    assert store.lock_holder(key) == "intruder"  # the loser's release left the winner's lock alone


# --- Races ----------------------------------------------------------------------------------


def test_racing_inserts_bind_exactly_once(store: SessionStore) -> None:
    key = unique("binding")
    results, errors = race(16, lambda i: store.set_binding_if_absent(key, Binding(f"sbx-{i}", 1, "c", now_iso())))
    assert not errors, errors[:3]
    assert sorted(results, key=bool) == [False] * 15 + [True]
    winner = store.get_binding(key)
    assert winner is not None
    results, errors = race(16, lambda i: store.delete_binding_if(key, winner))
    assert not errors, errors[:3]
    assert results.count(True) == 1


def test_racing_lock_holders_never_overlap(store: SessionStore) -> None:
    key = unique("lock")
    inside: list[int] = []
    overlaps: list[int] = []

    def work(i: int) -> int:
        with lifecycle_lock(store, key, ttl_ms=5000, wait_s=60):
            inside.append(i)
            if len(inside) > 1:
                overlaps.append(i)
            time.sleep(0.01)
            inside.remove(i)
        return i

    results, errors = race(12, work)
    assert not errors, errors[:3]  # no "database is locked", no timeouts
    assert len(results) == 12
    assert overlaps == []


def test_racing_turns_consume_the_ticket_once(store: SessionStore) -> None:
    key = unique("turn")
    store.begin_turn(key, 60)
    results, errors = race(16, lambda i: store.consume_ticket(key))
    assert not errors, errors[:3]
    assert results.count(True) == 1


def test_expired_leases_are_purged_and_bindings_kept(store: SessionStore) -> None:
    lock, bkey = unique("lock"), unique("binding")
    store.acquire_lock(lock, "a", 50)
    store.set_binding_if_absent(bkey, Binding("sbx", 1, "c", now_iso()))
    time.sleep(0.1)
    store.purge_expired()
    assert store.lock_holder(lock) is None
    assert store.get_binding(bkey) is not None
    assert store.acquire_lock(lock, "b", 1000)


# --- Selection and the other database --------------------------------------------------------


def test_settings_choose_redis_or_the_database_never_memory(settings: pytest.FixtureRequest) -> None:
    settings.REDIS_URL = ""  # type: ignore[attr-defined]
    settings.SESSION_STORE_URL = ""  # type: ignore[attr-defined]
    assert isinstance(store_from_settings(), DatabaseSessionStore)
    settings.REDIS_URL = "redis://127.0.0.1:6379/9"  # type: ignore[attr-defined]
    assert isinstance(store_from_settings(), RedisSessionStore)


@pytest.mark.slow
def test_the_database_store_conforms_on_sqlite_too(tmp_path: Path) -> None:
    """The same suite in a child run on SQLite (the embedded default), threads included."""
    tail = rerun_on_sqlite(
        __file__, "database and not sqlite", tmp_path, timeout_s=300, DJANGO_SETTINGS_MODULE="console.settings.test"
    )
    assert " passed" in tail, tail
    assert "skipped" not in tail, tail
