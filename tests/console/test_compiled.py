"""A query compiled once per connection: the same objects as the ORM's `.first()`, run with new values,
and on PostgreSQL planned once per database session."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext

from console.compiled import Compiled, execute_planned
from console.models import Space
from sandboxes.models import Session
from tests.factories import make_config, make_space
from tests.personas import World

pytestmark = pytest.mark.django_db


def field_values(instance: Any) -> dict[str, object]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_each_call_gives_the_row_of_its_own_values(world: World) -> None:
    by_key = Compiled(Session.objects.select_related("config__backend"), "space_id", "key")
    config_a, config_b = make_config(world.space_a), make_config(world.space_b)
    Session.objects.create(space=world.space_a, key="one", config=config_a, sandbox_id="sbx-a")
    Session.objects.create(space=world.space_b, key="one", config=config_b, sandbox_id="sbx-b")

    for space, sandbox_id in ((world.space_a, "sbx-a"), (world.space_b, "sbx-b")):
        found = by_key.first(space.pk, "one")
        expected = Session.objects.select_related("config__backend").get(space=space, key="one")
        assert found is not None
        assert found.sandbox_id == sandbox_id
        assert field_values(found) == field_values(expected)
        assert field_values(found.config) == field_values(expected.config)
        assert field_values(found.config.backend) == field_values(expected.config.backend)
    assert by_key.first(world.space_a.pk, "two") is None


def test_the_orm_compiles_it_once_per_connection(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    by_key = Compiled(Session.objects.select_related("config__backend"), "key", "space_id")  # not the SQL's order
    Session.objects.create(space=world.space_a, key="k", config=make_config(world.space_a))
    compiled = []
    as_sql = SQLCompiler.as_sql

    def counted(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        compiled.append(self.query.model)
        return as_sql(self, *args, **kwargs)

    monkeypatch.setattr(SQLCompiler, "as_sql", counted)
    for _ in range(3):
        found = by_key.first("k", world.space_a.pk)
        assert found is not None
        assert found.key == "k"
        assert by_key.first("k", world.space_b.pk) is None

    assert compiled == [Session]


def test_values_alike_are_still_told_apart() -> None:
    # A space whose name equals its slug: which parameter is which cannot be read off the SQL.
    by_name = Compiled(Space.objects.all(), "name", "slug")
    make_space("same")
    space = by_name.first("same", "same")
    assert space is not None
    assert by_name.first("same", "other") is None
    assert by_name.first("other", "same") is None


# --- Planned once per PostgreSQL session (execute_planned) ------------------------------------


def statements(captured: CaptureQueriesContext) -> list[str]:
    return [query["sql"].split(" ", 1)[0] for query in captured.captured_queries]


@pytest.fixture
def by_key_on_postgresql(world: World) -> Compiled[Session]:
    """A session "k" (sandbox "sbx-k") of space A, and its lookup; PostgreSQL only."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    Session.objects.create(space=world.space_a, key="k", config=make_config(world.space_a), sandbox_id="sbx-k")
    return Compiled(Session.objects.select_related("config__backend"), "space_id", "key")


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_it_is_prepared_once_then_executed(world: World, by_key_on_postgresql: Compiled[Session]) -> None:
    by_key = by_key_on_postgresql
    with CaptureQueriesContext(connection) as captured:
        found = [by_key.first(world.space_a.pk, "k") for _ in range(3)]
        missing = by_key.first(world.space_b.pk, "k")

    assert [session.sandbox_id for session in found if session is not None] == ["sbx-k"] * 3
    assert missing is None
    assert statements(captured) == ["PREPARE", "EXECUTE", "EXECUTE", "EXECUTE", "EXECUTE"]


@pytest.mark.django_db(transaction=True)
def test_a_statement_the_session_dropped_is_prepared_again(
    world: World, by_key_on_postgresql: Compiled[Session]
) -> None:
    by_key = by_key_on_postgresql
    assert by_key.first(world.space_a.pk, "k") is not None
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # as a pool's reset (DISCARD ALL) does

    with CaptureQueriesContext(connection) as captured:
        found = by_key.first(world.space_a.pk, "k")

    assert found is not None
    assert found.sandbox_id == "sbx-k"
    assert statements(captured) == ["EXECUTE", "PREPARE", "EXECUTE"]


@pytest.fixture
def probe_table() -> Iterator[str]:
    """A table "probe" (name varchar(10), number integer) of its own, dropped after; PostgreSQL only."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE probe (name varchar(10), number integer)")
    yield "SELECT name, number FROM probe WHERE number = %s"
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE probe")


@pytest.mark.django_db(transaction=True)
def test_a_statement_whose_table_a_migration_altered_is_prepared_again(probe_table: str) -> None:
    # A migration widening a column (a CharField's max_length) while a console runs: the
    # prepared statement's result type changed, and PostgreSQL refuses to run it again
    # ("cached plan must not change result type") for as long as the session lasts.
    select = probe_table
    with connection.cursor() as cursor:
        execute_planned(cursor, select, [1])
        cursor.execute("ALTER TABLE probe ALTER COLUMN name TYPE varchar(20)")
        cursor.execute("INSERT INTO probe VALUES ('widened', 1)")

    with CaptureQueriesContext(connection) as captured, connection.cursor() as cursor:
        execute_planned(cursor, select, [1])
        first = cursor.fetchall()
        execute_planned(cursor, select, [1])
        second = cursor.fetchall()

    assert first == second == [("widened", 1)]
    assert statements(captured) == ["EXECUTE", "DEALLOCATE", "PREPARE", "EXECUTE", "EXECUTE"]


@pytest.mark.django_db(transaction=True)
def test_a_statement_whose_prepare_failed_for_a_while_is_prepared_later(probe_table: str) -> None:
    # A migration holding its table locked past the session's lock_timeout: the PREPARE fails
    # as the statement itself would. Once the lock is gone the statement is prepared as ever,
    # not planned at each call for the rest of the process's life.
    select = probe_table
    locked, done = threading.Event(), threading.Event()

    def migration() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("LOCK TABLE probe IN ACCESS EXCLUSIVE MODE")
                locked.set()
                done.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=migration)
    holder.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")
            with pytest.raises(DatabaseError):
                execute_planned(cursor, select, [1])
    finally:
        done.set()
        holder.join(10)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    with CaptureQueriesContext(connection) as captured, connection.cursor() as cursor:
        execute_planned(cursor, select, [1])
        execute_planned(cursor, select, [1])

    assert statements(captured) == ["PREPARE", "EXECUTE", "EXECUTE"]


def test_inside_a_transaction_the_statement_runs_as_it_is(world: World) -> None:
    # A failed EXECUTE would abort the caller's transaction: there, nothing is prepared.
    by_key = Compiled(Session.objects.select_related("config__backend"), "space_id", "key")
    Session.objects.create(space=world.space_a, key="k", config=make_config(world.space_a))

    with transaction.atomic(), CaptureQueriesContext(connection) as captured:
        assert by_key.first(world.space_a.pk, "k") is not None

    assert statements(captured) == ["SELECT"]
