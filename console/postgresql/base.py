"""Django's PostgreSQL backend, whose connection pool checks a connection leaving it with
`console.environment.pooled_connection_check` instead of psycopg's round trip on every request.

Django hands the pool psycopg's `ConnectionPool.check_connection` when CONN_HEALTH_CHECKS is on
and offers no setting for another; the pool keeps its check in `_check` (psycopg_pool 3.2 and
3.3, pinned in constraints.txt; tests/console/test_database_pool.py fails if it moves).
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import base

from console.environment import pooled_connection_check


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        if pool is not None and getattr(pool, "_check", None) is not None:
            pool._check = pooled_connection_check
        return pool
