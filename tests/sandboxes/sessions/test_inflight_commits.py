"""An exec's in-flight bookkeeping on PostgreSQL: each side (counted in with its exec slot
taken, counted out with it freed) is one statement, with no transaction of its own to open
and commit, and that statement's commit does not wait for the disk (synchronous_commit off,
switched by the statement itself, not by a round trip of its own)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from sandboxes.models import Session
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config
from tests.personas import World


@pytest.mark.django_db(transaction=True)
def test_each_side_of_an_exec_is_one_statement_committing_without_waiting(world: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    session = Session.objects.create(space=world.space_a, key="counted", config=make_config(world.space_a))
    runtime = Runtime()
    with runtime.exec_in_flight(session, 30):
        pass  # the space's limits read (and cached) once
    seen: list[tuple[str, str]] = []

    def observe(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.startswith("SHOW"):
            return execute(sql, params, many, context)
        # Held open here only to look: what the statement set for its own transaction.
        with transaction.atomic(), connection.cursor() as cursor:
            result = execute(sql, params, many, context)
            cursor.execute("SHOW synchronous_commit")
            seen.append((sql.split()[0].upper(), cursor.fetchone()[0]))
        return result

    with connection.execute_wrapper(observe):
        with runtime.exec_in_flight(session, 30):
            counted_in = list(seen)
            assert Session.objects.get(pk=session.pk).execs_in_flight == 1
        counted_out = seen[len(counted_in) + 1 :]  # past the read just above
    # The slot taken and the count, together; then freed and counted out, together (planned
    # once per database session: run as EXECUTE of the statement prepared by the first exec).
    assert counted_in == [("EXECUTE", "off")]
    assert counted_out == [("EXECUTE", "off")]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"  # only those transactions
    assert Session.objects.get(pk=session.pk).execs_in_flight == 0
