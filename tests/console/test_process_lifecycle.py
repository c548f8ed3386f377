"""A console process's end, on a real one: killed (`kill -9`) it leaves no work held, stopped
(SIGTERM) it ends within its grace.

One installation for the module, run as `make start` runs it (tests/support/console_process.py):
`python -m console.serve` in the embedded mode (jobs in threads of the web process) on a
PostgreSQL database of its own and the real Docker engine, driven over HTTP. Its space may
run three execs at once; the grace of a stop is 5 s and the reaper runs every second, so a
scheduler still at work after SIGTERM shows in the jobs table.

- kill -9 during three execs of an hour: after the restart an exec of that space runs at once
  (it was refused with 429 "3 commands are running" for the execs' whole timeout);
- kill -9 during a skill install: the job fails "Interrupted by a restart", its generation
  fails, and a new install is accepted and succeeds at once (it was refused for two hours);
- SIGTERM during a long exec: the process is gone within the grace, the exec answered 503
  `shutting_down`, no reaper pass started after the signal and the slot is free;
- SIGTERM during a short exec: it finishes with its answer, and the process exits then.

Nothing here reaches past 127.0.0.1; every sandbox, volume and image the console makes
carries the run's installation id and is removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.console_process import (
    INSTALLATION_LABEL,
    Answer,
    ApiClient,
    Console,
    docker_api,
    remove_docker_leftovers,
    wait_for,
)
from tests.support.tuning import tuning_env

pytestmark = [pytest.mark.docker, pytest.mark.postgres]

GRACE_S = 5
SKILL = "commit-message-style"  # no dependencies: its install is a short build


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    import docker
    import psycopg

    from sandboxes.backends.docker.image import build_base_image
    from tests.conftest import require_service

    require_service("docker")
    require_service("postgres")
    build_base_image(client=docker.from_env(timeout=120))  # built once if missing, kept
    workdir = tmp_path_factory.mktemp("lifecycle-console")
    server_url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    database = f"lifecycle_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{database}"')
    console = Console(
        workdir=workdir,
        installation_id=f"lifecycle-{uuid.uuid4().hex[:10]}",
        database_url=server_url.rsplit("/", 1)[0].replace("postgresql://", "postgres://", 1) + f"/{database}",
        extra_env=tuning_env(
            {
                "processes.shutdown_grace_s": GRACE_S,
                "sessions.reaper_interval_s": 1,
                "sessions.idle_sweep_interval_s": 3600,
            }
        ),
    )
    try:
        console.set_up()
        console.manage(
            "shell",
            "-c",
            "from console.models import Space, SpaceLimits\n"
            "SpaceLimits.objects.update_or_create(space=Space.objects.get(slug='faults'), "
            "defaults={'concurrent_execs': 3})\n",
        )
        console.manage("import_skill", str(Path(__file__).resolve().parents[2] / "skills" / "examples" / SKILL))
        console.start_web()
        yield console
    finally:
        console.stop_all()
        remove_docker_leftovers(console.installation_id)
        api = docker_api()
        for image in api.images(filters={"label": [f"{INSTALLATION_LABEL}={console.installation_id}"]}):
            with contextlib.suppress(Exception):
                api.remove_image(image["Id"], force=True)
        with psycopg.connect(server_url, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def running(console: Console) -> Console:
    web = console.processes.get("web")
    if web is None or not web.alive():
        console.start_web()
    return console


class InFlight:
    """An API call in a thread of its own: its answer, or the error that ended it."""

    def __init__(self, call: Any) -> None:
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Any) -> None:
        try:
            self.answer = call()
        except BaseException as exc:
            self.error = exc


def exec_in_flight(api: ApiClient, key: str, command: str, timeout_s: int) -> InFlight:
    return InFlight(lambda: api.call("POST", key, "exec", {"shell": command, "timeout_s": timeout_s}))


def slots(console: Console) -> int:
    return int(console.query("SELECT count(*) FROM sandboxes_execslot")[0][0])


def logs(console: Console) -> str:
    return "\n".join(f"--- {name}\n{process.tail(40)}" for name, process in console.processes.items())


def test_a_kill_9_during_three_long_execs_leaves_the_space_free_to_exec(console: Console) -> None:
    api = running(console).api()
    assert api.resolve("execs").status == 200
    calls = [exec_in_flight(api, "execs", "sleep 3600", 3600) for _ in range(3)]
    wait_for(lambda: slots(console) == 3, timeout=60, what="three execs in flight")
    full = api.shell("execs", "true")
    assert full.status == 429, full.body  # the limit holds while they run

    console.processes["web"].kill()
    for call in calls:
        call.thread.join(30)
    console.start_web()

    started = time.monotonic()
    answer = console.api().shell("execs", "echo free")
    took = time.monotonic() - started
    assert answer.status == 200, f"{answer.status} {answer.body}\n{logs(console)}"
    assert answer.body["stdout"] == "free\n"
    assert took < 15, f"the exec waited {took:.1f} s"
    assert slots(console) == 0
    # The session no longer counts execs nobody runs (the idle sweep would wait for them).
    in_flight = console.query("SELECT execs_in_flight FROM sandboxes_session WHERE key = 'execs'")[0][0]
    assert in_flight == 0
    print(f"after kill -9 with 3 of 3 exec slots held, an exec answered in {took:.1f} s")


def _job(console: Console, job_id: str) -> tuple[str, str]:
    status, error = console.query(
        f"SELECT status, error FROM console_adminjob WHERE id = '{uuid.UUID(job_id)}'"  # noqa: S608 - a UUID
    )[0]
    return str(status), str(error)


def _generation_of(console: Console, job_id: str) -> list[tuple[Any, ...]]:
    return console.query(
        f"SELECT generation, status FROM skills_skillimage WHERE job_id = '{uuid.UUID(job_id)}'"  # noqa: S608 - a UUID
    )


def _install_jobs(console: Console) -> list[str]:
    rows = console.query("SELECT id FROM console_adminjob WHERE kind = 'skills.install' ORDER BY created")
    return [str(row[0]) for row in rows]


def test_a_skill_install_killed_mid_run_fails_and_a_new_one_starts_at_once(console: Console) -> None:
    running(console)
    space_id = console.space_id
    config_id = str(console.query("SELECT id FROM sandboxes_sandboxconfig WHERE name = 'faults'")[0][0])
    version_id = str(console.query("SELECT id FROM skills_skillversion ORDER BY created DESC LIMIT 1")[0][0])
    page = f"/spaces/{space_id}/skill-image/?config={config_id}"
    install = f"/spaces/{space_id}/skill-image/install/"
    ui = console.ui()

    ui.post(install, {"config": config_id, "version": version_id}, csrf_from=page)
    (first,) = _install_jobs(console)
    wait_for(
        lambda: [status for _, status in _generation_of(console, first)] == ["building"],
        timeout=60,
        what="the install building its generation",
    )
    console.processes["web"].kill()  # mid-build
    console.start_web()

    status, error = _job(console, first)
    assert status == "failed", f"{status} {error}\n{logs(console)}"
    assert error.startswith("Interrupted by a restart")
    assert [status for _, status in _generation_of(console, first)] == ["failed"]

    started = time.monotonic()
    console.ui().post(install, {"config": config_id, "version": version_id}, csrf_from=page)
    jobs = _install_jobs(console)
    assert len(jobs) == 2, "the new install was refused"
    wait_for(lambda: _job(console, jobs[1])[0] in {"succeeded", "failed"}, timeout=300, what="the new install")
    assert _job(console, jobs[1]) == ("succeeded", ""), logs(console)
    took = time.monotonic() - started
    assert _generation_of(console, jobs[1]) == [(2, "ready")]
    print(f"install retried after the crash and done in {took:.1f} s")


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _reaper_passes_since(console: Console, when: float) -> int:
    rows = console.query(
        f"SELECT count(*) FROM console_adminjob WHERE kind = 'sandboxes.reap' AND created > to_timestamp({float(when)})"  # noqa: S608 - a number
    )
    return int(rows[0][0])


def test_sigterm_cuts_a_long_exec_after_the_grace_and_stops_the_scheduler_at_once(console: Console) -> None:
    api = running(console).api()
    assert api.resolve("stop-long").status == 200
    console.wait_for_reaper_passes(1, timeout=30)  # the scheduler runs
    call = exec_in_flight(api, "stop-long", "sleep 30", 60)
    wait_for(lambda: slots(console) == 1, timeout=30, what="the exec in flight")
    web = console.processes["web"]
    popen = web.popen
    assert popen is not None

    port = console.web_ports["web"]
    signalled = time.time()
    os.kill(web.pid, signal.SIGTERM)
    wait_for(lambda: _refused(port), timeout=2, what="the port closed", every=0.05)  # at once
    popen.wait(GRACE_S + 10)
    took = time.time() - signalled
    call.thread.join(10)

    assert took < GRACE_S + 5, f"the process took {took:.1f} s to exit after SIGTERM (grace {GRACE_S} s)"
    assert took >= GRACE_S - 0.5, f"the exec was cut after {took:.1f} s, before the grace"
    assert call.answer is not None, f"no answer: {call.error}"
    assert call.answer.status == 503, call.answer.body
    assert call.answer.body["error"]["code"] == "shutting_down"
    # A pass may have been starting as the signal came; none after that.
    assert _reaper_passes_since(console, signalled + 1.5) == 0
    assert slots(console) == 0
    print(f"exited {took:.1f} s after SIGTERM with a 30 s exec in flight (grace {GRACE_S} s)")


def test_sigterm_lets_a_short_exec_finish_and_exits_then(console: Console) -> None:
    api = running(console).api()
    assert api.resolve("stop-short").status == 200
    call = exec_in_flight(api, "stop-short", "sleep 1.5; echo done", 60)
    wait_for(lambda: slots(console) == 1, timeout=30, what="the exec in flight")
    web = console.processes["web"]
    assert web.popen is not None

    signalled = time.time()
    os.kill(web.pid, signal.SIGTERM)
    web.popen.wait(GRACE_S + 10)
    took = time.time() - signalled
    call.thread.join(10)

    assert call.answer is not None, f"no answer: {call.error}"
    assert call.answer.status == 200, call.answer.body
    assert call.answer.body["stdout"] == "done\n"
    assert took < GRACE_S, f"the process waited {took:.1f} s although its only request ended before"


_DOOMED = """
import json
from console.models import Space
from console.services import SYSTEM, do_create_space
from sandboxes.api.tokens import do_create_api_token
from sandboxes.catalog.services import do_create_config
from sandboxes.models import PlatformBackend

faults = Space.objects.get(slug="faults")
engine = PlatformBackend.objects.get(name="local engine")
space = do_create_space(name="Doomed", slug="doomed", actor=SYSTEM)
engine.spaces.add(space)
base = faults.sandbox_configs.get()
do_create_config(
    space,
    data={"name": "doomed", "backend": engine, "default_template": base.default_template, "cpus": 1,
          "memory_mb": 256, "pids_limit": 128, "persistent_workspace": True, "is_default": True},
    api_key="",
    actor=SYSTEM,
)
token, raw = do_create_api_token(space, name="doomed", actor=SYSTEM)
print("DOOMED " + json.dumps({"space_id": str(space.id), "token": raw}))
"""


def test_a_space_teardown_killed_mid_run_fails_and_deleting_again_finishes_it(console: Console) -> None:
    """kill -9 while a space's teardown job deletes its sessions: after the restart the job
    has failed "Interrupted by a restart", the space is still there, its delete page says so
    and offers to delete again, and that second teardown leaves nothing of it on the engine."""
    running(console)
    seed = json.loads(console.manage("shell", "-c", _DOOMED).split("DOOMED ", 1)[1].splitlines()[0])
    space_id = seed["space_id"]
    api = ApiClient(f"http://127.0.0.1:{console.web_ports['web']}", space_id, seed["token"])
    keys = [f"doomed-{n}" for n in range(4)]
    for key in keys:
        answer = api.resolve(key)
        assert answer.status == 200, answer.body
    label = f"console.meta.console-space={space_id}"
    engine = docker_api()
    assert len(engine.containers(all=True, filters={"label": label})) == 4

    page = f"/spaces/{space_id}/delete/"
    console.ui().post(page, {"confirm_slug": "doomed"}, csrf_from=page)
    kind = "sandboxes.teardown_space"
    (job_id,) = [str(r[0]) for r in console.query(f"SELECT id FROM console_adminjob WHERE kind = '{kind}'")]  # noqa: S608
    log_sql = f"SELECT log FROM console_adminjob WHERE id = '{uuid.UUID(job_id)}'"  # noqa: S608 - a UUID
    wait_for(
        lambda: "Deleted session" in str(console.query(log_sql)[0][0]),
        timeout=120,
        what="the teardown deleting its first session",
    )
    console.processes["web"].kill()
    console.start_web()

    status, error = _job(console, job_id)
    assert status == "failed", f"{status} {error}\n{logs(console)}"
    assert error.startswith("Interrupted by a restart")
    assert console.query(f"SELECT count(*) FROM console_space WHERE id = '{uuid.UUID(space_id)}'")[0][0] == 1  # noqa: S608
    ui = console.ui()
    with ui.opener.open(ui.base_url + page, timeout=30) as answer:
        confirm = answer.read().decode()
    assert "The last attempt stopped: Interrupted by a restart" in confirm
    assert "Delete again" in confirm

    ui.post(page, {"confirm_slug": "doomed"}, csrf_from=page)
    jobs = [str(r[0]) for r in console.query(f"SELECT id FROM console_adminjob WHERE kind = '{kind}' ORDER BY created")]  # noqa: S608
    assert len(jobs) == 2, "deleting again was refused"
    wait_for(lambda: _job(console, jobs[1])[0] in {"succeeded", "failed"}, timeout=240, what="the second teardown")
    assert _job(console, jobs[1]) == ("succeeded", ""), logs(console)
    assert console.query(f"SELECT count(*) FROM console_space WHERE id = '{uuid.UUID(space_id)}'")[0][0] == 0  # noqa: S608
    assert engine.containers(all=True, filters={"label": label}) == []
    assert (engine.volumes(filters={"label": label}).get("Volumes") or []) == []
