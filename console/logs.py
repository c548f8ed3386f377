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

Secrets that reach a line anyway — a library logging a request path with an invitation token
(django-axes, Django's "Not Found"), a query string with `?token=`, a URL with a password in
it, an exception message quoting a credential — are blanked by `RedactFilter`, which
`logging_config` puts on every handler (tests/console/test_log_redaction.py greps all the
output of a whole flow). It rewrites the record itself (message, string `extra=` fields,
traceback), so every handler after it sees the redacted record too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import logging.handlers
import os
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


# --- Redaction ------------------------------------------------------------------------------

REDACTED = "[redacted]"
# A parameter, header or field whose name ends in one of these words carries a secret
# ("token", "api_key", "client_secret", "new_password1", "csrfmiddlewaretoken"), as do a few
# short names used for one-time codes (OAuth's `code`, an `invite` code, a terminal `ticket`, a `sig`).
_SECRET_NAME = (
    r"(?:[A-Za-z0-9_.\-]*?(?:token|secret|password|passwd|passphrase|apikey|api[_-]key|access[_-]key"  # noqa: S105
    r"|private[_-]key|secret[_-]key|signing[_-]key|signature|credentials?|cookie)\d*"
    r"|code|ticket|sig|invite|invitation|invite[_-]code)"
)
# name=value (query strings, key=value text), name: value, "name": "value", 'name': 'value',
# and a QueryDict's 'name': ['value']. A quoted value is blanked up to its closing quote (a
# password may hold spaces); an unquoted one up to the next space or separator.
_NAMED_VALUE = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<name>" + _SECRET_NAME + r")(?P<sep>[\"']?\s*[=:]\s*)"
    r"(?:(?P<open>(?:[\[(]\s*)?[bu]?(?P<quote>[\"']))(?P<quoted>(?:\\.|(?!(?P=quote))[^\\\n])+)(?P=quote)"
    r"|(?P<unquoted>(?:[bu]?[\"'])?)(?P<value>[^\s&;,\"'<>(){}]+))",
    re.IGNORECASE,
)


# Short names are secrets as parameters (`?code=…`, `ticket=…`); in prose ("exit code: 137",
# "HTTP status code: 502") they are diagnostics and stay.
_SHORT_NAMES = frozenset({"code", "ticket", "sig", "invite", "invitation"})


def _blank_named(m: re.Match[str]) -> str:
    if m["name"].lower() in _SHORT_NAMES and "=" not in m["sep"]:
        value = m["open"] + m["quoted"] + m["quote"] if m["quoted"] is not None else m["unquoted"] + m["value"]
        return m["name"] + m["sep"] + _NAMED_VALUE.sub(_blank_named, value)
    if m["quoted"] is not None:
        return m["name"] + m["sep"] + m["open"] + REDACTED + m["quote"]
    return m["name"] + m["sep"] + m["unquoted"] + REDACTED


# Authorization header values.
_AUTH_SCHEME = re.compile(r"\b(?P<scheme>Bearer|Basic|Token)\s+(?P<value>[A-Za-z0-9._~+/=\-]{6,})", re.IGNORECASE)
# The password of a URL's userinfo: scheme://user:password@host.
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*):(?P<value>[^@/\s]+)@")
# Secrets with a shape of their own, wherever they stand: the agent API's tokens (sck_…).
_SHAPED = re.compile(r"\b(?P<prefix>sck_)[A-Za-z0-9_\-]{8,}")
# A PEM private key (a backend's TLS client key): its body, whatever names it (a repr's \\n too).
_PEM_KEY = re.compile(
    r"(?P<begin>-----BEGIN (?P<label>[A-Z0-9 ]*PRIVATE KEY)-----)(?!\[redacted\])"
    r"[A-Za-z0-9+/=:,\\\s]*(?:-----END (?P=label)-----)?"
)
# Paths whose next segment is a secret: the invitation link /invite/<token>/.
SECRET_PATH_PREFIXES = ("/invite/",)
_SECRET_SEGMENT = re.compile(
    "(?P<prefix>" + "|".join(re.escape(p) for p in SECRET_PATH_PREFIXES) + r")(?P<value>[^/\s?#\"']+)"
)


def redact(text: str) -> str:
    """`text` with every secret it shows replaced by [redacted]; idempotent."""
    if not text:
        return text
    text = _SECRET_SEGMENT.sub(lambda m: m["prefix"] + REDACTED, text)
    text = _USERINFO.sub(lambda m: f"{m['head']}:{REDACTED}@", text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m['scheme']} {REDACTED}", text)
    text = _SHAPED.sub(lambda m: m["prefix"] + REDACTED, text)
    text = _PEM_KEY.sub(lambda m: f"{m['begin']}{REDACTED}", text)
    return _NAMED_VALUE.sub(_blank_named, text)


_SECRET_FIELD = re.compile(r"^" + _SECRET_NAME + r"$", re.IGNORECASE)


class RedactFilter(logging.Filter):
    """Blanks tokens, invitation codes and passwords in a record before any handler formats
    it: the message (with its arguments merged in), string `extra=` fields (and the whole
    value of a field named like a secret), the traceback and the stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_redacted", False):
            return True
        if isinstance(record.msg, dict) and not record.args:
            record.msg = _redact_value(record.msg)
        elif isinstance(record.msg, str) or record.args:
            try:
                message = record.getMessage()
            except Exception:  # a broken format string: keep its parts, redacted
                message = f"{record.msg} {record.args!r}"
            record.msg, record.args = redact(message), None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            # Formatters would format the exception again from exc_info: only the text stays.
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for name, value in list(vars(record).items()):
            if name in _STANDARD or name.startswith("_"):
                continue
            if _SECRET_FIELD.match(name) and value not in (None, ""):
                setattr(record, name, REDACTED)
            else:
                setattr(record, name, _redact_value(value))
        record._redacted = True
        return True


def _redact_value(value: Any) -> Any:
    """A field's value with its secrets blanked: strings, dicts and lists through, numbers as
    they are, and any other object (an HttpRequest, whose repr shows its query string) as its
    redacted text when that text held a secret."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _SECRET_FIELD.match(k) and v not in (None, "") else _redact_value(v)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(v) for v in value]
    text = str(value)
    cleaned = redact(text)
    return value if cleaned == text else cleaned


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


HANDLER_FILTERS = ["request_id", "redact"]

# Job kinds registered as housekeeping (`console.jobs.job_handler(housekeeping=True)` adds
# them: the jobs module's own registry, kept here so logging needs nothing of the jobs).
HOUSEKEEPING_JOB_KINDS: set[str] = set()
# The periodic passes' own modules (console.periodic): what they log below WARNING is routine.
HOUSEKEEPING_LOGGERS = (
    "console.activity",
    "console.processes",
    "console.scheduler",
    "sandboxes.network.log",
    "sandboxes.sessions.reaper",
    "sandboxes.sessions.retention",
    "sandboxes.sessions.unmanaged",
    "sandboxes.terminal.sweep",
)


def from_a_pass(record: logging.LogRecord) -> bool:
    """A line of the periodic passes: of a housekeeping job (`job_kind`, console.jobs) or of
    a pass's own module."""
    kind = getattr(record, "job_kind", None)
    if kind is not None:
        return kind in HOUSEKEEPING_JOB_KINDS
    return record.name.startswith(HOUSEKEEPING_LOGGERS)


def is_housekeeping(record: logging.LogRecord) -> bool:
    """A routine line of the passes: below WARNING (their warnings concern people)."""
    return record.levelno < logging.WARNING and from_a_pass(record)


class HousekeepingFilter(logging.Filter):
    """`only=True` (the housekeeping file's handler): every line of the passes, warnings
    included; `only=False` (the terminal's): every line but the passes' routine ones."""

    def __init__(self, only: bool = False) -> None:
        super().__init__()
        self.only = only

    def filter(self, record: logging.LogRecord) -> bool:
        return from_a_pass(record) if self.only else not is_housekeeping(record)


HOUSEKEEPING_MAX_BYTES = 10 * 1024 * 1024
HOUSEKEEPING_BACKUPS = 3  # housekeeping.log.1 … .3: at most 40 MiB in all


class SharedRotatingFileHandler(logging.handlers.WatchedFileHandler):
    """A log file several processes append to (Daphne, a Celery worker and beat), rotated when
    it reaches `max_bytes`: `file` → `file.1` → … → `file.<backups>`, the oldest dropped.

    `RotatingFileHandler` rotates per process: two processes each renaming the file they have
    open lose and overwrite lines. Here the rotation happens under an exclusive lock on
    `file.lock`, after checking again that the file at the path is still the full one (another
    process may have rotated it meanwhile), and every process follows the new file by
    `WatchedFileHandler`'s check of the path (as after a logrotate)."""

    def __init__(self, filename: str, *, max_bytes: int, backups: int, delay: bool = True, **kwargs: Any) -> None:
        super().__init__(filename, delay=delay, **kwargs)
        self.max_bytes = max_bytes
        self.backups = max(backups, 0)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.max_bytes > 0 and self._size() >= self.max_bytes:
                self._rotate()
        except OSError:
            self.handleError(record)
        super().emit(record)

    def _size(self) -> int:
        try:
            return os.stat(self.baseFilename).st_size
        except FileNotFoundError:
            return 0

    def _rotate(self) -> None:
        with open(self.baseFilename + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self._size() < self.max_bytes:
                    return  # rotated by another process meanwhile
                if self.backups == 0:
                    os.remove(self.baseFilename)
                    return
                for number in range(self.backups - 1, 0, -1):
                    older = f"{self.baseFilename}.{number}"
                    if os.path.exists(older):
                        os.replace(older, f"{self.baseFilename}.{number + 1}")
                os.replace(self.baseFilename, f"{self.baseFilename}.1")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def logging_config(*, log_format: str, level: str, housekeeping_log: str = "") -> dict[str, Any]:
    """The LOGGING dict settings use: `log_format` is "json" or "text". With `housekeeping_log`
    (a file), the periodic passes' routine lines go there instead of the terminal (the
    one-command start's default: docs/operations.md, "Logs")."""
    formatter: dict[str, Any]
    if log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
    else:
        formatter = {"()": "console.logs.ReadableFormatter"}
    handlers: dict[str, Any] = {
        "console": {"class": "logging.StreamHandler", "formatter": "main", "filters": HANDLER_FILTERS},
    }
    if housekeeping_log:
        handlers["console"]["filters"] = [*HANDLER_FILTERS, "not_housekeeping"]
        handlers["housekeeping"] = {
            # Rotated at a size by whichever process finds it full; a rotation by another
            # process or by logrotate (or a deleted file) is followed, never written past.
            "()": "console.logs.SharedRotatingFileHandler",
            "filename": housekeeping_log,
            "max_bytes": HOUSEKEEPING_MAX_BYTES,
            "backups": HOUSEKEEPING_BACKUPS,
            "formatter": "main",
            "filters": [*HANDLER_FILTERS, "only_housekeeping"],
        }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        # Every handler has both filters; a handler added here must list them too.
        "filters": {
            "request_id": {"()": "console.logs.RequestIdFilter"},
            "redact": {"()": "console.logs.RedactFilter"},
            "only_housekeeping": {"()": "console.logs.HousekeepingFilter", "only": True},
            "not_housekeeping": {"()": "console.logs.HousekeepingFilter", "only": False},
        },
        "formatters": {"main": formatter},
        "handlers": handlers,
        "root": {"handlers": list(handlers), "level": level},
        "loggers": {
            "django.db.backends": {"level": "INFO"},
            # Django's own defaults give these handlers of their own (a console one under DEBUG,
            # the admins' mail): none here, so every line goes through the root's filters.
            "django": {"handlers": [], "level": "INFO", "propagate": True},
            "django.server": {"handlers": [], "level": "INFO", "propagate": True},
        },
    }
