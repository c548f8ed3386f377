"""What a resolve leaves behind for operators: a histogram sample by path and outcome
(console.metrics.RESOLVE_SECONDS) and one log line saying what was decided.

The fast path is a bound sandbox that answered; the slow path took the session's lifecycle
lock (`Runtime._resolve_locked` calls `took_slow_path`). A resolve made inside another (an
exec resolves first) is observed on its own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from console import metrics

if TYPE_CHECKING:
    from ..models import Session

logger = logging.getLogger("sandboxes.sessions.runtime")
_path: ContextVar[list[str] | None] = ContextVar("resolve_path", default=None)


@dataclass
class Observed:
    resolved: Any = None


def took_slow_path() -> None:
    path = _path.get()
    if path is not None:
        path[0] = "slow"


@contextlib.contextmanager
def observe_resolve(session: Session) -> Iterator[Observed]:
    path = ["fast"]
    token = _path.set(path)
    observed = Observed()
    started = time.perf_counter()
    error = ""
    try:
        yield observed
    except Exception as exc:
        error = str(getattr(exc, "kind", "") or exc.__class__.__name__)
        raise
    finally:
        _path.reset(token)
        elapsed = time.perf_counter() - started
        outcome = "error" if error else str(getattr(observed.resolved, "action", "unknown"))
        _histogram(path[0], outcome).observe(elapsed)
        level = (
            logging.WARNING if error else logging.DEBUG if outcome == "bound" and path[0] == "fast" else logging.INFO
        )
        if logger.isEnabledFor(level):  # the warm path's line is DEBUG: off in production, and not built
            fields: dict[str, Any] = {
                "space_id": str(session.space_id),
                "session_key": session.key,
                "path": path[0],
                "action": outcome,
                "duration_ms": round(elapsed * 1000, 1),
            }
            if error:
                logger.warning("resolve of session %s failed: %s", session.key, error, extra={**fields, "error": error})
            else:
                fields["sandbox_id"] = observed.resolved.sandbox.sandbox_id
                logger.log(level, "resolve of session %s: %s", session.key, outcome, extra=fields)


@functools.cache
def _histogram(path: str, outcome: str) -> Any:
    """The histogram's child for a path and outcome (a handful: looked up once each)."""
    return metrics.RESOLVE_SECONDS.labels(path=path, outcome=outcome)
