"""Faults on a real console: its processes restarted, its Redis flushed or restarted, its
PostgreSQL restarted.

The console runs as real processes (Daphne; in the scaled mode also a Celery worker and beat,
on a Redis server of the test's own and a database of its own), driven over HTTP through the
agent API, on the real Docker engine. Each test drives sessions, writes a file in /workspace
and one in /tmp (only the same sandbox still has the second), breaks something, waits past
the reaper's grace for its passes (both shortened by their settings), and then asks: does
every session still have the very sandbox it had, with its files?

Nothing here reaches past 127.0.0.1; every sandbox and volume carries the run's installation
id and is removed at the end.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.support.console_process import (
    ApiClient,
    Console,
    PostgresServer,
    RedisServer,
    docker_api,
    live_sandboxes,
    postgres_binaries_missing,
    remove_docker_leftovers,
)
from tests.support.tuning import tuning_env

pytestmark = [pytest.mark.docker]

GRACE_S = 3
# Short passes, and no idle sweep in the way: what is tested is what the reaper does.
FAST_REAPER = tuning_env(
    {"sessions.reaper_grace_s": GRACE_S, "sessions.reaper_interval_s": 2, "sessions.idle_sweep_interval_s": 3600}
)


def _need_redis_server() -> None:
    if shutil.which("redis-server"):
        return
    if IN_CI:
        pytest.fail("[CI] required binary missing: redis-server", pytrace=False)
    pytest.skip("needs the redis-server binary (a Redis of the test's own to flush and restart)")


def drive(api: ApiClient, keys: list[str]) -> dict[str, str]:
    """Resolve each session and leave a marker file in /workspace and in /tmp; key -> sandbox id."""
    sandboxes = {}
    for key in keys:
        answer = api.resolve(key)
        assert answer.status == 200, answer.body
        sandboxes[key] = answer.body["sandbox_id"]
        wrote = api.shell(key, f"echo {key} > /workspace/kept.txt && echo {key} > /tmp/kept.txt")
        assert wrote.status == 200, wrote.body
        assert wrote.body["exit_code"] == 0, wrote.body
    return sandboxes


def assert_kept(console: Console, api: ApiClient, sandboxes: dict[str, str]) -> None:
    """Before any resolve: the engine still has each sandbox; then each session answers with it."""
    live = live_sandboxes(console.installation_id)
    for key, sandbox_id in sandboxes.items():
        assert live.get(key) == [sandbox_id], f"session {key}: had {sandbox_id}, the engine now has {live.get(key)}"
    for key, sandbox_id in sandboxes.items():
        answer = api.resolve(key)
        assert answer.status == 200, answer.body
        assert answer.body["sandbox_id"] == sandbox_id, f"session {key} came back on another sandbox"
        files = api.shell(key, "cat /workspace/kept.txt /tmp/kept.txt")
        assert files.status == 200, files.body
        assert files.body["stdout"] == f"{key}\n{key}\n", files.body


def wait_past_grace(console: Console) -> None:
    """Past the grace of everything made so far, and two whole reaper passes after that."""
    time.sleep(GRACE_S + 1)
    console.wait_for_reaper_passes(2, timeout=90)


def _fail_with_logs(console: Console) -> str:
    return "\n".join(f"--- {name}\n{process.tail(30)}" for name, process in console.processes.items())


# --- Embedded mode: one Daphne process on SQLite --------------------------------------------


@pytest.fixture
def embedded_console(docker_base_image: str, tmp_path: Path) -> Iterator[Console]:
    console = Console(
        workdir=tmp_path / "console",
        installation_id=f"faults-{uuid.uuid4().hex[:10]}",
        database_url=f"sqlite:///{tmp_path / 'console' / 'console.sqlite3'}",
        extra_env=FAST_REAPER,
    )
    try:
        console.set_up()
        console.start_all()
        yield console
    finally:
        console.stop_all()
        remove_docker_leftovers(console.installation_id)


def test_a_restart_of_the_embedded_console_keeps_every_session(embedded_console: Console) -> None:
    # The promise of the embedded mode, as a new user would try it.
    console = embedded_console
    api = console.api()
    sandboxes = drive(api, ["alpha", "beta"])
    paused = console.ui().session_action(api.session("beta").body["id"], "pause")
    assert paused == 200
    assert docker_api().inspect_container(sandboxes["beta"])["State"]["Status"] == "paused"

    console.restart_all()
    wait_past_grace(console)

    try:
        assert_kept(console, console.api(), sandboxes)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_fail_with_logs(console)}") from None


# --- Scaled mode: Daphne, a Celery worker and beat on PostgreSQL and a Redis of our own -----


@pytest.fixture(scope="module")
def scaled(docker_base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Console, RedisServer]]:
    import psycopg

    from tests.conftest import require_service

    require_service("redis")
    require_service("postgres")
    _need_redis_server()
    workdir = tmp_path_factory.mktemp("scaled-console")
    redis_server = RedisServer(workdir)
    redis_server.start()
    server_url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    database = f"faults_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{database}"')
    console = Console(
        workdir=workdir,
        installation_id=f"faults-{uuid.uuid4().hex[:10]}",
        database_url=server_url.rsplit("/", 1)[0].replace("postgresql://", "postgres://", 1) + f"/{database}",
        redis_url=redis_server.url,
        extra_env=FAST_REAPER,
    )
    try:
        console.set_up()
        console.start_all()
        yield console, redis_server
    finally:
        console.stop_all()
        redis_server.stop()
        remove_docker_leftovers(console.installation_id)
        with psycopg.connect(server_url, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


@pytest.mark.redis
@pytest.mark.postgres
def test_redis_flushed_in_the_scaled_mode_loses_no_session(scaled: tuple[Console, RedisServer]) -> None:
    console, redis_server = scaled
    api = console.api()
    sandboxes = drive(api, ["flush-1", "flush-2"])
    redis_server.flush()
    wait_past_grace(console)
    try:
        assert_kept(console, api, sandboxes)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_fail_with_logs(console)}") from None


@pytest.mark.redis
@pytest.mark.postgres
def test_its_own_redis_restarted_empty_loses_no_session(scaled: tuple[Console, RedisServer]) -> None:
    console, redis_server = scaled
    api = console.api()
    sandboxes = drive(api, ["restart-1", "restart-2"])
    redis_server.kill()
    down = api.resolve("restart-1")
    assert down.status == 503, f"with Redis down a resolve answered {down.status}: {down.body}"
    redis_server.start()  # the same port, empty: no persistence
    wait_past_grace(console)
    try:
        assert_kept(console, api, sandboxes)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_fail_with_logs(console)}") from None


# --- Scaled mode on a PostgreSQL of the test's own, restarted ------------------------------


@pytest.fixture(scope="module")
def on_own_postgres(
    docker_base_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Console, PostgresServer]]:
    from tests.conftest import require_service

    require_service("redis")
    require_service("postgres")
    _need_redis_server()
    missing = postgres_binaries_missing()
    if missing:
        if IN_CI:
            pytest.fail(f"[CI] required binaries missing: {missing}", pytrace=False)
        pytest.skip(f"needs the PostgreSQL server binaries: {missing}")
    workdir = tmp_path_factory.mktemp("own-postgres")
    redis_server, postgres = RedisServer(workdir), PostgresServer(workdir)
    redis_server.start()
    postgres.init()
    postgres.start()
    console = Console(
        workdir=workdir / "console",
        installation_id=f"faults-{uuid.uuid4().hex[:10]}",
        database_url=postgres.create_database("console"),
        redis_url=redis_server.url,
        extra_env=FAST_REAPER,
    )
    try:
        console.set_up()
        console.start_all()
        yield console, postgres
    finally:
        console.stop_all()
        redis_server.stop()
        postgres.remove()
        remove_docker_leftovers(console.installation_id)


@pytest.mark.redis
@pytest.mark.postgres
def test_a_postgresql_restart_answers_503_meanwhile_and_loses_no_session(
    on_own_postgres: tuple[Console, PostgresServer],
) -> None:
    console, postgres = on_own_postgres
    api = console.api()
    sandboxes = drive(api, ["pg-1", "pg-2"])
    postgres.stop("fast")
    try:
        down = api.resolve("pg-1")
        assert down.status == 503, f"with PostgreSQL down a resolve answered {down.status}: {down.raw[:300]!r}"
        assert down.body["error"]["retryable"] is True
    finally:
        postgres.start()
    wait_past_grace(console)
    try:
        assert_kept(console, api, sandboxes)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_fail_with_logs(console)}") from None
