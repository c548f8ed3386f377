"""What a backend takes from the admins, declared by its own package (no Django here).

Each adapter package exports a `SCHEMA` (`SettingsSchema`): its label, the settings a platform
admin gives its platform backend and a space admin its config (`Setting`: name, type, unit,
required, secret, help and the adapter's own validation), a cross-field check, and the typed
options dataclass its adapter reads (`Options`). The console's forms are generated from the
schema (`sandboxes/catalog/by_kind.py`); nothing above the adapters asks which kind it is. The
model is NetBox's `DataBackend.parameters` / `sensitive_parameters`.

`Options.parse` reads a backend's options from the typed dataclass or from a mapping of
strings (what older code, tests and rows hand in): missing keys take their defaults, keys the
backend does not declare are ignored, a value it cannot read is a `RemoteError` (`invalid`)
naming the option.

Imports nothing of the project but the contract (`base`).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from .base import ErrorKind, RemoteError

REDACTED = "***"  # what a stored secret shows as; posting it back keeps the secret


class SettingType(enum.StrEnum):
    TEXT = "text"
    ENDPOINT = "endpoint"  # the backend's endpoint: the guard judges what `Setting.dials` returns
    URL = "url"  # an http(s) URL the console dials: judged by the endpoint guard
    INT = "int"
    BOOL = "bool"
    CHOICE = "choice"
    PEM = "pem"  # PEM text (certificates, keys), several lines


class Scope(enum.StrEnum):
    BACKEND = "backend"  # a platform admin's, on the platform backend
    CONFIG = "config"  # a space admin's, on a config of that backend


@dataclass(frozen=True)
class Setting:
    """One thing a backend takes from an admin.

    `validate` is the adapter's own check of a non-empty value: what is wrong, in words that
    complete "The <label> must be …"-free sentences (None: it will do). `dials` (endpoints and
    URLs) names the URL the endpoint guard judges for a value (None: nothing is dialled over
    the network, e.g. a unix socket). `clears` (a BOOL) names stored secrets it removes.
    `normalize` gives a text value the one spelling it is saved in (before `validate`)."""

    name: str
    label: str
    type: SettingType = SettingType.TEXT
    scope: Scope = Scope.BACKEND
    help: str = ""
    unit: str = ""
    required: bool = False
    secret: bool = False
    choices: tuple[tuple[str, str], ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    validate: Callable[[Any], str | None] | None = None
    dials: Callable[[str], str | None] | None = None
    clears: tuple[str, ...] = ()
    normalize: Callable[[str], str] | None = None  # the one spelling a text value is saved in
    max_length: int | None = None  # the most characters a text value may have

    @property
    def label_with_unit(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def keeps_when_empty(self) -> bool:
        """A PEM secret posted empty keeps the stored one (a key posted empty clears it)."""
        return self.secret and self.type == SettingType.PEM

    @property
    def empty(self) -> Any:
        """What the setting is saved as on a kind that does not declare it (None: left as is)."""
        if self.secret or self.type == SettingType.INT or self.clears:
            return None
        return False if self.type == SettingType.BOOL else ""


@dataclass(frozen=True)
class Given:
    """What a form hands a schema to check: every cleaned value of the form (the common fields
    too, e.g. `allow_private_endpoints`) and the names of the secrets already stored."""

    values: Mapping[str, Any]
    stored_secrets: frozenset[str] = frozenset()

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def has_secret(self, name: str) -> bool:
        """A secret typed now, or *** (or nothing) over a stored one."""
        value = str(self.values.get(name) or "")
        if value and value != REDACTED:
            return True
        return name in self.stored_secrets


Check = Callable[[Given, "SettingsSchema"], dict[str, str]]


@dataclass(frozen=True)
class Filled:
    """What a kind's `fill` derives from something handed in whole (a pasted kubeconfig gives
    the API server's URL, its CA and a token): `values` set over the given ones before the
    checks, `problems` by setting name (what cannot be used, and why)."""

    values: Mapping[str, Any] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)


Fill = Callable[[Given], Filled]


@dataclass(frozen=True)
class SettingsSchema:
    """A kind's settings, the cross-field check of its platform backend's settings
    (`check`) and its options dataclass."""

    label: str
    settings: tuple[Setting, ...]
    options: type[Options]
    check: Check | None = None
    # Settings of the platform backend derived from one handed in whole (`Filled`); runs after
    # `normalized` and before `problems`.
    fill: Fill | None = None

    def __post_init__(self) -> None:
        keys = [(s.scope, s.name) for s in self.settings]
        if len(keys) != len(set(keys)):
            raise ValueError(f"{self.label}: a setting is declared twice in one scope")

    def of(self, scope: Scope) -> tuple[Setting, ...]:
        return tuple(s for s in self.settings if s.scope == scope)

    def names(self, scope: Scope = Scope.BACKEND) -> frozenset[str]:
        """What the kind takes in `scope` (templates: `"max_pids" in kind.backend_names`)."""
        return frozenset(s.name for s in self.of(scope))

    @property
    def backend_names(self) -> frozenset[str]:
        return self.names(Scope.BACKEND)

    @property
    def config_names(self) -> frozenset[str]:
        return self.names(Scope.CONFIG)

    def takes(self, name: str, scope: Scope = Scope.BACKEND) -> bool:
        return name in self.names(scope)

    def setting(self, name: str, scope: Scope = Scope.BACKEND) -> Setting:
        for candidate in self.of(scope):
            if candidate.name == name:
                return candidate
        raise KeyError(name)

    def secrets(self, scope: Scope = Scope.BACKEND) -> tuple[Setting, ...]:
        return tuple(s for s in self.of(scope) if s.secret)

    def normalized(self, values: Mapping[str, Any], scope: Scope = Scope.BACKEND) -> dict[str, Any]:
        """`values` with each declared text value in the spelling the kind saves it in."""
        result = dict(values)
        for setting in self.of(scope):
            value = result.get(setting.name)
            if setting.normalize is not None and isinstance(value, str) and value:
                result[setting.name] = setting.normalize(value)
        return result

    def problems(self, given: Given, scope: Scope = Scope.BACKEND) -> dict[str, str]:
        """Every problem of what was given, by setting name: a required one missing, a value
        the adapter refuses, then the kind's cross-field check (first problem per name)."""
        found: dict[str, str] = {}
        for setting in self.of(scope):
            value = given.get(setting.name)
            given_now = given.has_secret(setting.name) if setting.secret else value not in (None, "")
            if setting.required and not given_now:
                noun = setting.label[:1].lower() + setting.label[1:]
                found[setting.name] = f"{self.label} backends need their {noun}."
            elif setting.max_length is not None and isinstance(value, str) and len(value) > setting.max_length:
                noun = setting.label if setting.label[1:2].isupper() else setting.label[:1].lower() + setting.label[1:]
                found[setting.name] = (
                    f"The {noun} is at most {setting.max_length} characters; this one has {len(value)}."
                )
            elif value not in (None, "", REDACTED) and setting.validate is not None:
                problem = setting.validate(value)
                if problem:
                    found[setting.name] = problem
        if self.check is not None and scope == Scope.BACKEND:
            for name, problem in self.check(given, self).items():
                found.setdefault(name, problem)
        return found


def secret_field(default: str = "") -> Any:
    """An options field holding a secret: left out of the dataclass's repr (logs, tracebacks)."""
    return field(default=default, repr=False, metadata={"secret": True})


@dataclass(frozen=True, kw_only=True)
class Options:
    """Base of a backend's typed options; each adapter package subclasses it."""

    @classmethod
    def parse(cls, raw: Options | Mapping[str, Any] | None) -> Self:
        """The options from `raw`: this dataclass as is, another backend's options or a
        mapping of strings by their keys (the keys stay those of the old string bag)."""
        if isinstance(raw, cls):
            return raw
        source: Mapping[str, Any] = raw.as_mapping() if isinstance(raw, Options) else (raw or {})
        hints = typing.get_type_hints(cls)
        values = {
            f.name: _convert(f.name, hints[f.name], source[f.name])
            for f in dataclasses.fields(cls)
            if f.name in source and source[f.name] is not None
        }
        return cls(**values)

    def as_mapping(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def secret_names(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("secret"))


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _convert(name: str, hint: Any, value: Any) -> Any:
    """`value` (a string from the old bag, or already typed) as the field's type."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if value == "":
            return None
        hint = inner[0]
    origin = typing.get_origin(hint)
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
            raise ValueError(value)
        if hint is int:
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value)
        if hint is float:
            return float(value)
        if hint is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if origin is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(str(item).strip() for item in items if str(item).strip())
        if origin is dict:
            parsed = (json.loads(value) if value else {}) if isinstance(value, str) else value
            if not isinstance(parsed, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
            ):
                raise ValueError(value)
            return dict(parsed)
    except (TypeError, ValueError):
        words = _TYPE_WORDS.get(origin or hint, str(hint))
        raise RemoteError(ErrorKind.INVALID, f"option {name!r} must be {words}") from None
    raise TypeError(f"option {name!r}: no conversion to {hint!r}")


_TYPE_WORDS: dict[Any, str] = {
    bool: "a yes/no value (1, true, yes, 0, false, no)",
    int: "a whole number",
    float: "a number",
    str: "text",
    tuple: "a comma-separated list",
    dict: "a JSON object of strings",
}


def disk_settings(holds: str) -> tuple[Setting, Setting]:
    """The platform backend's most disk per sandbox and a config's disk, in MiB, for a kind
    that bounds what a sandbox writes; `holds` ends the config setting's help (how it bounds)."""
    bounds: dict[str, Any] = {"unit": "MiB", "minimum": 64, "maximum": 4_194_304}
    most = Setting(
        "max_disk_mb",
        "Most disk per sandbox",
        SettingType.INT,
        help="The most disk a config on this backend may give a sandbox, in MiB (10240 = 10 GiB). "
        "Empty keeps the stored limit.",
        **bounds,
    )
    disk = Setting(
        "disk_mb",
        "Disk",
        SettingType.INT,
        scope=Scope.CONFIG,
        help=f"What a sandbox may write, in MiB (1024 = 1 GiB); {holds}",
        **bounds,
    )
    return most, disk
