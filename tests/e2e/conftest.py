"""Browser tests: real Chromium (Debian's /usr/bin/chromium, never a downloaded browser)
driving the console served by Daphne in a child process.

Daphne needs a file-backed test database shared with the child: these tests run on
PostgreSQL (DATABASE_URL) and carry the `postgres` marker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Any accidental use of a Playwright-bundled browser fails loudly instead of downloading one.
os.environ.setdefault("PLAYWRIGHT_BROWSERS_PATH", "/nonexistent-playwright-browsers")


@pytest.fixture(autouse=True)
def _allow_orm_next_to_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    # Playwright's sync API runs an event loop in the test thread; Django would refuse ORM
    # calls from it. Allowed here, in the browser tests only.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(autouse=True)
def _session_store_put_back() -> Iterator[None]:
    """A test that gives this process a store of its own (`binding.set_store`, a memory store
    for its checks) leaves the next test the one it found: a binding a later test makes here
    must land where the Daphne child reads it, not in a memory store left behind."""
    from sandboxes.sessions import store_select as binding

    previous = binding._store
    yield
    binding.set_store(previous)


@pytest.fixture
def page() -> Iterator[Any]:
    """A Chromium page, with Playwright started and stopped around each test.

    Not pytest-playwright's session-scoped `playwright` fixture: its sync API keeps an event
    loop running in the main thread for the rest of the session, and every later test that
    touches the ORM or runs asyncio would fail.
    """
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)", pytrace=False)
    from django.db import connections

    with sync_playwright() as playwright:
        # While Playwright's loop runs, Django keeps this thread's connections apart (asgiref's
        # Local turns context-local under a running loop), and they outlive the test: one an
        # earlier test's teardown ended (`_end_other_sessions`) would fail this test's first
        # query. Each test starts and ends with fresh ones.
        connections.close_all()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            yield context.new_page()
            context.close()
        finally:
            browser.close()
            connections.close_all()


def _fresh_after_fork() -> None:
    """In the forked Daphne child: replace state whose threads or sockets stayed with the parent.

    asgiref's thread-sensitive executor believes its worker thread (started by earlier async
    tests in the parent) still exists, so database_sync_to_async would wait forever; cached
    Docker clients would share the parent's sockets.
    """
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync

    from sandboxes.catalog import bridge
    from sandboxes.sessions import store_select as binding

    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    bridge._backends.clear()
    binding.set_store(None)


@pytest.fixture
def daphne_url(transactional_db: None, settings: Any) -> Iterator[str]:
    """The whole ASGI application (HTTP, static files, websockets) on a free localhost port.

    Tests using it carry the `postgres` marker: an in-memory SQLite database cannot be shared
    with the child process."""
    from channels.testing.live import make_application
    from daphne.testing import DaphneProcess
    from django.db import connections

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "localhost"]
    settings.SERVE_STATIC = True
    # The child is forked: it inherits settings and must not share our database sockets.
    connections.close_all()
    process = DaphneProcess("localhost", partial(make_application, static_wrapper=None), setup=_fresh_after_fork)
    process.start()
    if not process.ready.wait(timeout=30):
        process.terminate()
        raise RuntimeError("Daphne did not start")
    try:
        yield f"http://localhost:{process.port.value}"
    finally:
        process.terminate()
        process.join(timeout=10)
        _end_other_sessions()


def _end_other_sessions() -> None:
    """End database sessions this test left in other contexts.

    ORM calls made while Playwright's greenlets run get a connection of their own, which
    pytest-django never closes; the test database could not be dropped at the end.
    """
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
