"""The settings contract (`sandboxes/backends/settings.py`): how a backend's typed options are
read from the string bag older code and rows hand in, and how a schema reports problems.
Each kind's own schema is tested in its room (docker/, e2b/, cube/test_settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from sandboxes.backends import BACKEND_CLASSES, all_settings, describe
from sandboxes.backends.base import ErrorKind, RemoteError
from sandboxes.backends.settings import (
    Given,
    Options,
    Scope,
    Setting,
    SettingsSchema,
    SettingType,
    disk_settings,
    secret_field,
)


@dataclass(frozen=True, kw_only=True)
class Sample(Options):
    name: str = ""
    count: int | None = None
    ratio: float = 1.0
    enabled: bool = False
    hosts: tuple[str, ...] = ()
    labels: dict[str, str] | None = None
    password: str = secret_field()


def test_a_bag_of_strings_parses_to_typed_options_ignoring_keys_it_does_not_declare() -> None:
    parsed = Sample.parse(
        {"name": "n", "count": "7", "ratio": "0.5", "enabled": "1", "hosts": "a, b,,", "labels": '{"k": "v"}', "x": "?"}
    )
    assert parsed == Sample(name="n", count=7, ratio=0.5, enabled=True, hosts=("a", "b"), labels={"k": "v"})
    assert Sample.parse({}) == Sample()
    assert Sample.parse(None) == Sample()
    assert Sample.parse({"count": "", "enabled": "no"}) == Sample(count=None, enabled=False)
    assert Sample.parse(parsed) is parsed  # typed options pass through


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"count": "seven"}, "'count' must be a whole number"),
        ({"count": True}, "'count' must be a whole number"),
        ({"ratio": "fast"}, "'ratio' must be a number"),
        ({"enabled": "maybe"}, "'enabled' must be a yes/no value"),
        ({"labels": "[1, 2]"}, "'labels' must be a JSON object of strings"),
        ({"labels": '{"k": 1}'}, "'labels' must be a JSON object of strings"),
        ({"name": 3}, "'name' must be text"),
    ],
)
def test_a_value_the_options_cannot_read_is_an_invalid_error_naming_the_option(raw: dict, named: str) -> None:
    with pytest.raises(RemoteError) as caught:
        Sample.parse(raw)
    assert caught.value.kind == ErrorKind.INVALID
    assert named in caught.value.message


def test_a_secret_option_stays_out_of_the_repr() -> None:
    options = Sample(password="hunter2-secret")
    assert "hunter2-secret" not in repr(options)
    assert Sample.secret_names() == {"password"}


def test_a_schema_reports_missing_refused_and_cross_field_problems_in_words() -> None:
    schema = SettingsSchema(
        label="Sample",
        options=Sample,
        check=lambda given, schema: {"count": "Count and host name disagree."},
        settings=(
            Setting("name", "Host name", required=True),
            Setting("count", "Count", SettingType.INT, validate=lambda v: None if v < 10 else "At most 9."),
            Setting("password", "Password", secret=True, required=True),
        ),
    )
    assert schema.problems(Given({"count": 12})) == {
        "name": "Sample backends need their host name.",
        "count": "At most 9.",
        "password": "Sample backends need their password.",
    }
    # *** over a stored secret is a secret given; a cross-field problem comes last.
    given = Given({"name": "n", "count": 1, "password": "***"}, stored_secrets=frozenset({"password"}))
    assert schema.problems(given) == {"count": "Count and host name disagree."}
    assert schema.problems(given, Scope.CONFIG) == {}  # the check is the platform backend's


def test_a_setting_declared_twice_in_one_scope_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        SettingsSchema(label="Sample", options=Sample, settings=(Setting("a", "A"), Setting("a", "B")))


@pytest.mark.parametrize("kind", sorted(BACKEND_CLASSES))
def test_every_kind_declares_its_settings_and_options(kind: str) -> None:
    schema = describe(kind)
    assert schema.label
    assert issubclass(schema.options, Options)
    for setting in schema.settings:
        assert setting.label, setting.name
        assert setting.help, setting.name
        if setting.type == SettingType.CHOICE:
            assert setting.choices, setting.name
        if setting.clears:  # what a switch clears are the kind's own secrets
            assert {s.name for s in schema.secrets()} >= set(setting.clears)


def test_a_name_any_kinds_share_means_one_type_and_one_secrecy() -> None:
    """A name two kinds declare is one column (or option): the same type and secrecy."""
    for scope in Scope:
        for name, declared in all_settings(scope).items():
            assert len({(s.type, s.secret) for _, s in declared}) == 1, (scope, name, declared)


def test_the_kinds_that_bound_disk_take_one_pair_of_settings_and_differ_only_in_how_it_holds() -> None:
    most, disk = disk_settings("")
    bounding = {kind for kind in BACKEND_CLASSES if "disk_mb" in describe(kind).names(Scope.CONFIG)}
    assert bounding >= {"docker", "cube"}
    for kind in bounding:
        settings = {(s.scope, s.name): s for s in describe(kind).settings}
        assert settings[(Scope.BACKEND, "max_disk_mb")] == most, kind
        theirs = settings[(Scope.CONFIG, "disk_mb")]
        assert replace(theirs, help=disk.help) == disk, kind
        assert theirs.help.startswith(disk.help), kind
        assert theirs.help != disk.help, kind  # each says how it holds
