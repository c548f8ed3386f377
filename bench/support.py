"""What every benchmark shares: Django on the test settings, and a test database of its own.

A benchmark imports this module before anything of Django's (`import support`; the benchmarks'
folder is on sys.path when one runs as a script). It puts the checkout on sys.path, chooses the
test settings and the local Redis and PostgreSQL unless REDIS_URL and DATABASE_URL say otherwise
(threads working at once need a real database server: SQLite locks whole tables), and sets
Django up.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings.test")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")

import django

django.setup()


@contextmanager
def bench_database() -> Iterator[str]:
    """A test database made for the run and dropped after it, and an installation id of the
    run's own (`bench-<run id>`), so what the run creates is told from anything else on the
    engine and swept by it. Yields the run id."""
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment, teardown_test_environment

    run_id = uuid.uuid4().hex[:8]
    settings.CONSOLE_INSTALLATION_ID = f"bench-{run_id}"
    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        yield run_id
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()
