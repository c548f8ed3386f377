"""An adversarial review of issue 10's promises: interleavings the first tests left out, on the
real Docker engine (or the fake E2B server where a slow control plane is the fault), the
database store on the test database, and real threads with their own connections.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections

from sandboxes.models import SandboxConfig
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.runtime import Resolved, Runtime
from sandboxes.sessions.store import lock_key
from sandboxes.sessions.store_db import DatabaseSessionStore
from tests.fakes.fixtures import FakeHandle
from tests.personas import World

from .test_runtime import sandboxes_of
from .test_runtime_invariants import e2b_config  # noqa: F401 - the fake E2B config fixture

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


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
