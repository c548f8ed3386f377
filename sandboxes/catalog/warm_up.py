"""A console process's start, made ready for its first resolve (`warm_up`, console/asgi.py).

Adapters are imported lazily (sandboxes/backends/__init__.py), and each adapter opens its
engine connection on its first call: the first resolve after a start paid both (the Docker
adapter's import alone, docker-py with its SSH transport, ~300 ms). At start, the adapter
modules of the kinds the platform backends use are imported (a kind whose SDK is missing is
left to say so where it is used), then, in a background thread, the adapters of the configs
with a warm pool are built and asked for their health, which opens their connections.
"""

from __future__ import annotations

import logging
import threading

from django.db import close_old_connections

from ..backends import backend_class
from ..backends.base import RemoteError
from ..models import PlatformBackend, SandboxConfig
from .bridge import get_backend

logger = logging.getLogger(__name__)

# Adapters warmed at most: a start with more pooled configs opens the rest on first use.
MAX_CONNECTIONS = 20


def warm_up(*, connect: bool = True) -> None:
    """In a background thread: import the adapter module of each kind in use and, with
    `connect`, open the engine connections of the pooled configs' adapters. Never in the
    importing thread, which may be an event loop's (no database call there) or a process
    with no database yet; a start never waits for it or fails for it."""
    threading.Thread(target=_warm, args=(connect,), name="backend-warm-up", daemon=True).start()


def _warm(connect: bool) -> list[str]:
    """The kinds imported."""
    try:
        try:
            kinds = sorted(set(PlatformBackend.objects.values_list("kind", flat=True)))
        finally:
            close_old_connections()
    except Exception as exc:  # no database yet (before migrate): the first use imports
        logger.warning("warming the backend adapters up at start skipped: %s", exc)
        return []
    imported = []
    for kind in kinds:
        try:
            backend_class(kind)
        except RemoteError as exc:
            logger.warning("backend kind %s not imported at start: %s", kind, exc.message)
            continue
        imported.append(kind)
    if connect and imported:
        _connect()
    return imported


def _connect() -> None:
    try:
        configs = SandboxConfig.objects.select_related("backend", "space").filter(pool_size__gt=0)
        for config in configs.order_by("pk")[:MAX_CONNECTIONS]:
            try:
                get_backend(config).health()
            except RemoteError as exc:
                logger.info("backend of config %s not reached at start: %s", config.pk, exc.message)
    except Exception:  # a start never fails for this: the first resolve connects
        logger.exception("opening the backends' connections at start failed")
    finally:
        close_old_connections()
