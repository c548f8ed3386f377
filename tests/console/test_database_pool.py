"""The PostgreSQL connection pool per process (DATABASE_POOL_SIZE): its settings, and that
threads past its size wait for a connection instead of opening more on the server."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.utils import ConnectionHandler

from console.environment import DEFAULT_POOL_SIZE, MAX_POOL_SIZE, database_settings


def test_postgresql_gets_a_bounded_pool_and_sqlite_none() -> None:
    database = database_settings("postgres://console@127.0.0.1:5432/console")
    pool = database["OPTIONS"]["pool"]
    assert (pool["min_size"], pool["max_size"], database["CONN_MAX_AGE"]) == (1, DEFAULT_POOL_SIZE, 0)
    assert "pool" not in (database_settings("postgres://console@127.0.0.1/console", 0).get("OPTIONS") or {})
    assert "pool" not in (database_settings("sqlite:///var/console.sqlite3").get("OPTIONS") or {})


@pytest.mark.parametrize("size", [-1, MAX_POOL_SIZE + 1])
def test_a_pool_size_out_of_range_is_refused_in_words(size: int) -> None:
    with pytest.raises(ImproperlyConfigured, match="DATABASE_POOL_SIZE must be 0 to 50"):
        database_settings("postgres://console@127.0.0.1/console", size)


def pooled_handler(size: int) -> tuple[ConnectionHandler, str]:
    """Connections to the test database through a pool of `size`, as the settings make it,
    under an application name of their own (to count them on the server)."""
    if connection.vendor != "postgresql":
        pytest.skip("the pool is PostgreSQL's")
    own = connection.settings_dict
    url = f"postgres://{own['USER']}@{own['HOST'] or '127.0.0.1'}:{own['PORT'] or 5432}/{own['NAME']}"
    pooled = database_settings(url, size)
    name = f"pool-test-{uuid.uuid4().hex[:8]}"
    pooled["OPTIONS"] = {**pooled["OPTIONS"], "application_name": name}
    return ConnectionHandler({"default": pooled}), name


@pytest.mark.django_db(transaction=True)
def test_threads_past_the_pool_size_never_open_more_connections() -> None:
    handler, name = pooled_handler(3)
    seen: list[int] = []
    failures: list[BaseException] = []

    def work() -> None:
        db = handler["default"]
        for _ in range(3):
            try:
                with db.cursor() as cursor:
                    cursor.execute(
                        "SELECT (SELECT count(*) FROM pg_stat_activity WHERE application_name = %s), pg_sleep(0.05)",
                        [name],
                    )
                    seen.append(int(cursor.fetchone()[0]))
            except BaseException as exc:
                failures.append(exc)
            finally:
                db.close()  # back to the pool, as at the end of a request

    threads = [threading.Thread(target=work) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    handler["default"].close_pool()  # type: ignore[attr-defined]
    assert not failures, failures
    assert len(seen) == 36
    assert max(seen) <= 3


@pytest.mark.django_db(transaction=True)
def test_a_pooled_connection_the_server_closed_is_replaced_not_handed_out() -> None:
    # The check takes a recently verified connection as it is unless the server left word on
    # its socket: a terminated backend (as in a restart) is seen so, and replaced.
    handler, _ = pooled_handler(1)
    db = handler["default"]
    try:
        pids = []
        for _ in range(2):
            with db.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.append(cursor.fetchone()[0])
            db.close()  # back to the pool, as at the end of a request
        assert pids[0] == pids[1]  # kept, and taken again without a fault
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pids[0]])
        for _ in range(50):  # the backend's goodbye reaches the socket
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pids[0]])
                if not cursor.fetchone()[0]:
                    break
        with db.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            assert cursor.fetchone()[0] != pids[0]
        db.close()
    finally:
        db.close_pool()  # type: ignore[attr-defined]
