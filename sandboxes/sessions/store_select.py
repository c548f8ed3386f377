"""The session store this process uses: Redis when configured, else the console's database.

Apart from `store` (the interface, the Redis and memory stores) so that neither store module
imports the other: `store_db` builds on `store`'s vocabulary, and this module picks one.
"""

from __future__ import annotations

import threading

from .store import RedisSessionStore, SessionStore
from .store_db import DatabaseSessionStore

_store: SessionStore | None = None
_store_lock = threading.Lock()


def store_from_settings() -> SessionStore:
    """Redis when SESSION_STORE_URL or REDIS_URL is set, else the console's database.

    Never the memory store: a restart would lose every binding and the reaper would then
    treat live sandboxes as leftovers.
    """
    from django.conf import settings

    url = getattr(settings, "SESSION_STORE_URL", "") or settings.REDIS_URL
    if url:
        return RedisSessionStore(url)
    return DatabaseSessionStore()


def get_store() -> SessionStore:
    """The process's session store (see `store_from_settings`), made once."""
    global _store
    if _store is None:
        with _store_lock:
            if _store is None:
                _store = store_from_settings()
    return _store


def set_store(store: SessionStore | None) -> None:
    """Swap the process's store (tests pointing at their own Redis server)."""
    global _store
    _store = store


def check_store() -> None:
    """Readiness (console.health): the process's store answers a read."""
    get_store().get_binding("console:readyz:probe")
