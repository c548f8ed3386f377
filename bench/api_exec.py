"""A warm exec through the agent API versus docker-py's `exec_run`, in one run.

The console runs as a real process (Daphne, as `make start` runs it) on a database of this
run's own (created on the PostgreSQL server of DATABASE_URL, dropped at the end) and Redis.
Measured, interleaved so the machine's noise hits both sides alike:
- concurrency 1: 100 execs of `true` on one warm session (`POST …/exec`) against 100
  `exec_run("true")` on a running container of the same image; p50 of each;
- concurrency 40: 40 clients, each on its own warm session, against 40 threads each on its own
  container; execs per second of each.
The ratio is docker-py's time over the API's (p50), and the API's throughput over docker-py's:
1.0 means the console adds nothing. Goal: at least 0.8 at both.

Usage: python bench/api_exec.py [N] [CLIENTS]   (defaults 100 and 40; needs the Docker engine with
sandbox-console/base:latest, PostgreSQL and Redis: DATABASE_URL's server, REDIS_URL)
The last line is one JSON object: ratio_c1, ratio_c40, the p50s and throughputs beside them.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402
import psycopg  # noqa: E402

from tests.support.console_process import (  # noqa: E402
    BASE_IMAGE,
    INSTALLATION_LABEL,
    Console,
    remove_docker_leftovers,
)

SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
ROUNDS_C40 = 3  # alternating phases of each side
SECONDS_PER_PHASE = 6.0

_LIMITS = """
from console.models import SpaceLimits
SpaceLimits.objects.update_or_create(space_id={space!r}, defaults={{
    "live_sessions": 1000, "concurrent_execs": 1000, "api_requests_per_minute": 1000000}})
"""


def server_database(name: str) -> str:
    parts = urllib.parse.urlsplit(SERVER_URL)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def admin(sql: str) -> None:
    url = server_database("postgres").replace("postgres://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as db:
        db.execute(sql.encode())


class Agent:
    """One agent's keep-alive HTTP connection to the console (as an SDK's session keeps one)."""

    def __init__(self, console: Console) -> None:
        port = console.web_ports["web"]
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.prefix = f"/api/v1/spaces/{console.space_id}/sessions/"
        self.headers = {"Authorization": f"Bearer {console.token}", "Content-Type": "application/json"}

    def post(self, key: str, tail: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            self.connection.request("POST", f"{self.prefix}{key}/{tail}", json.dumps(body), self.headers)
            answer = self.connection.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the idle keep-alive connection (Daphne's timeout): a new one.
            self.connection.close()
            self.connection.request("POST", f"{self.prefix}{key}/{tail}", json.dumps(body), self.headers)
            answer = self.connection.getresponse()
        content = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"POST {tail}: {answer.status} {content[:300]!r}")
        return dict(json.loads(content))

    def exec_true(self, key: str) -> None:
        result = self.post(key, "exec", {"argv": ["true"]})
        if result["exit_code"] != 0:
            raise RuntimeError(f"exec answered {result}")

    def close(self) -> None:
        self.connection.close()


def timed_ms(func: Callable[[], object]) -> float:
    started = time.perf_counter()
    func()
    return (time.perf_counter() - started) * 1000


def throughput(workers: Sequence[Callable[[], object]], seconds: float) -> float:
    """Calls per second of `workers` (one thread each) run together for `seconds`."""
    done = [0] * len(workers)
    errors: list[BaseException] = []
    start = threading.Barrier(len(workers) + 1)
    stop_at: list[float] = []

    def loop(index: int, work: Callable[[], object]) -> None:
        start.wait()
        try:
            while time.perf_counter() < stop_at[0]:
                work()
                done[index] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(i, w), daemon=True) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    stop_at.append(began + seconds)
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    if errors:
        raise RuntimeError(f"{len(errors)} worker(s) failed: {errors[0]!r}")
    return sum(done) / elapsed


def main(argv: list[str]) -> int:
    n = int(argv[1]) if len(argv) > 1 else 100
    clients = int(argv[2]) if len(argv) > 2 else 40
    run_id = uuid.uuid4().hex[:10]
    database = f"bench_api_exec_{run_id}"
    installation = f"bench-exec-{run_id}"
    admin(f'CREATE DATABASE "{database}"')
    workdir = Path(tempfile.mkdtemp(prefix="bench-api-exec-"))
    console = Console(workdir, installation, server_database(database), redis_url=REDIS_URL)
    engine = docker.from_env(timeout=120, max_pool_size=clients + 4)
    containers: list[Any] = []
    try:
        console.set_up()
        console.manage("shell", "-c", _LIMITS.format(space=console.space_id))
        console.start_web()
        figures = measure(console, engine, containers, run_id, n, clients)
    finally:
        for container in containers:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        console.stop_all()
        remove_docker_leftovers(installation)
        engine.close()
        admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    print(json.dumps(figures))
    return 0


def measure(console: Console, engine: Any, containers: list[Any], run_id: str, n: int, clients: int) -> dict[str, Any]:
    keys = [f"warm-{i}" for i in range(clients)]
    agents = [Agent(console) for _ in keys]
    for agent, key in zip(agents, keys, strict=True):
        agent.post(key, "resolve", {})
    labels = {INSTALLATION_LABEL: console.installation_id, "console.bench-run": run_id}
    for _ in keys:
        containers.append(
            engine.containers.run(BASE_IMAGE, detach=True, network_mode="none", labels=labels, mem_limit="256m")
        )

    def raw_exec(container: Any) -> None:
        exit_code, _ = container.exec_run(["true"], user="1000:1000")
        if exit_code != 0:
            raise RuntimeError(f"exec_run answered {exit_code}")

    # Warm both sides (first calls open connections and fill the caches).
    for _ in range(10):
        agents[0].exec_true(keys[0])
        raw_exec(containers[0])

    api_ms, raw_ms = [], []
    for _ in range(n):
        api_ms.append(timed_ms(lambda: agents[0].exec_true(keys[0])))
        raw_ms.append(timed_ms(lambda: raw_exec(containers[0])))
    api_p50, raw_p50 = statistics.median(api_ms), statistics.median(raw_ms)
    print(f"c=1   API p50 {api_p50:7.1f} ms   docker-py p50 {raw_p50:7.1f} ms   ratio {raw_p50 / api_p50:.2f}")

    api_workers = [lambda a=a, k=k: a.exec_true(k) for a, k in zip(agents, keys, strict=True)]
    raw_workers = [lambda c=c: raw_exec(c) for c in containers]
    api_rates, raw_rates = [], []
    for _ in range(ROUNDS_C40):
        raw_rates.append(throughput(raw_workers, SECONDS_PER_PHASE))
        api_rates.append(throughput(api_workers, SECONDS_PER_PHASE))
    api_rate, raw_rate = statistics.median(api_rates), statistics.median(raw_rates)
    ratio = api_rate / raw_rate
    print(f"c={clients}  API {api_rate:7.1f} execs/s   docker-py {raw_rate:7.1f} execs/s   ratio {ratio:.2f}")
    for agent in agents:
        agent.close()
    return {
        "ratio_c1": round(raw_p50 / api_p50, 3),
        f"ratio_c{clients}": round(api_rate / raw_rate, 3),
        "api_p50_ms_c1": round(api_p50, 2),
        "docker_p50_ms_c1": round(raw_p50, 2),
        f"api_execs_per_s_c{clients}": round(api_rate, 1),
        f"docker_execs_per_s_c{clients}": round(raw_rate, 1),
        "n": n,
        "clients": clients,
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv))
