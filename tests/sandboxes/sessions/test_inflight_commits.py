"""An exec's in-flight bookkeeping on PostgreSQL: each side (counted in with its exec slot,
counted out with it freed) is two statements in one transaction, and that transaction's
commit does not wait for the disk (synchronous_commit off, switched by the count's own
statement, not by a round trip of its own)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from sandboxes.models import Session
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config
from tests.personas import World


@pytest.mark.django_db(transaction=True)
def test_each_side_of_an_exec_is_two_statements_committing_without_waiting(world: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    session = Session.objects.create(space=world.space_a, key="counted", config=make_config(world.space_a))
    runtime = Runtime()
    with runtime.exec_in_flight(session, 30):
        pass  # the space's limits read (and cached) once
    seen: list[tuple[str, str]] = []

    def observe(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not sql.startswith("SHOW"):
            with connection.cursor() as cursor:  # in the statement's own transaction
                cursor.execute("SHOW synchronous_commit")
                seen.append((sql.split()[0].upper(), cursor.fetchone()[0]))
        return result

    with connection.execute_wrapper(observe):
        with runtime.exec_in_flight(session, 30):
            counted_in = list(seen)
            assert Session.objects.get(pk=session.pk).execs_in_flight == 1
        counted_out = seen[len(counted_in) + 1 :]  # past the read just above
    assert [verb for verb, _ in counted_in] == ["WITH", "UPDATE"]  # the slot taken, the count
    assert counted_in[-1][1] == "off"
    assert [verb for verb, _ in counted_out] == ["DELETE", "UPDATE"]  # the slot freed, the count
    assert counted_out[-1][1] == "off"
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"  # only those transactions
    assert Session.objects.get(pk=session.pk).execs_in_flight == 0
