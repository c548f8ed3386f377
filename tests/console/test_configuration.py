"""Configuration: the environment variables the console reads, the tuning knobs, the periodic
tasks' registry, and what a start reports about variables it does not read."""

from __future__ import annotations

import os
import re
import shelve
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
from cryptography.fernet import Fernet

from console import environment, periodic, tuning
from console.environment import RETIRED, VARIABLES, email_settings, unknown_variables
from sandboxes.sessions.tuning import SESSIONS
from sandboxes.terminal.tuning import TERMINAL
from tests.support.tuning import Tuned
from tests.support.warm_manage import WarmManage

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"
# A read of a variable by name: os.environ.get("X"), os.getenv("X"), os.environ["X"], env_*("X").
READ = re.compile(
    r'(?:os\.environ\.get\(|os\.getenv\(|os\.environ\[|env_(?:str|bool|int|list)\()\s*"([A-Z][A-Z0-9_]+)"'
)


# Not the console's environment: the test settings (TEST_JOB_RUNNER, pytest-xdist's worker id)
# and the checker verify sends into a build sandbox (it reads the image's NODE_PATH there).
NOT_THE_CONSOLES = {REPO / "console" / "settings" / "test.py", REPO / "skills" / "install" / "entry_check.py"}


def variables_read_by_the_code() -> set[str]:
    """Every variable the console's code reads by name."""
    found = set()
    for app in ("console", "sandboxes", "skills"):
        for path in (REPO / app).rglob("*.py"):
            if path in NOT_THE_CONSOLES:
                continue
            found |= set(READ.findall(path.read_text()))
    return found


def doc_section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def documented_variables() -> set[str]:
    names = set()
    for line in doc_section("Environment variables").splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def documented_knobs() -> dict[str, str]:
    rows = {}
    for line in doc_section("Tuning knobs").splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if cells and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def test_the_code_reads_exactly_the_listed_and_documented_variables() -> None:
    read = variables_read_by_the_code()
    assert read == set(VARIABLES), (
        f"read but not listed in console/environment.py: {sorted(read - VARIABLES)}; "
        f"listed but not read: {sorted(VARIABLES - read)}"
    )
    documented = documented_variables()
    assert documented == set(VARIABLES), (
        f"listed but not in docs/configuration.md's table: {sorted(VARIABLES - documented)}; "
        f"in the table but not read: {sorted(documented - VARIABLES)}"
    )


def test_the_scan_sees_every_way_of_reading_a_variable() -> None:
    # The check above is only as good as its pattern.
    source = 'os.environ.get("A_1")\nos.getenv("BB")\nos.environ["CC"]\nenv_str("DD")\nenv_bool("EE", True)\n'
    assert set(READ.findall(source)) == {"A_1", "BB", "CC", "DD", "EE"}
    assert READ.findall('os.environ.setdefault("DJANGO_SETTINGS_MODULE", "x")') == []


def test_every_tuning_knob_is_documented_with_its_default() -> None:
    documented = documented_knobs()
    knobs = {knob.key: knob for knob in tuning.knobs()}
    assert set(documented) == set(knobs), sorted(set(documented) ^ set(knobs))
    for key, knob in knobs.items():
        default = str(knob.default).lower() if isinstance(knob.default, bool) else str(knob.default)
        assert documented[key] == default, key


def test_each_retired_variable_is_no_longer_read_and_names_a_knob_that_exists() -> None:
    keys = {knob.key for knob in tuning.knobs()}
    assert not set(RETIRED) & VARIABLES
    for name, what in RETIRED.items():
        assert what.startswith("no longer read"), name
        named = re.search(r"CONSOLE_TUNING (\S+)=", what)
        if named:
            assert named.group(1) in keys, (name, what)
    # Every old tuning variable is listed: the terminal's seven among them.
    assert {name for name in RETIRED if name.startswith("TERMINAL_")} == {
        "TERMINAL_IDLE_TIMEOUT_S",
        "TERMINAL_REATTACH_S",
        "TERMINAL_TICKET_MAX_AGE_S",
        "TERMINAL_REPLAY_BYTES",
        "TERMINAL_KEEPALIVE_S",
        "TERMINAL_LEASE_S",
        "TERMINAL_KEEP_SHELLS",
    }


def test_unknown_variables_are_ours_by_prefix_or_by_old_name_only() -> None:
    found = dict(
        unknown_variables(
            {
                "TERMINAL_IDLE_TIMEOUT_S": "600",
                "CONSOLE_TLSS": "true",
                "REDIS_URL": "redis://127.0.0.1:6379/0",
                "CONSOLE_TUNING": "",
                "TERMINAL_EMULATOR": "x",
                "SESSION_MANAGER": "local/x",
                "PATH": "/usr/bin",
            }
        )
    )
    assert set(found) == {"TERMINAL_IDLE_TIMEOUT_S", "CONSOLE_TLSS"}
    assert found["TERMINAL_IDLE_TIMEOUT_S"] == "no longer read; use CONSOLE_TUNING terminal.idle_timeout_s=..."


class Manage(Protocol):
    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]: ...


@pytest.fixture(scope="module")
def run_manage() -> Iterator[Manage]:
    """`run_manage("check", CONSOLE_TUNING=...)`: a start of `manage.py` under the test settings
    and the test's environment (none of ours besides), each a process of its own, forked from
    one warmed-up helper (tests/support/warm_manage.py)."""
    warm = WarmManage()
    base = {k: v for k, v in os.environ.items() if k not in RETIRED and not k.startswith(environment.OUR_PREFIXES)}

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return warm.run(list(args), {**base, "DJANGO_SETTINGS_MODULE": "console.settings.test", **env})

    yield run
    warm.close()


def test_a_start_reports_unread_variables_in_one_log_line_and_a_check_warning(run_manage: Manage) -> None:
    result = run_manage("check", TERMINAL_IDLE_TIMEOUT_S="600", CONSOLE_NOPE="1", TERMINAL_EMULATOR="x")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "environment variables not read" in line]
    assert len(lines) == 1, result.stderr
    assert "TERMINAL_IDLE_TIMEOUT_S (no longer read; use CONSOLE_TUNING terminal.idle_timeout_s=...)" in lines[0]
    assert "CONSOLE_NOPE" in lines[0]
    assert "TERMINAL_EMULATOR" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if "(console.W001)" in line]
    assert len(warnings) == 2, result.stderr
    # Nothing unread: nothing reported.
    clean = run_manage("check")
    assert clean.returncode == 0, clean.stderr
    assert "console.W001" not in clean.stderr + clean.stdout
    assert "not read" not in clean.stderr


def test_folded_variables_are_reported_with_their_replacement_and_the_new_forms_apply(run_manage: Manage) -> None:
    old = {
        "LOG_FORMAT": "logs.format",
        "LOG_LEVEL": "logs.level",
        "SERVE_STATIC": "serving.static",
        "OIDC_PROVIDER_NAME": "sso.provider_name",
        "OIDC_CREATE_USERS": "sso.create_users",
        "DEFAULT_FROM_EMAIL": "EMAIL_URL=smtp://host?from=address",
    }
    result = run_manage("check", **dict.fromkeys(old, "x"))
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "environment variables not read" in line]
    for name, replacement in old.items():
        assert f"{name} (no longer read; " in line, name
        assert replacement in line.split(f"{name} (", 1)[1].split(")", 1)[0], name
    new, old_1, old_2 = (Fernet.generate_key().decode() for _ in range(3))
    shown = run_manage(
        "shell",
        "-c",
        "from django.conf import settings as s; print(s.LOG_FORMAT, s.LOG_LEVEL, s.SERVE_STATIC, s.OIDC_PROVIDER_NAME,"
        " s.OIDC_CREATE_USER, s.DEFAULT_FROM_EMAIL, s.FIELD_ENCRYPTION_KEY, s.FIELD_ENCRYPTION_OLD_KEYS)",
        CONSOLE_TUNING="logs.format=text,logs.level=warning,serving.static=false,sso.provider_name=Corp,sso.create_users=true",
        EMAIL_URL="smtp://mail.example.test?from=console%40example.test",
        FIELD_ENCRYPTION_KEY=f"{new}, {old_1},{old_2}",
    )
    assert shown.returncode == 0, shown.stderr
    printed = shown.stdout.splitlines()[-1].split()
    assert printed[:6] == ["text", "WARNING", "False", "Corp", "True", "console@example.test"]
    assert printed[-2:] == [f"['{old_1}',", f"'{old_2}']"]  # the test settings keep their own first key


def test_a_left_over_old_keys_variable_stops_the_start_naming_where_the_keys_go(run_manage: Manage) -> None:
    """Warned and ignored, the old keys would leave every secret encrypted with them unreadable."""
    result = run_manage("check", FIELD_ENCRYPTION_OLD_KEYS=Fernet.generate_key().decode())
    assert result.returncode != 0
    assert "error: FIELD_ENCRYPTION_OLD_KEYS is no longer read; list the old keys after the new one" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("terminal.nope=1", "error: tuning terminal.nope: room 'terminal' has no knob 'nope'"),
        ("nowhere.x=1", "error: tuning nowhere.x: there is no room 'nowhere'"),
        ("terminal.idle_timeout_s=a-while", "error: tuning terminal.idle_timeout_s: 'a-while' is not a valid int"),
        ("terminal.keep_shells=maybe", "error: tuning terminal.keep_shells: 'maybe' is not a valid bool"),
        ("readyz.backends=sometimes", "backends is 'sometimes', not 'required' or 'reported'"),
        ("logs.format=xml", "error: tuning logs: format is 'xml', not 'json' or 'text'"),
        # Read by the settings themselves: the same one line, no traceback.
        ("security.hsts_seconds=-1", "error: tuning security.hsts_seconds: '-1' is not a finite number"),
        ("login.failure_limit=many", "error: tuning login.failure_limit: 'many' is not a valid int"),
        ("{nope", "error: CONSOLE_TUNING is not valid JSON"),
        ("login.failure_limit=1,login.failure_limit=2", "error: CONSOLE_TUNING: login.failure_limit is given twice"),
    ],
)
def test_a_bad_tuning_override_stops_the_start_with_a_message(run_manage: Manage, overrides: str, message: str) -> None:
    result = run_manage("check", CONSOLE_TUNING=overrides)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_tuning_overrides_are_typed_from_pairs_or_json(run_manage: Manage) -> None:
    assert run_manage("tuning", "terminal.idle_timeout_s").stdout.strip() == "28800"
    pairs = run_manage("tuning", "terminal.idle_timeout_s", CONSOLE_TUNING="terminal.idle_timeout_s=600, x.y=")
    assert pairs.returncode != 0  # x.y: no such room, even when empty
    pairs = run_manage("tuning", "terminal.idle_timeout_s", CONSOLE_TUNING="terminal.idle_timeout_s=600")
    assert pairs.stdout.strip() == "600", pairs.stderr
    as_json = run_manage("tuning", "terminal.keep_shells", CONSOLE_TUNING='{"terminal.keep_shells": false}')
    assert as_json.stdout.strip() == "false", as_json.stderr
    listing = run_manage("tuning", CONSOLE_TUNING="retention.jobs_days=7").stdout
    assert "retention.jobs_days = 7  [int, default 90]  (CONSOLE_TUNING)" in listing
    assert "terminal.reattach_s = 30  [int, default 30]" in listing


def test_the_parser_keeps_values_as_given_and_refuses_what_is_not_a_pair() -> None:
    assert tuning.parse("a.b=1, c.d = x\ne.f=") == {"a.b": "1", "c.d": "x", "e.f": ""}
    assert tuning.parse('{"a.b": 2}') == {"a.b": 2}
    for bad in ("a.b", "ab=1", "[1]", "{nope"):
        with pytest.raises(tuning.TuningError):
            tuning.parse(bad)
    assert tuning.coerce("k", int, "7") == 7
    assert tuning.coerce("k", float, 2) == 2.0
    assert tuning.coerce("k", bool, "off") is False
    for kind, value in ((int, 1.5), (int, True), (float, "x"), (str, 3), (bool, "2")):
        with pytest.raises(tuning.TuningError):
            tuning.coerce("k", kind, value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("users.invite_link_hours", "inf"),
        ("processes.heartbeat_window_s", "nan"),
        ("readyz.timeout_s", 1e999),  # JSON's 1e999 reads as infinity
        ("retention.jobs_days", "-3"),
        ("limits.live_sessions", -1),
        ("sessions.engine_timeout_s", "-0.5"),
        ("users.invite_link_hours", "1e300"),  # no timedelta holds it
        ("retention.audit_events_days", str(10**10)),
        ("terminal.idle_timeout_s", 10**20),
    ],
)
def test_a_knob_refuses_a_negative_endless_or_overflowing_number_at_start(key: str, value: object) -> None:
    # Each knob is a count, a size or a duration: such a value would fail (or delete, or
    # lock out) at the first request that reads it, not at start.
    with pytest.raises(tuning.TuningError, match=re.escape(key)):
        tuning.validate({key: value})


def test_a_knob_takes_zero_and_large_sizes() -> None:
    tuning.validate({"sessions.reaper_grace_s": 0, "inbound.max_request_bytes": 10**12, "retention.jobs_days": "0"})
    assert tuning.coerce("users.invite_link_hours", float, "100000") == 100000.0


def test_the_parser_refuses_a_knob_given_twice() -> None:
    # Which of two values would be in force is no deployer's guess: a start error names the key.
    for text in (
        "terminal.idle_timeout_s=600,terminal.idle_timeout_s=60",
        "terminal.idle_timeout_s=600\n terminal.idle_timeout_s =600",
        '{"terminal.idle_timeout_s": 600, "terminal.idle_timeout_s": 60}',
    ):
        with pytest.raises(tuning.TuningError, match=r"terminal\.idle_timeout_s.*twice"):
            tuning.parse(text)


def test_tuned_changes_knobs_over_the_test_settings_and_is_undone() -> None:
    assert SESSIONS.reaper_unmanaged is False  # the test settings' own override
    assert TERMINAL.reattach_s == 30
    with tuning.tuned({"terminal.reattach_s": 1}, sessions={"reaper_grace_s": 0}):
        assert TERMINAL.reattach_s == 1
        assert SESSIONS.reaper_grace_s == 0
        assert SESSIONS.reaper_unmanaged is False  # merged, not replaced
    assert TERMINAL.reattach_s == 30
    assert SESSIONS.reaper_grace_s == 300
    with pytest.raises(tuning.TuningError), tuning.tuned({"terminal.reattach": 1}):
        pass


def test_the_tuned_fixture_applies_until_the_test_ends(tuned: Tuned, settings: Any) -> None:
    tuned(terminal={"keepalive_s": 2})
    settings.DEBUG = False  # interleaved with other overrides: all undone in one order
    tuned({"terminal.lease_s": "5"})  # as from the environment: typed when read
    assert (TERMINAL.keepalive_s, TERMINAL.lease_s) == (2, 5)
    assert settings.TUNING["sessions.reaper_unmanaged"] is False


def test_a_room_must_be_a_frozen_dataclass_of_plain_typed_knobs_with_defaults() -> None:
    from dataclasses import dataclass

    class Plain:
        x: int = 1

    @dataclass
    class Mutable:
        x: int = 1

    @dataclass(frozen=True)
    class NoDefault:
        x: int

    @dataclass(frozen=True)
    class Listy:
        x: list[int] | None = None

    for declared in (Plain, Mutable, NoDefault, Listy):
        with pytest.raises(TypeError):
            tuning.room("test-only", declared)


# --- Periodic tasks ---------------------------------------------------------------------------

# Names, Celery tasks and intervals as they were listed in settings (PERIODIC_TASKS).
PERIODIC = {
    "process-release": ("console.release_dead_processes", 30.0),
    "egress-ingest": ("sandboxes.egress_ingest", 5.0),
    "reaper": ("sandboxes.reaper_pass", 60.0),
    "idle-sweep": ("sandboxes.idle_sweep", 60.0),
    "retention": ("sandboxes.retention_pass", 3600.0),
    "egress-housekeeping": ("sandboxes.egress_housekeeping", 60.0),
    "network-catch-up": ("sandboxes.network_catch_up", 60.0),
    "pool-refill": ("sandboxes.pool_refill", 10.0),
    "terminal-sweep": ("sandboxes.terminal_sweep", 60.0),
    "activity-sample": ("console.activity_sample", 60.0),
    "skill-git-check": ("skills.git_check", 3600.0),
}


def test_periodic_tasks_keep_their_names_celery_tasks_and_intervals() -> None:
    registered = periodic.discover()
    assert {name: (spec.task, spec.every_s()) for name, spec in registered.items()} == PERIODIC
    from console.celery import app

    for spec in registered.values():
        assert app.tasks[spec.task].run is spec.function, spec.name
    assert periodic.beat_schedule() == {
        name: {"task": task, "schedule": every} for name, (task, every) in sorted(PERIODIC.items())
    }


def test_a_tuned_interval_reaches_the_schedule(tuned: Tuned) -> None:
    tuned(sessions={"reaper_interval_s": 2}, processes={"heartbeat_window_s": 9})
    schedule = periodic.beat_schedule()
    assert schedule["reaper"]["schedule"] == 2.0
    assert schedule["process-release"]["schedule"] == 5.0  # a third of the window, at least 5 s


def test_celery_beat_runs_the_registered_schedule(tmp_path: Path) -> None:
    """`celery beat` itself (its memory broker: REDIS_URL unset) stores the schedule it runs."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(
        DJANGO_SETTINGS_MODULE="console.settings.test",
        CONSOLE_VAR_DIR=str(tmp_path),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        CONSOLE_TUNING="sessions.idle_sweep_interval_s=7",
    )
    schedule_file = tmp_path / "beat-schedule"
    beat = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "celery"), "-A", "console", "beat", "--schedule", str(schedule_file)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    entries: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and beat.poll() is None:
            time.sleep(0.5)
            if schedule_file.with_suffix(".dat").exists() or schedule_file.exists():
                try:
                    # The file this test's own beat just wrote.
                    with shelve.open(str(schedule_file), flag="r") as stored:  # noqa: S301
                        entries = dict(stored.get("entries", {}))
                except Exception:  # noqa: S112 - beat is still writing it
                    continue
                if entries:
                    break
    finally:
        beat.terminate()
        _, stderr = beat.communicate(timeout=30)
    ours = {
        name: (entry.task, entry.schedule.run_every.total_seconds())
        for name, entry in entries.items()
        if not name.startswith("celery.")
    }
    assert ours == {**PERIODIC, "idle-sweep": ("sandboxes.idle_sweep", 7.0)}, stderr[-3000:]


# --- Email ------------------------------------------------------------------------------------


def test_email_url_sets_djangos_email_settings() -> None:
    assert email_settings("") == {"EMAIL_HOST": ""}
    assert email_settings("smtp://mail.example.test") == {
        "EMAIL_HOST": "mail.example.test",
        "EMAIL_PORT": 25,
        "EMAIL_HOST_USER": "",
        "EMAIL_HOST_PASSWORD": "",
        "EMAIL_USE_TLS": False,
    }
    tls = email_settings("smtp+tls://console%40example.test:p%40ss@mail.example.test:2525")
    assert (tls["EMAIL_HOST_USER"], tls["EMAIL_HOST_PASSWORD"], tls["EMAIL_PORT"], tls["EMAIL_USE_TLS"]) == (
        "console@example.test",
        "p@ss",
        2525,
        True,
    )
    assert email_settings("smtp+tls://mail.example.test")["EMAIL_PORT"] == 587
    for bad in ("http://mail.example.test", "smtp://"):
        with pytest.raises(ValueError, match="EMAIL_URL"):
            email_settings(bad)


def test_email_url_keeps_a_plus_in_the_sender_and_names_itself_for_a_bad_port() -> None:
    # In a query "+" is read as a space: a plus-addressed sender would lose its plus.
    sender = email_settings("smtp://mail.example.test?from=console+ops@example.test")["DEFAULT_FROM_EMAIL"]
    assert sender == "console+ops@example.test"
    for bad in ("smtp://mail.example.test:mail", "smtp://mail.example.test:99999"):
        with pytest.raises(ValueError, match="EMAIL_URL"):
            email_settings(bad)


def test_a_bad_email_url_stops_the_start_with_a_message(run_manage: Manage) -> None:
    result = run_manage("check", EMAIL_URL="http://mail.example.test")
    assert result.returncode != 0
    assert "error: EMAIL_URL must be smtp://" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
