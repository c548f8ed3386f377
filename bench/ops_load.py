"""Issue #15's acceptance, as an operator runs it: the production layout behind a local nginx.

Two Daphne replicas, a Celery worker and beat on PostgreSQL (`DATABASE_URL`, a database the
run may wipe) and a redis-server of its own, behind nginx configured from docs/operations.md
("Production": TLS with a self-signed certificate, the upstream of two replicas, websockets)
on free loopback ports. Then:

1. `load`: N sessions (default 20) driven concurrently through nginx with the agent API
   (resolve, a few execs, delete) while `/metrics` is scraped (METRICS_TOKEN) through nginx
   and from each replica; the series must agree between replicas and add up to what the
   clients did (API answers per replica from nginx's access log, creates, jobs of the worker).
2. `redis`: the Redis server killed: time until `/readyz` answers 503 naming the parts, then
   started again: time until 200.
3. `terminal`: a web terminal opened through nginx (login, ticket, websocket over TLS),
   `export FOO=bar`, the replica that served it SIGKILLed, reconnected through nginx: is it
   the same shell (`$FOO`, scrollback)?

Prints one JSON line per step and a summary. Everything on 127.0.0.1; the sandboxes, volumes
and processes it made are removed at the end (`--keep` keeps the logs folder).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/wt_x .venv/bin/python bench/ops_load.py
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from tests.support.console_process import (  # noqa: E402
    ADMIN_PASSWORD,
    ADMIN_USER,
    VENV_BIN,
    Console,
    Process,
    RedisServer,
    free_port,
    remove_docker_leftovers,
    wait_for,
)

HOST = "console.example.com"
INBOUND_DOMAIN = "sandboxes.example.net"  # every sandbox port's host is <label>-<port>.<this>
CA = ""  # the run's self-signed certificate (for 127.0.0.1 and HOST), set by Stack.start_nginx
METRICS_TOKEN = "ops-acceptance-metrics-token"  # noqa: S105 - this run's own, loopback only
NGINX_LOG_FORMAT = 'log_format replicas "$request_method $uri $status $upstream_addr $request_time $request_id";'


def emit(step: str, **fields: Any) -> dict[str, Any]:
    line = {"step": step, **fields}
    print(json.dumps(line), flush=True)
    return line


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


# --- The stack ---------------------------------------------------------------------------------


def reset_database(url: str) -> None:
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as db:
        db.execute("DROP SCHEMA public CASCADE")
        db.execute("CREATE SCHEMA public")


def nginx_config(workdir: Path, https_port: int, http_port: int, ports: list[int], static_root: Path) -> str:
    """docs/operations.md's nginx block, with ports, paths and an access log of our own."""
    doc = (REPO / "docs" / "operations.md").read_text()
    block = doc.split("### nginx", 1)[1].split("```nginx", 1)[1].split("```", 1)[0]
    block = block.replace(
        "server 127.0.0.1:8001;\n    server 127.0.0.1:8002;", "\n    ".join(f"server 127.0.0.1:{p};" for p in ports)
    )
    block = block.replace("listen 443 ssl", f"listen 127.0.0.1:{https_port} ssl").replace(
        "listen 80;", f"listen 127.0.0.1:{http_port};"
    )
    block = block.replace("/etc/ssl/console/", f"{workdir}/tls/")
    block = block.replace("/srv/sandbox-console/var/staticfiles/", f"{static_root}/")
    inbound = (REPO / "docs" / "inbound.md").read_text().split("```nginx", 1)[1].split("```", 1)[0]
    inbound = inbound.replace("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;")
    inbound = inbound.replace(
        "# ssl_certificate …;",
        f"ssl_certificate {workdir}/tls/fullchain.pem;\n    ssl_certificate_key {workdir}/tls/privkey.pem;",
    )
    block += inbound
    return (
        f"daemon off;\nworker_processes 1;\npid {workdir}/nginx.pid;\nerror_log {workdir}/nginx-error.log info;\n"
        f"events {{ worker_connections 512; }}\nhttp {{\n"
        f"  {NGINX_LOG_FORMAT}\n  access_log {workdir}/nginx-access.log replicas;\n"
        f"  client_body_temp_path {workdir}/nginx-tmp;\n  proxy_temp_path {workdir}/nginx-tmp;\n"
        f"  types {{ text/css css; application/javascript js; }}\n{block}\n}}\n"
    )


class Stack:
    def __init__(self, workdir: Path, database_url: str) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir)
        self.https_port, self.http_port = free_port(), free_port()
        self.base = f"https://127.0.0.1:{self.https_port}"
        self.static_root = workdir / "staticfiles"
        env = {
            "DJANGO_SETTINGS_MODULE": "console.settings.base",
            "ALLOWED_HOSTS": HOST,
            "CSRF_TRUSTED_ORIGINS": f"https://{HOST}",
            "CONSOLE_TLS": "true",
            "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https",
            "FORWARDED_FOR_PROXIES": "1",
            "STATIC_ROOT": str(self.static_root),
            "METRICS_TOKEN": METRICS_TOKEN,
            "INBOUND_BASE_URL": f"https://*.{INBOUND_DOMAIN}",
            "PROMETHEUS_MULTIPROC_DIR": str(workdir / "metrics"),
            # beat sends jobs the worker runs (counted there); nginx serves /static/
            "CONSOLE_TUNING": "sessions.reaper_interval_s=10,sessions.idle_sweep_interval_s=10,"
            "serving.static=false,logs.format=json",
        }
        self.console = Console(workdir, f"opsacc-{uuid.uuid4().hex[:8]}", database_url, self.redis.url, extra_env=env)
        self.web_ports: dict[str, int] = {"web1": free_port(), "web2": free_port()}
        self.nginx: Process | None = None

    def start(self) -> None:
        (self.workdir / "metrics").mkdir(parents=True, exist_ok=True)
        (self.workdir / "nginx-tmp").mkdir(exist_ok=True)
        self.redis.start()
        self.console.set_up()
        self.console.manage("collectstatic", "--noinput")
        for name in self.web_ports:
            self.start_web(name)
        argv = [str(VENV_BIN / "celery"), "-A", "console", "worker", "--pool=threads", "--concurrency=8",
                "-n", f"worker-{self.console.installation_id}@%h", "--without-gossip", "--without-mingle"]  # fmt: skip
        self.console._start_plain("worker", argv)
        schedule = self.workdir / "celerybeat-schedule"
        self.console._start_plain(
            "beat", [str(VENV_BIN / "celery"), "-A", "console", "beat", "--schedule", str(schedule)]
        )
        self.start_nginx()

    def start_web(self, name: str) -> None:
        port = self.web_ports[name]
        argv = [str(VENV_BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"]
        process = Process(name, argv, self.console.env, self.workdir)
        process.start()
        self.console.processes[name] = process
        wait_for(lambda: requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok, timeout=60, what=name)

    def start_nginx(self) -> None:
        tls = self.workdir / "tls"
        tls.mkdir(exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={HOST}",
             "-addext", f"subjectAltName=DNS:{HOST},DNS:*.{INBOUND_DOMAIN},IP:127.0.0.1",
             "-keyout", str(tls / "privkey.pem"), "-out", str(tls / "fullchain.pem")],
            check=True, capture_output=True,
        )  # fmt: skip
        global CA
        CA = str(tls / "fullchain.pem")
        conf = self.workdir / "nginx.conf"
        conf.write_text(
            nginx_config(self.workdir, self.https_port, self.http_port, list(self.web_ports.values()), self.static_root)
        )
        checked = subprocess.run(
            ["nginx", "-t", "-c", str(conf), "-p", str(self.workdir)], capture_output=True, text=True
        )
        emit("nginx_config", ok=checked.returncode == 0, says=checked.stderr.strip().splitlines()[-3:])
        if checked.returncode != 0:
            raise RuntimeError(checked.stderr)
        self.nginx = Process(
            "nginx", ["nginx", "-c", str(conf), "-p", str(self.workdir)], {"PATH": os.environ["PATH"]}, self.workdir
        )
        self.nginx.start()
        wait_for(lambda: self.get("/healthz").ok, timeout=20, what="nginx")

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Host": HOST, **kwargs.pop("headers", {})}
        return requests.get(self.base + path, headers=headers, verify=CA, timeout=kwargs.pop("timeout", 30), **kwargs)

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        self.console.stop_all()
        self.redis.stop()
        remove_docker_leftovers(self.console.installation_id)


# --- Metrics -----------------------------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    found = 0.0
    for key, value in samples.items():
        if (key == name or key.startswith(name + "{")) and all(f'{k}="{v}"' in key for k, v in labels.items()):
            found += value
    return found


def scrape(url: str, host: str | None = HOST) -> tuple[float, dict[str, float], int]:
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {METRICS_TOKEN}", **({"Host": host} if host else {})}
    answer = requests.get(url, headers=headers, verify=CA, timeout=30)
    return time.monotonic() - started, parse_metrics(answer.text) if answer.ok else {}, answer.status_code


# --- 1. load -------------------------------------------------------------------------------


def api(stack: Stack, method: str, key: str, tail: str = "", body: Any = None) -> tuple[int, Any, float]:
    url = f"{stack.base}/api/v1/spaces/{stack.console.space_id}/sessions/{key}/{tail}"
    started = time.monotonic()
    answer = requests.request(
        method, url, json=body, verify=CA, timeout=300,
        headers={"Host": HOST, "Authorization": f"Bearer {stack.console.token}"},
    )  # fmt: skip
    try:
        data = answer.json()
    except ValueError:
        data = None
    return answer.status_code, data, time.monotonic() - started


def drive_session(stack: Stack, key: str, execs: int, record: dict[str, list[Any]]) -> None:
    status, _, took = api(stack, "POST", key, "resolve", {})
    record["resolve"].append((status, took))
    for index in range(execs):
        status, data, took = api(stack, "POST", key, "exec", {"shell": f"echo {key}-{index}", "timeout_s": 60})
        ok = status == 200 and f"{key}-{index}" in json.dumps(data)
        record["exec"].append((status if ok else -status, took))


def load(stack: Stack, sessions: int, execs: int) -> dict[str, Any]:
    record: dict[str, list[Any]] = {"resolve": [], "exec": [], "delete": []}
    scrapes: list[tuple[float, int]] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            took, _, status = scrape(stack.base + "/metrics")
            scrapes.append((took, status))
            stop.wait(0.25)

    log = stack.workdir / "nginx-access.log"
    log_offset = log.stat().st_size if log.exists() else 0
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    keys = [f"load-{index:02d}" for index in range(sessions)]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        list(pool.map(lambda k: drive_session(stack, k, execs, record), keys))
    driven_s = time.monotonic() - started
    _, before_delete, _ = scrape(stack.base + "/metrics")
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        for status, _, took in pool.map(lambda k: api(stack, "DELETE", k), keys):
            record["delete"].append((status, took))
    stop.set()
    thread.join()
    time.sleep(1)

    # What each replica served, from nginx's access log; what the series say, from each replica.
    lines = log.read_bytes()[log_offset:].decode(errors="replace").splitlines()
    served: dict[str, int] = {}
    nginx_ids: set[str] = set()
    for line in lines:
        _method, uri, _status, upstream, _, request_id = (line.split(" ") + [""] * 6)[:6]
        if uri.startswith("/api/") and upstream:
            served[upstream] = served.get(upstream, 0) + 1
            nginx_ids.add(request_id)
    # The request id nginx made is the one the console logged; one upstream connection per request?
    daphne_ids: set[str] = set()
    connections: dict[str, tuple[int, int]] = {}
    for name in stack.web_ports:
        text = (stack.workdir / f"{name}.log").read_text(errors="replace")
        daphne_ids |= set(re.findall(r'"request_id": "([0-9a-f]{32})", "message": "[A-Z]+ /api/', text))
        access = re.findall(r'^(127\.0\.0\.1:\d+) - - \[[^]]+\] "[A-Z]+ /api/', text, re.MULTILINE)
        connections[name] = (len(access), len(set(access)))
    wait_for(lambda: stack.console.finished_reaper_passes(), timeout=60, what="a reaper pass on the worker")
    time.sleep(2)  # not while a pass runs: passes start every 10 s and take well under a second
    views = {name: scrape(f"http://127.0.0.1:{port}/metrics", host=None)[1] for name, port in stack.web_ports.items()}
    views["nginx"] = scrape(stack.base + "/metrics")[1]
    api_counts = {name: total(s, "console_http_requests_total", area="api") for name, s in views.items()}
    creates = {name: total(s, "sandbox_backend_calls_total", operation="create") for name, s in views.items()}
    jobs_db = stack.console.query("SELECT count(*) FROM console_adminjob WHERE finished IS NOT NULL")[0][0]
    jobs_metric = {name: total(s, "console_jobs_finished_total") for name, s in views.items()}
    resolves = {name: total(s, "sandbox_resolve_seconds_count") for name, s in views.items()}
    live = total(before_delete, "sandbox_sessions")
    return emit(
        "load",
        sessions=sessions,
        execs_per_session=execs,
        wall_s=round(driven_s, 1),
        resolve_ok=sum(1 for s, _ in record["resolve"] if s == 200),
        resolve_ms={
            "p50": pct([t for _, t in record["resolve"]], 0.5),
            "p95": pct([t for _, t in record["resolve"]], 0.95),
            "max": pct([t for _, t in record["resolve"]], 1.0),
        },
        exec_ok=sum(1 for s, _ in record["exec"] if s == 200),
        exec_failed=[s for s, _ in record["exec"] if s != 200][:10],
        exec_ms={"p50": pct([t for _, t in record["exec"]], 0.5), "p95": pct([t for _, t in record["exec"]], 0.95)},
        delete_statuses=sorted({s for s, _ in record["delete"]}),
        scrapes=len(scrapes),
        scrape_statuses=sorted({s for _, s in scrapes}),
        scrape_ms={"p50": pct([t for t, _ in scrapes], 0.5), "max": pct([t for t, _ in scrapes], 1.0)},
        api_answers_by_upstream=served,
        api_answers_nginx_log=sum(served.values()),
        request_ids_nginx_in_console_logs=f"{len(nginx_ids & daphne_ids)}/{len(nginx_ids)}",
        api_requests_and_upstream_connections=connections,
        api_requests_metric=api_counts,
        creates_metric=creates,
        resolves_metric=resolves,
        sessions_gauge_before_delete=live,
        jobs_finished_db=jobs_db,
        jobs_finished_metric=jobs_metric,
    )


# --- 2. Redis gone and back ------------------------------------------------------------------


def readyz_until(stack: Stack, want: int, timeout: float) -> tuple[float, Any, int]:
    started = time.monotonic()
    polls = 0
    while time.monotonic() - started < timeout:
        polls += 1
        try:
            answer = stack.get("/readyz", timeout=10)
            if answer.status_code == want:
                return time.monotonic() - started, answer.json(), polls
        except requests.RequestException:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"/readyz never answered {want} in {timeout} s")


def redis_fault(stack: Stack) -> dict[str, Any]:
    stack.redis.kill()
    down_s, down_body, _ = readyz_until(stack, 503, 60)
    direct = {name: requests.get(f"http://127.0.0.1:{p}/readyz", timeout=10) for name, p in stack.web_ports.items()}
    stack.redis.start()
    restarted = time.monotonic()
    up_s, _, _ = readyz_until(stack, 200, 120)
    # Each replica ready again (each has its own 5 s answer cache), and an API call works.
    again: dict[str, float] = {}
    while len(again) < len(stack.web_ports) and time.monotonic() - restarted < 120:
        for name, p in stack.web_ports.items():
            if name not in again and requests.get(f"http://127.0.0.1:{p}/readyz", timeout=10).status_code == 200:
                again[name] = round(time.monotonic() - restarted, 2)
        time.sleep(0.25)
    before = stack.console.finished_reaper_passes()
    wait_for(
        lambda: stack.console.finished_reaper_passes() - before, timeout=120, what="a reaper pass after the restart"
    )
    job_after_s = round(time.monotonic() - restarted, 2)
    alive = {name: process.alive() for name, process in stack.console.processes.items()}
    status, _, took = api(stack, "POST", "after-redis", "resolve", {})
    api(stack, "DELETE", "after-redis")
    return emit(
        "redis",
        to_503_s=round(down_s, 2),
        failing=down_body.get("failing"),
        errors={k: v.get("error") for k, v in down_body["checks"].items() if not v.get("ok")},
        replicas_503={name: (a.status_code, a.json().get("failing")) for name, a in direct.items()},
        to_200_after_restart_s=round(up_s, 2),
        replicas_ready_after_s=again,
        worker_job_finished_after_restart_s=job_after_s,
        processes_alive=alive,
        resolve_after=(status, round(took * 1000)),
    )


# --- 3. A terminal through nginx, its replica killed -------------------------------------------


class Browser:
    """A logged-in admin through nginx (CSRF with an https Referer, as a browser sends it)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.http = requests.Session()
        self.http.headers.update({"Host": HOST})
        page = self.http.get(stack.base + "/login/", verify=CA)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.status_code
        answer = self.http.post(
            stack.base + "/login/",
            data={"username": ADMIN_USER, "password": ADMIN_PASSWORD, "csrfmiddlewaretoken": token.group(1)},
            headers={"Referer": f"https://{HOST}/login/"},
            allow_redirects=False,
            verify=CA,
        )
        assert "sessionid" in self.http.cookies, (answer.status_code, answer.text[:300])

    def ticket(self, session_id: str, terminal_id: str | None = None) -> dict[str, Any]:
        data = {"terminal_id": terminal_id} if terminal_id else {}
        answer = self.http.post(
            f"{self.stack.base}/sessions/{session_id}/terminals/",
            data=data,
            headers={
                "Referer": f"https://{HOST}/sessions/{session_id}/",
                "X-CSRFToken": self.http.cookies.get("csrftoken") or "",
            },
            verify=CA,
        )
        assert answer.status_code in (200, 201), (answer.status_code, answer.text[:300])
        return dict(answer.json())

    def cookie(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.http.cookies)


class Websocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.data = b""
        self.controls: list[dict[str, Any]] = []
        self.close_code: int | None = None

    @classmethod
    async def connect(cls, port: int, path: str, cookie: str) -> Websocket:
        context = ssl.create_default_context(cafile=CA)
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=HOST)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: https://{HOST}\r\n"
            f"Cookie: {cookie}\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        mask = os.urandom(4)
        header = bytes([0x82]) + (
            bytes([0x80 | len(data)]) if len(data) < 126 else bytes([0xFE]) + struct.pack("!H", len(data))
        )
        self.writer.write(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
        await self.writer.drain()

    async def read_frame(self) -> None:
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
        payload = await self.reader.readexactly(length)
        if first & 0x0F == 0x2:
            self.data += payload
        elif first & 0x0F == 0x1:
            self.controls.append(json.loads(payload))
        elif first & 0x0F == 0x8:
            self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005

    async def until(self, predicate: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.close_code is not None:
                raise AssertionError(f"closed {self.close_code}: {self.controls}")
            await asyncio.wait_for(self.read_frame(), max(deadline - time.monotonic(), 0.01))

    def ready(self) -> dict[str, Any]:
        return next(m for m in self.controls if m.get("state") == "ready")


def serving_replica(stack: Stack, terminal_id: str) -> str:
    for name in stack.web_ports:
        log = stack.workdir / f"{name}.log"
        if log.exists() and f"/ws/terminals/{terminal_id}/" in log.read_text(errors="replace"):
            return name
    return ""


async def terminal_fault(stack: Stack) -> dict[str, Any]:
    resolved, _, _ = api(stack, "POST", "term-01", "resolve", {})
    assert resolved == 200, resolved
    session_id = stack.console.query("SELECT id FROM sandboxes_session WHERE key = 'term-01'")[0][0]
    browser = Browser(stack)
    grant = browser.ticket(str(session_id))
    terminal_id = grant["terminal_id"]
    started = time.monotonic()
    ws = await Websocket.connect(
        stack.https_port, f"/ws/terminals/{terminal_id}/?ticket={grant['ticket']}", browser.cookie()
    )
    await ws.until(lambda: any(m.get("state") == "ready" for m in ws.controls), 60)
    open_s = time.monotonic() - started
    first_ready = ws.ready()
    await ws.send(b"export FOO=bar; echo marker-$((100+23))\n")
    await ws.until(lambda: b"marker-123" in ws.data)
    await asyncio.sleep(1)
    victim = await asyncio.to_thread(wait_for, lambda: serving_replica(stack, terminal_id), timeout=10, what="replica")
    _, before_kill, _ = scrape(stack.base + "/metrics")
    killed_at = time.monotonic()
    stack.console.processes[victim].kill()  # SIGKILL to the process group
    with_code = None
    try:
        await ws.until(lambda: False, timeout=10)
    except (AssertionError, asyncio.IncompleteReadError, ConnectionError, TimeoutError) as exc:
        with_code = ws.close_code if ws.close_code is not None else type(exc).__name__
    # Reconnect through nginx as the page does: a new ticket for the same terminal.
    attempts, last_error = 0, ""
    while True:
        attempts += 1
        try:
            grant = await asyncio.to_thread(browser.ticket, str(session_id), terminal_id)
            again = await Websocket.connect(
                stack.https_port, f"/ws/terminals/{terminal_id}/?ticket={grant['ticket']}", browser.cookie()
            )
            await again.until(lambda ws=again: any(m.get("state") == "ready" for m in ws.controls), 60)
            break
        except Exception as exc:  # recorded, retried like the page's backoff
            last_error = f"{type(exc).__name__}: {exc}"[:300]
            if time.monotonic() - killed_at > 120:
                raise
            await asyncio.sleep(1)
    reattach_s = time.monotonic() - killed_at
    after = again.ready()
    scrollback = b"marker-123" in again.data
    try:
        await again.until(lambda: b"marker-123" in again.data, 5)
        scrollback_eventually = True
    except (AssertionError, TimeoutError):
        scrollback_eventually = False
    await again.send(b'echo "[$FOO]"\n')
    with contextlib.suppress(AssertionError, TimeoutError):
        await again.until(lambda: b"[bar]" in again.data or b"[]" in again.data, 15)
    _, after_kill, _ = scrape(stack.base + "/metrics")
    sql = f"SELECT closed, close_reason FROM sandboxes_terminal WHERE id = '{uuid.UUID(terminal_id)}'"  # noqa: S608
    rows = stack.console.query(sql)
    result = emit(
        "terminal",
        open_through_nginx_ms=round(open_s * 1000),
        first_ready={k: first_ready.get(k) for k in ("reattached", "kept", "replaced")},
        killed=victim,
        old_connection_end=with_code,
        reconnect_attempts=attempts,
        last_error_before_success=last_error,
        time_to_reattach_s=round(reattach_s, 2),
        ready_after={k: after.get(k) for k in ("reattached", "kept", "replaced", "message")},
        scrollback_in_first_frames=scrollback,
        scrollback_seen=scrollback_eventually,
        foo=("bar" if b"[bar]" in again.data else "" if b"[]" in again.data else None),
        terminal_row=[str(v) for v in rows[0]] if rows else None,
        http_requests_metric_before_after_kill=[
            total(before_kill, "console_http_requests_total"),
            total(after_kill, "console_http_requests_total"),
        ],
        terminals_open_gauge_before_after=[
            total(before_kill, "sandbox_terminals_open"),
            total(after_kill, "sandbox_terminals_open"),
        ],
    )
    again.writer.close()
    api(stack, "DELETE", "term-01")
    return result


_INBOUND_ON = """
from console.models import Space
from console.services import SYSTEM, do_update_network_policy
do_update_network_policy(Space.objects.get(pk={space_id!r}), allow_internet_access=False, allow_out=[], deny_out=[],
                         l7_rules=[], allow_public_traffic=True, actor=SYSTEM)
"""


def inbound(stack: Stack, requests_count: int = 50) -> dict[str, Any]:
    """A sandbox's web server through its own host on nginx's inbound wildcard domain
    (docs/inbound.md's block); the name only in the Host header, never looked up."""
    stack.console.manage("shell", "-c", _INBOUND_ON.format(space_id=stack.console.space_id))
    status, body, _ = api(stack, "POST", "inbound-01", "resolve", {})
    assert status == 200, (status, body)
    sandbox_id = body["sandbox_id"]
    serve = (
        "cd /workspace && echo inbound-hello > hello.txt"
        " && (setsid nohup python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 </dev/null &) && sleep 1"
    )
    status, body, _ = api(stack, "POST", "inbound-01", "exec", {"shell": serve, "timeout_s": 60})
    assert status == 200, body
    assert body["exit_code"] == 0, body
    status, grant, _ = api(stack, "GET", "inbound-01", "inbound?port=8000")
    assert status == 200, grant
    url = grant.get("url", "")
    own_host, path = urllib.parse.urlsplit(url).netloc, urllib.parse.urlsplit(url).path
    headers = {"Host": own_host, "X-Traffic-Token": grant.get("traffic_token", "")}
    timings, statuses = [], []
    for _ in range(requests_count):
        started = time.monotonic()
        answer = requests.get(stack.base + path + "hello.txt", headers=headers, verify=CA, timeout=30)
        timings.append(time.monotonic() - started)
        statuses.append(answer.status_code)
    body_ok = "inbound-hello" in answer.text
    no_token = requests.get(stack.base + path + "hello.txt", headers={"Host": own_host}, verify=CA, timeout=30)
    console_page = requests.get(stack.base + "/login/", headers={"Host": own_host}, verify=CA, timeout=30)
    unknown_host = requests.get(
        stack.base + "/", headers={**headers, "Host": f"{'a' * 34}-8000.{INBOUND_DOMAIN}"}, verify=CA, timeout=30
    )
    on_console_host = requests.get(
        f"{stack.base}/inbound/{sandbox_id}/8000/hello.txt", headers={**headers, "Host": HOST}, verify=CA, timeout=30
    )
    api(stack, "DELETE", "inbound-01")
    return emit(
        "inbound",
        url=url.replace(own_host.split("-", 1)[0], "<label>") if url else grant,
        statuses=sorted(set(statuses)),
        body_ok=body_ok,
        p50_ms=pct(timings, 0.5),
        p95_ms=pct(timings, 0.95),
        without_token=no_token.status_code,
        console_page_on_inbound_host=console_page.status_code,
        unknown_inbound_host=unknown_host.status_code,
        inbound_path_on_console_host=(
            on_console_host.status_code,
            on_console_host.headers.get("Content-Security-Policy"),
        ),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--execs", type=int, default=5)
    parser.add_argument("--only", default="load,redis,terminal,inbound")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs)")
    args = parser.parse_args()
    database_url = os.environ.get("DATABASE_URL", "")
    if not database_url.startswith("postgres"):
        sys.exit("DATABASE_URL must name a PostgreSQL database this run may wipe")
    if not shutil.which("nginx"):
        sys.exit("nginx is missing: apt-get install -y nginx")
    workdir = Path(tempfile.mkdtemp(prefix="ops-acceptance-"))
    workdir.chmod(0o755)  # nginx's workers (user nobody) read the static folder
    reset_database(database_url)
    stack = Stack(workdir, database_url)
    steps = args.only.split(",")
    try:
        started = time.monotonic()
        stack.start()
        emit("started", s=round(time.monotonic() - started, 1), workdir=str(workdir), https_port=stack.https_port,
             replicas=stack.web_ports, redis=stack.redis.port)  # fmt: skip
        redirect = requests.get(
            f"http://127.0.0.1:{stack.http_port}/x", headers={"Host": HOST}, allow_redirects=False, timeout=5
        )
        static = stack.get("/static/css/console.css")
        unauthorized = stack.get("/metrics").status_code
        emit("proxy", http_redirect=(redirect.status_code, redirect.headers.get("Location")),
             static=(static.status_code, static.headers.get("Expires") is not None), metrics_without_token=unauthorized,
             healthz=stack.get("/healthz").status_code, readyz=stack.get("/readyz").json())  # fmt: skip
        if "load" in steps:
            load(stack, args.sessions, args.execs)
        if "redis" in steps:
            redis_fault(stack)
        if "inbound" in steps:
            inbound(stack)
        if "terminal" in steps:
            asyncio.run(terminal_fault(stack))
    finally:
        for name in stack.web_ports:
            log = workdir / f"{name}.log"
            if log.exists():
                errors = [line for line in log.read_text(errors="replace").splitlines() if '"level": "ERROR"' in line]
                emit("log_errors", process=name, count=len(errors), first=errors[:2])
        stack.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
