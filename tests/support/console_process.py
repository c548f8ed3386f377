"""The console as real processes, and servers of its own to break: for fault tests and bench/faults.py.

- `RedisServer`, `PostgresServer`: a redis-server / a PostgreSQL cluster (initdb, pg_ctl from
  the installed binaries) on a free loopback port, which a test may flush, kill, restart;
  the shared servers are never touched.
- `Console`: one installation of the console (its own database, installation id and working
  folder) whose processes are started the way `make start` does: Daphne (`web`), and in the
  scaled mode a Celery worker and beat. Each process can be stopped, killed, frozen, thawed.
- `ApiClient` speaks the agent API over HTTP; `UiClient` logs in and uses the session pages.

Every address is 127.0.0.1. Every sandbox and volume the console makes carries its
installation id (`console.meta.console-installation`), which `remove_docker_leftovers`
sweeps. Standard library plus what the console already depends on.
"""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
ADMIN_USER, ADMIN_PASSWORD = "faults-admin", "faults-admin-password"
BASE_IMAGE = "sandbox-console/base:latest"
INSTALLATION_LABEL = "console.meta.console-installation"

T = TypeVar("T")
# Never through a proxy from the environment: every request here is for 127.0.0.1.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(check: Callable[[], T | None], *, timeout: float, what: str, every: float = 0.2) -> T:
    """Polls `check` until it returns something other than None/False; fails after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value is not None and value is not False:
                return value
        except Exception as exc:
            last_error = exc
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:g} s" + (f" (last error: {last_error})" if last_error else ""))


class Process:
    """One child process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_dir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv, env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            # The whole group: Daphne, Celery and PostgreSQL have children of their own.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (a graceful stop), SIGKILL if it does not end in time."""
        if self.popen is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self.popen = None

    def kill(self) -> None:
        if self.popen is None:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        self.popen = None

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# --- Servers of our own ---------------------------------------------------------------------


class RedisServer:
    """A redis-server without persistence: a restart comes back empty, as the worst case does."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir / f"redis-{self.port}"
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.workdir), "--protected-mode", "no",
        ]  # fmt: skip
        self.process = Process(f"redis-{self.port}", argv, {"PATH": os.environ.get("PATH", "")}, self.workdir)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=2)

    def start(self) -> None:
        self.process.start()
        wait_for(lambda: self.client().ping(), timeout=20, what=f"redis-server on {self.port}")

    def flush(self) -> None:
        self.client().flushall()

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.kill()


class PostgresServer:
    """A PostgreSQL cluster of our own (initdb + pg_ctl), run as the postgres user when we are root."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.root = workdir / f"pg-{self.port}"
        self.data = self.root / "data"
        self.bin = _postgres_bin()

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        command = [str(self.bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=check, capture_output=True, cwd="/", timeout=120)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            # The postgres user must reach its folder through ours (mkdtemp makes them 0700).
            for parent in self.root.parents:
                if parent == Path("/tmp") or parent == parent.parent:
                    break
                parent.chmod(parent.stat().st_mode | 0o711)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop("fast")
        self.start()

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if not found:
        raise FileNotFoundError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin")
    return found[-1].parent


def postgres_binaries_missing() -> str | None:
    try:
        _postgres_bin()
    except FileNotFoundError as exc:
        return str(exc)
    return None if shutil.which("redis-server") else "no redis-server binary"


# --- The console ----------------------------------------------------------------------------

_SEED = """
import json
from django.contrib.auth import get_user_model
from console.models import Membership
from console.services import SYSTEM, do_create_space
from sandboxes.api.tokens import do_create_api_token
from sandboxes.catalog.services import do_create_config
from sandboxes.models import PlatformBackend

user = get_user_model().objects.create_superuser(username={user!r}, password={password!r}, email="")
space = do_create_space(name="Faults", slug="faults", actor=SYSTEM)
# The platform's local engine, granted to the space (as `make start` registers it).
engine = PlatformBackend.objects.create(name="local engine", kind="docker")
engine.spaces.add(space)
config = do_create_config(
    space,
    data={{"name": "faults", "backend": engine, "default_template": {image!r}, "cpus": 1, "memory_mb": 256,
          "pids_limit": 128, "persistent_workspace": True, "is_default": True}},
    api_key="",
    actor=SYSTEM,
)
token, raw = do_create_api_token(space, name="faults", actor=SYSTEM)
print("SEED " + json.dumps({{"space_id": str(space.id), "token": raw, "config_id": str(config.id)}}))
"""


@dataclass
class Console:
    """One installation of the console: a database, an installation id, processes."""

    workdir: Path
    installation_id: str
    database_url: str
    redis_url: str = ""  # empty = the embedded mode
    extra_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, Process] = field(default_factory=dict)
    space_id: str = ""
    token: str = ""
    web_ports: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "DJANGO_SETTINGS_MODULE": "console.settings.dev",
            "DATABASE_URL": self.database_url,
            "CONSOLE_VAR_DIR": str(self.workdir),
            "CONSOLE_INSTALLATION_ID": self.installation_id,
            "SECRET_KEY": "fault-campaign-secret-key",
            "FIELD_ENCRYPTION_KEY": "i-jd3i8P6hAsBXbyr7FvRh-DyH0dvHOP5x0g-mmpuj8=",
            "PYTHONUNBUFFERED": "1",
        }
        if self.redis_url:
            env["REDIS_URL"] = self.redis_url
        env.update(self.extra_env)
        return env

    def manage(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [str(VENV_BIN / "python"), "manage.py", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return done.stdout.decode(errors="replace")

    def set_up(self) -> None:
        """Migrate, then make the admin, a space with a Docker config and an API token."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.manage("migrate", "--noinput")
        script = _SEED.format(user=ADMIN_USER, password=ADMIN_PASSWORD, image=BASE_IMAGE)
        out = self.manage("shell", "-c", script)
        seed = json.loads(out.split("SEED ", 1)[1].splitlines()[0])
        self.space_id, self.token = seed["space_id"], seed["token"]

    # Processes -----------------------------------------------------------------------

    def start_web(self, name: str = "web") -> Process:
        port = self.web_ports.get(name) or free_port()
        self.web_ports[name] = port
        # As `make start` runs it: Daphne with the bounded shutdown (console/serve.py).
        argv = [str(VENV_BIN / "python"), "-m", "console.serve", "-b", "127.0.0.1", "-p", str(port),
                "console.asgi:application"]  # fmt: skip
        process = Process(name, argv, self.env, self.workdir)
        process.start()
        self.processes[name] = process
        wait_for(lambda: self._answers(port, process), timeout=60, what=f"console {name} on port {port}")
        return process

    def _answers(self, port: int, process: Process) -> bool:
        if not process.alive():
            raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
        with _DIRECT.open(f"http://127.0.0.1:{port}/login/", timeout=5) as answer:
            return bool(answer.status == 200)

    def start_worker(self, name: str = "worker") -> Process:
        argv = [str(VENV_BIN / "celery"), "-A", "console", "worker", "--loglevel=INFO", "--pool=threads",
                "--concurrency=2", "-n", f"{name}-{self.installation_id}@%h",
                "--without-gossip", "--without-mingle"]  # fmt: skip
        return self._start_plain(name, argv)

    def start_beat(self, name: str = "beat") -> Process:
        schedule = self.workdir / "celerybeat-schedule"
        argv = [str(VENV_BIN / "celery"), "-A", "console", "beat", "--loglevel=INFO", "--schedule", str(schedule)]
        return self._start_plain(name, argv)

    def _start_plain(self, name: str, argv: list[str]) -> Process:
        process = Process(name, argv, self.env, self.workdir)
        process.start()
        self.processes[name] = process
        return process

    def start_all(self) -> None:
        self.start_web()
        if self.redis_url:
            self.start_worker()
            self.start_beat()

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.stop()

    def restart_all(self) -> None:
        """Every console process stopped, then started again (a deploy, a host reboot)."""
        names = list(self.processes)
        self.stop_all()
        self.start_named(names)

    def start_named(self, names: list[str]) -> None:
        for name in names:
            if name.startswith("web"):
                self.start_web(name)
            elif name.startswith("worker"):
                self.start_worker(name)
            elif name.startswith("beat"):
                self.start_beat(name)

    def api(self, web: str = "web") -> ApiClient:
        return ApiClient(f"http://127.0.0.1:{self.web_ports[web]}", self.space_id, self.token)

    def ui(self, web: str = "web") -> UiClient:
        client = UiClient(f"http://127.0.0.1:{self.web_ports[web]}")
        client.login(ADMIN_USER, ADMIN_PASSWORD)
        return client

    # What the database says ---------------------------------------------------------

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        """One read of the console's own database (SQLite file or PostgreSQL)."""
        if self.database_url.startswith("sqlite:///"):
            import sqlite3

            with contextlib.closing(sqlite3.connect(self.database_url.removeprefix("sqlite:///"), timeout=10)) as db:
                return list(db.execute(sql).fetchall())
        import psycopg

        with psycopg.connect(self.database_url.replace("postgres://", "postgresql://", 1), connect_timeout=5) as db:
            return list(db.execute(sql).fetchall())

    def finished_reaper_passes(self) -> set[str]:
        rows = self.query("SELECT id FROM console_adminjob WHERE kind = 'sandboxes.reap' AND finished IS NOT NULL")
        return {str(row[0]) for row in rows}

    def wait_for_reaper_passes(self, count: int, *, timeout: float = 120) -> None:
        """Until `count` reaper passes have finished that had not when this was called."""
        before = self.finished_reaper_passes()
        wait_for(
            lambda: len(self.finished_reaper_passes() - before) >= count,
            timeout=timeout,
            what=f"{count} more reaper passes of {self.installation_id}",
        )


# --- Clients --------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: Any
    raw: bytes = b""


class ApiClient:
    """The agent API of one console process (bearer token of the space)."""

    def __init__(self, base_url: str, space_id: str, token: str, timeout: float = 120) -> None:
        self.base_url, self.space_id, self.token, self.timeout = base_url, space_id, token, timeout

    def call(self, method: str, key: str, tail: str = "", body: Any = None, *, raw: bytes | None = None) -> Answer:
        url = f"{self.base_url}/api/v1/spaces/{self.space_id}/sessions/{urllib.parse.quote(key)}/{tail}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - 127.0.0.1 only
        request.add_header("Authorization", f"Bearer {self.token}")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with _DIRECT.open(request, timeout=self.timeout) as answer:
                content = answer.read()
                return Answer(answer.status, _json_or_none(content), content)
        except urllib.error.HTTPError as exc:
            content = exc.read()
            return Answer(exc.code, _json_or_none(content), content)

    def resolve(self, key: str) -> Answer:
        return self.call("POST", key, "resolve", {})

    def session(self, key: str) -> Answer:
        return self.call("GET", key)

    def delete(self, key: str) -> Answer:
        return self.call("DELETE", key)

    def shell(self, key: str, command: str) -> Answer:
        return self.call("POST", key, "exec", {"shell": command, "timeout_s": 60})


def _json_or_none(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return None


class UiClient:
    """A logged-in admin on the console's pages (for what the agent API does not offer: pause)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.cookies = http.cookiejar.CookieJar()
        # No proxy handler: every request goes straight to 127.0.0.1.
        self.opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPCookieProcessor(self.cookies)
        )

    def _csrf(self, path: str) -> str:
        with self.opener.open(self.base_url + path, timeout=30) as answer:
            page = answer.read().decode(errors="replace")
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if found:
            return found.group(1)
        return next(cookie.value for cookie in self.cookies if cookie.name == "csrftoken") or ""

    def post(self, path: str, fields: dict[str, str], *, csrf_from: str) -> int:
        token = self._csrf(csrf_from)
        data = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": token}).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method="POST")  # noqa: S310
        request.add_header("Referer", self.base_url + csrf_from)
        with self.opener.open(request, timeout=120) as answer:
            return int(answer.status)

    def login(self, username: str, password: str) -> None:
        self.post("/login/", {"username": username, "password": password}, csrf_from="/login/")
        if not any(cookie.name == "sessionid" for cookie in self.cookies):
            raise RuntimeError("could not log in to the console")

    def session_action(self, session_id: str, action: str) -> int:
        page = f"/sessions/{session_id}/"
        return self.post(f"{page}actions/{action}/", {}, csrf_from=page)


# --- Docker ---------------------------------------------------------------------------------


def docker_api() -> Any:
    import docker

    return docker.from_env(timeout=120).api


def live_sandboxes(installation_id: str) -> dict[str, list[str]]:
    """Session key -> ids of that installation's containers for it that the engine still has."""
    found: dict[str, list[str]] = {}
    rows = docker_api().containers(all=True, filters={"label": [f"{INSTALLATION_LABEL}={installation_id}"]})
    for row in rows:
        if row["State"] in ("removing", "dead"):
            continue
        key = (row.get("Labels") or {}).get("console.meta.console-session", "")
        found.setdefault(key, []).append(row["Id"])
    return found


def remove_docker_leftovers(installation_id: str) -> None:
    api = docker_api()
    selector = {"label": [f"{INSTALLATION_LABEL}={installation_id}"]}
    for row in api.containers(all=True, filters=selector):
        with contextlib.suppress(Exception):
            api.remove_container(row["Id"], force=True)
    for volume in api.volumes(filters=selector).get("Volumes") or []:
        with contextlib.suppress(Exception):
            api.remove_volume(volume["Name"], force=True)
