"""What a resolve leaves behind for operators: a histogram sample by path and outcome
(console.metrics.RESOLVE_SECONDS) and one log line saying what was decided.

The fast path is a bound sandbox that answered; the slow path took the session's lifecycle
lock (`Runtime._resolve_locked` calls `took_slow_path`). A resolve made inside another (an
exec resolves first) is observed on its own.

What a resolve handed out may be recorded with the time its caller waited: `after_resolve`
keeps a callback until the resolve is done, then calls it with that time, counted from
`resolving_since` (an API request's start) when the caller set it, else from the resolve's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from console import metrics

if TYPE_CHECKING:
    from ..models import Session

logger = logging.getLogger("sandboxes.sessions.runtime")
_path: ContextVar[list[str] | None] = ContextVar("resolve_path", default=None)
_since: ContextVar[float | None] = ContextVar("resolve_since", default=None)
# (seconds the caller waited, whether the resolve answered) -> None
AfterResolve = Callable[[float, bool], None]
_after: ContextVar[list[AfterResolve] | None] = ContextVar("resolve_after", default=None)


@dataclass
class Observed:
    resolved: Any = None


def took_slow_path() -> None:
    path = _path.get()
    if path is not None:
        path[0] = "slow"


def after_resolve(callback: AfterResolve) -> None:
    """Call `callback` once the resolve under way is done (at once, with 0, outside one)."""
    pending = _after.get()
    if pending is None:
        callback(0.0, True)
    else:
        pending.append(callback)


@contextlib.contextmanager
def resolving_since(started: float) -> Iterator[None]:
    """The resolves inside count their caller's wait from `started` (time.perf_counter())."""
    token = _since.set(started)
    try:
        yield
    finally:
        _since.reset(token)


@contextlib.contextmanager
def observe_resolve(session: Session) -> Iterator[Observed]:
    path = ["fast"]
    token = _path.set(path)
    pending: list[AfterResolve] = []
    after = _after.set(pending)
    observed = Observed()
    started = time.perf_counter()
    since = _since.get() or started
    error = ""
    try:
        yield observed
    except Exception as exc:
        error = str(getattr(exc, "kind", "") or exc.__class__.__name__)
        raise
    finally:
        _path.reset(token)
        _after.reset(after)
        now = time.perf_counter()
        elapsed = now - started
        for callback in pending:
            callback(now - since, not error)
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
