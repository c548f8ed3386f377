"""Tuning: typed defaults each room declares in code, and one override mapping.

A room declares its knobs as a frozen dataclass in its own `tuning.py` and registers it:

    @dataclass(frozen=True)
    class TerminalTuning:
        idle_timeout_s: int = 8 * 3600

    TERMINAL = room("terminal", TerminalTuning)

and reads them where it uses them: `TERMINAL.idle_timeout_s`. The value is looked up at each
read in `settings.TUNING`, the one override mapping ("terminal.idle_timeout_s" -> value),
which the settings fill from the CONSOLE_TUNING variable
(`terminal.idle_timeout_s=600,retention.jobs_days=7`, or the same as a JSON object). At start
(ConsoleConfig.ready) every `tuning.py` of the project's apps is imported and the mapping is
checked: an unknown key or a value of the wrong type stops the process with a message naming
it. Tests change values with `tuned(...)` (one way, merged over the test settings' own).
`manage.py tuning` lists every key with its default and the value in force.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from importlib import import_module
from pathlib import Path
from typing import Any, TypeVar, cast, get_type_hints

T = TypeVar("T")

# The project's apps whose `tuning.py` modules (at any depth) declare rooms.
PROJECT_APPS = ("console", "sandboxes", "skills")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# A duration knob's unit, by the end of its name: its value must fit a timedelta.
_UNITS = {"_s": "seconds", "_minutes": "minutes", "_hours": "hours", "_days": "days"}


class TuningError(ValueError):
    """An override names no known knob, or its value does not fit the knob's type."""


@dataclass(frozen=True)
class Knob:
    key: str  # "room.field"
    type: type
    default: Any


class _Room:
    """Reads one room's values at use time: the dataclass's defaults under settings.TUNING."""

    def __init__(self, name: str, declared: type) -> None:
        self._name = name
        self._declared = declared
        self._types: dict[str, type] = {f.name: _field_type(declared, f.name) for f in dataclasses.fields(declared)}
        self._source: object = None
        self._current: Any = None

    def __getattr__(self, field: str) -> Any:
        if field.startswith("_"):
            raise AttributeError(field)
        return getattr(self.current(), field)

    def current(self) -> Any:
        """The room's dataclass with the overrides in force (rebuilt when settings.TUNING changes)."""
        from django.conf import settings

        overrides = getattr(settings, "TUNING", {})
        if overrides is not self._source:
            self._current = resolve(self._name, self._declared, overrides)
            self._source = overrides
        return self._current

    def __repr__(self) -> str:
        return f"<tuning room {self._name}>"


_ROOMS: dict[str, _Room] = {}


def room(name: str, declared: type[T]) -> T:
    """Register `declared` (a frozen dataclass with a default for every field) as room `name`.

    Returns a live view typed as the dataclass: each attribute read applies settings.TUNING."""
    if not dataclasses.is_dataclass(declared) or not declared.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"tuning room {name!r}: {declared.__name__} must be a frozen dataclass")
    for field in dataclasses.fields(declared):
        if field.default is dataclasses.MISSING:
            raise TypeError(f"tuning room {name!r}: {field.name} needs a default")
    existing = _ROOMS.get(name)
    if existing is not None and existing._declared.__qualname__ != declared.__qualname__:
        raise TypeError(f"tuning room {name!r} is declared twice")
    view = _Room(name, declared)
    _ROOMS[name] = view
    return cast(T, view)


def _field_type(declared: type, field: str) -> type:
    hint = get_type_hints(declared)[field]
    if hint not in (bool, int, float, str):
        raise TypeError(f"tuning field {declared.__name__}.{field}: only bool, int, float and str are allowed")
    return cast(type, hint)


def coerce(key: str, kind: type, value: object) -> Any:
    """`value` (from the environment: a string; from JSON or a test: the typed value) as `kind`.

    A number is finite and never negative (every knob is a count, a size or a duration), and
    a duration fits a timedelta: else the request that reads it would fail, not the start."""
    typed = _typed(key, kind, value)
    if kind in (int, float) and (not math.isfinite(typed) or typed < 0):
        raise TuningError(f"tuning {key}: {value!r} is not a finite number of at least 0")
    unit = next((unit for suffix, unit in _UNITS.items() if key.endswith(suffix)), None)
    if unit is not None and kind in (int, float):
        try:
            timedelta(**{unit: typed})
        except OverflowError:
            raise TuningError(f"tuning {key}: {value!r} is too long a duration") from None
    return typed


def _typed(key: str, kind: type, value: object) -> Any:
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError
        if kind is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            if not isinstance(value, int | float | str):
                raise ValueError
            return int(value.strip() if isinstance(value, str) else value)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            if not isinstance(value, int | float | str):
                raise ValueError
            return float(value.strip() if isinstance(value, str) else value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        raise TuningError(f"tuning {key}: {value!r} is not a valid {kind.__name__}") from None


def resolve(name: str, declared: type[T], overrides: Mapping[str, object]) -> T:
    """Room `name`'s dataclass with the overrides of its keys applied (coerced to each field's type)."""
    prefix = name + "."
    changes = {}
    types_ = {f.name: _field_type(declared, f.name) for f in dataclasses.fields(declared)}  # type: ignore[arg-type]
    for key, value in overrides.items():
        if key.startswith(prefix):
            field = key[len(prefix) :]
            if field not in types_:
                raise TuningError(f"tuning {key}: room {name!r} has no knob {field!r}")
            changes[field] = coerce(key, types_[field], value)
    try:
        return cast(T, dataclasses.replace(declared(), **changes))  # type: ignore[type-var]
    except ValueError as exc:  # a room's own check (__post_init__)
        raise TuningError(f"tuning {name}: {exc}") from None


def parse(text: str) -> dict[str, object]:
    """CONSOLE_TUNING's text: a JSON object, or `room.knob=value` pairs separated by commas
    (or newlines). Values stay as given; they are typed against the rooms at start."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            loaded = json.loads(text, object_pairs_hook=_once)
        except json.JSONDecodeError as exc:
            raise TuningError(f"CONSOLE_TUNING is not valid JSON: {exc}") from None
        if not isinstance(loaded, dict):
            raise TuningError("CONSOLE_TUNING as JSON must be an object")
        return {str(k): v for k, v in loaded.items()}
    pairs: list[tuple[str, object]] = []
    for item in text.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or "." not in key.strip():
            raise TuningError(f"CONSOLE_TUNING: {item!r} is not room.knob=value")
        pairs.append((key.strip(), value.strip()))
    return _once(pairs)


def _once(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """The pairs as a mapping; a key given twice is an error (which value wins is no guess)."""
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise TuningError(f"CONSOLE_TUNING: {key} is given twice")
        found[key] = value
    return found


def discover() -> dict[str, _Room]:
    """Import every `tuning.py` of the project's apps, so every room is registered."""
    root = Path(__file__).resolve().parent.parent
    for app in PROJECT_APPS:
        for path in sorted((root / app).rglob("tuning.py")):
            if "management" in path.parts:  # `manage.py tuning` itself, not a room
                continue
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            import_module(module)
    return _ROOMS


def knobs() -> list[Knob]:
    """Every knob of every room, sorted by key."""
    out = []
    for name, view in discover().items():
        defaults = view._declared()
        for field, kind in view._types.items():
            out.append(Knob(f"{name}.{field}", kind, getattr(defaults, field)))
    return sorted(out, key=lambda knob: knob.key)


def validate(overrides: Mapping[str, object]) -> None:
    """Raise TuningError naming the first unknown key or badly typed value."""
    rooms = discover()
    for key in overrides:
        name, _, field = key.partition(".")
        if name not in rooms:
            known = ", ".join(sorted(rooms))
            raise TuningError(f"tuning {key}: there is no room {name!r} (rooms: {known})")
        if field not in rooms[name]._types:
            raise TuningError(f"tuning {key}: room {name!r} has no knob {field!r}")
    for name, view in rooms.items():
        resolve(name, view._declared, overrides)


def merged(
    current: Mapping[str, object], values: Mapping[str, object] | None = None, **by_room: Mapping[str, object]
) -> dict[str, object]:
    """`current` with these changes (`{"room.knob": value}` and/or `room={"knob": value}`),
    checked: an unknown key or a bad value raises at once, as at start."""
    changes = dict(values or {})
    for name, fields in by_room.items():
        changes.update({f"{name}.{field}": value for field, value in fields.items()})
    result = {**current, **changes}
    validate(result)
    return result


@contextmanager
def tuned(values: Mapping[str, object] | None = None, **by_room: Mapping[str, object]) -> Iterator[None]:
    """Run a block with these knobs changed, over the overrides in force (tests; a pytest test
    uses the `tuned` fixture, the same call undone at the test's end)."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(TUNING=merged(getattr(settings, "TUNING", {}), values, **by_room)):
        yield


def as_env(values: Mapping[str, object]) -> str:
    """The CONSOLE_TUNING text for these overrides (for a console started as a subprocess)."""
    return ",".join(
        f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in values.items()
    )


# --- The console app's own rooms --------------------------------------------------------------
# Read at start (Django, django-axes and the logging set-up take them as settings): `security`,
# `login`, `sso`, `logs` and `serving`.


@dataclass(frozen=True)
class SecurityTuning:
    """Behind TLS (CONSOLE_TLS=true): the Strict-Transport-Security header, and http -> https."""

    hsts_seconds: int = 31_536_000
    hsts_include_subdomains: bool = False
    hsts_preload: bool = False
    ssl_redirect: bool = False  # usually the proxy redirects


@dataclass(frozen=True)
class LoginTuning:
    """Failed logins of one username from one address before that pair is locked out."""

    failure_limit: int = 5
    lockout_minutes: int = 15


@dataclass(frozen=True)
class SsoTuning:
    """Single sign-on (OIDC_RP_CLIENT_ID set): the login button's name, and whether a first
    sign-in of a user the console does not know creates them (else it is refused)."""

    provider_name: str = "single sign-on"
    create_users: bool = False


@dataclass(frozen=True)
class LogsTuning:
    """Log lines: `json` (one object a line, for a collector) or `text` (for a person; the
    development settings' default), and the root level."""

    format: str = "json"
    level: str = "INFO"

    def __post_init__(self) -> None:
        if self.format not in {"json", "text"}:
            raise ValueError(f"format is {self.format!r}, not 'json' or 'text'")
        if self.level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError(f"level is {self.level!r}, not DEBUG, INFO, WARNING, ERROR or CRITICAL")


@dataclass(frozen=True)
class ServingTuning:
    """Daphne serves /static/ itself; turn off behind a web server that does."""

    static: bool = True


@dataclass(frozen=True)
class UsersTuning:
    invite_link_hours: float = 72.0


@dataclass(frozen=True)
class ReadyzTuning:
    """/readyz: each check's time limit, how long one answer is reused, and whether an
    unreachable platform backend makes the console unready ("required") or is only reported."""

    timeout_s: float = 2.0
    cache_s: float = 5.0
    backends: str = "required"

    def __post_init__(self) -> None:
        if self.backends not in {"required", "reported"}:
            raise ValueError(f"backends is {self.backends!r}, not 'required' or 'reported'")


@dataclass(frozen=True)
class ProcessesTuning:
    """A console process silent this long (or gone from this host) is dead; on SIGTERM requests
    in flight get shutdown_grace_s to finish."""

    heartbeat_window_s: float = 90.0
    shutdown_grace_s: float = 20.0


@dataclass(frozen=True)
class JobsTuning:
    housekeeping_retention_s: int = 86400  # finished reaper/idle-sweep jobs are deleted after this


@dataclass(frozen=True)
class ActivityTuning:
    sample_interval_s: float = 60.0
    max_gap_s: float = 300.0  # a previous sample further back gives no increases


@dataclass(frozen=True)
class RetentionTuning:
    """Days each kind of record is kept (0: forever); rows deleted per transaction; pass interval."""

    audit_events_days: int = 365
    jobs_days: int = 90
    terminals_days: int = 90
    commands_days: int = 30
    artifacts_days: int = 30
    egress_events_days: int = 14
    activity_samples_days: int = 14
    batch: int = 2000
    interval_s: float = 3600.0


@dataclass(frozen=True)
class LimitsTuning:
    """Platform defaults of the per-space quotas (admins override them per space), and the API
    tokens in force a space may hold."""

    live_sessions: int = 200
    concurrent_execs: int = 32
    background_commands: int = 32
    api_requests_per_minute: int = 1200
    api_tokens_per_space: int = 20

    def space_defaults(self) -> dict[str, int]:
        return {
            "live_sessions": self.live_sessions,
            "concurrent_execs": self.concurrent_execs,
            "background_commands": self.background_commands,
            "api_requests_per_minute": self.api_requests_per_minute,
        }


SECURITY = room("security", SecurityTuning)
LOGIN = room("login", LoginTuning)
SSO = room("sso", SsoTuning)
LOGS = room("logs", LogsTuning)
SERVING = room("serving", ServingTuning)
USERS = room("users", UsersTuning)
READYZ = room("readyz", ReadyzTuning)
PROCESSES = room("processes", ProcessesTuning)
JOBS = room("jobs", JobsTuning)
ACTIVITY = room("activity", ActivityTuning)
RETENTION = room("retention", RetentionTuning)
LIMITS = room("limits", LimitsTuning)
