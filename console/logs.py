"""The one logging set-up: JSON lines in production, readable lines in development, and the
request id every line carries.

A request id is taken from a sane incoming `X-Request-ID` (or made) by
`console.middleware.RequestIdMiddleware`, set by the terminal consumer for a websocket, passed
to Celery tasks in a message header (console/celery.py) and to job threads (console.jobs), and
kept in a context variable. `RequestIdFilter`, on every handler, copies it onto each record, so
code that knows nothing of the project (the backends) logs with `logging.getLogger(__name__)`
and its lines carry the id all the same.

Log what was decided (session key, sandbox id, action, duration) as `extra=` fields; never a
token, key or password (tests/console/test_observability.py greps a whole API turn's lines).
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

REQUEST_ID_HEADER = "X-Request-ID"
# A caller's id is kept only if it is short and plain: it goes into every log line.
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")

_request_id: ContextVar[str] = ContextVar("request_id", default="")


def new_request_id() -> str:
    return uuid.uuid4().hex


def sane_request_id(value: str | bytes | None) -> str:
    """The caller's id when it is sane, else a new one."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if value and _SANE_ID.match(value):
        return value
    return new_request_id()


def get_request_id() -> str:
    return _request_id.get()


def set_request_id(value: str) -> None:
    """Set the id for the rest of this context (a Celery task, a job thread, a websocket)."""
    _request_id.set(value)


@contextlib.contextmanager
def request_id(value: str) -> Iterator[str]:
    token = _request_id.set(value)
    try:
        yield value
    finally:
        _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` to every record (empty outside a request, job or websocket)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = _request_id.get() or "-"
        return True


# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "request_id"}


class ReadableFormatter(logging.Formatter):
    """`time level logger [request id] message key=value …` for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return line


def logging_config(*, log_format: str, level: str) -> dict[str, Any]:
    """The LOGGING dict settings use: `log_format` is "json" or "text"."""
    formatter: dict[str, Any]
    if log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
    else:
        formatter = {"()": "console.logs.ReadableFormatter"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "console.logs.RequestIdFilter"}},
        "formatters": {"main": formatter},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": "main", "filters": ["request_id"]},
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": {"django.db.backends": {"level": "INFO"}},
    }
