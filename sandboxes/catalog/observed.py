"""The console's one instrumentation point for backends: every backend the console builds
(`catalog.bridge.get_backend`) is wrapped by `observe`, so its calls into the contract are
counted, timed and logged.

The adapters stay free of the project (they log with `logging.getLogger(__name__)`; the
request id is added by console.logs' filter). The backend keeps its own class: its contract
methods, and those of the capability objects its accessors return, are wrapped on the
instance. A call made from inside another measured call (an adapter's `create` calling its
own `get`) is part of the outer one and is not counted again.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from console import metrics

from ..backends.base import Backend, Lookahead, RemoteError

logger = logging.getLogger(__name__)

OPERATIONS = ("health", "create", "connect", "get", "list", "delete", "exec", "pause")
CAPABILITIES = ("files", "snapshots", "templates", "inbound", "pty", "egress", "volumes", "stats")
_MARK = "_console_observed"
_inside: ContextVar[bool] = ContextVar("inside_backend_call", default=False)

T = TypeVar("T")


def observe(backend: Backend) -> Backend:
    if getattr(backend, _MARK, False):
        return backend
    kind = backend.kind
    for name in OPERATIONS:
        setattr(backend, name, _measured(getattr(backend, name), kind, name))
    for name in CAPABILITIES:
        setattr(backend, name, _capability(getattr(backend, name), kind, name))
    backend.look_ahead = _looking(backend.look_ahead, kind)  # type: ignore[method-assign,assignment]
    setattr(backend, _MARK, True)
    return backend


def _looking(begin: Callable[[str], Lookahead | None], kind: str) -> Callable[[str], Lookahead | None]:
    """`look_ahead`: the look's answer (`running`) is the call measured, as "look_ahead", and
    logged with the sandbox looked at (as every call about a sandbox is)."""

    def answer(_sandbox_id: str, running: Callable[[], Any]) -> Any:
        return running()

    measured = _measured(answer, kind, "look_ahead")  # once per backend; its subject: the id

    @functools.wraps(begin)
    def wrapped(sandbox_id: str) -> Lookahead | None:
        look = begin(sandbox_id)
        if look is not None:
            look.running = functools.partial(measured, sandbox_id, look.running)  # type: ignore[method-assign]
        return look

    return wrapped


def _capability(accessor: Callable[[], Any], kind: str, prefix: str) -> Callable[[], Any]:
    @functools.wraps(accessor)
    def wrapped() -> Any:
        capability = accessor()
        if capability is not None and not getattr(capability, _MARK, False):
            try:
                for name in dir(type(capability)):
                    if name.startswith("_") or not callable(getattr(type(capability), name, None)):
                        continue
                    setattr(capability, name, _measured(getattr(capability, name), kind, f"{prefix}.{name}"))
                setattr(capability, _MARK, True)
            except (AttributeError, TypeError):
                pass  # an object that takes no attributes (slots) stays unmeasured, never broken
        return capability

    return wrapped


def _subject(args: tuple[Any, ...]) -> str:
    """The sandbox (or snapshot, template) id a call is about: its first string argument."""
    return args[0] if args and isinstance(args[0], str) else ""


def _measured(method: Callable[..., T], kind: str, operation: str) -> Callable[..., T]:
    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> T:
        if _inside.get():
            return method(*args, **kwargs)
        token = _inside.set(True)
        started = time.perf_counter()
        error = ""
        try:
            return method(*args, **kwargs)
        except RemoteError as exc:
            error = str(exc.kind)
            raise
        except Exception as exc:
            error = exc.__class__.__name__
            raise
        finally:
            _inside.reset(token)
            elapsed = time.perf_counter() - started
            metrics.BACKEND_CALLS.labels(backend_kind=kind, operation=operation).inc()
            metrics.BACKEND_SECONDS.labels(backend_kind=kind, operation=operation).observe(elapsed)
            fields = {
                "backend_kind": kind,
                "operation": operation,
                "sandbox_id": _subject(args),
                "duration_ms": round(elapsed * 1000, 1),
            }
            if error:
                metrics.BACKEND_ERRORS.labels(backend_kind=kind, operation=operation, error=error).inc()
                logger.warning("backend %s %s failed: %s", kind, operation, error, extra={**fields, "error": error})
            else:
                logger.debug("backend %s %s", kind, operation, extra=fields)

    return wrapped
