"""Health, metrics and request ids on real console processes (tests/support/console_process.py).

One installation for the module, scaled out the way production runs it: Daphne processes and
a Celery worker on a Redis server of the test's own (killed and started again here; the shared
one is never touched), SQLite, and the Docker engine reached through a Unix-socket proxy the
test runs (`EngineProxy`) so "the engine went away" is a proxy that stops. Every process shares
one PROMETHEUS_MULTIPROC_DIR, as on one host.

Nothing here reaches past 127.0.0.1 or this machine's own sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import IN_CI
from tests.support.console_process import (
    REPO,
    VENV_BIN,
    Console,
    RedisServer,
    remove_docker_leftovers,
    wait_for,
)
from tests.support.engine_proxy import EngineProxy
from tests.support.tuning import tuning_env

pytestmark = [pytest.mark.docker]

TOKEN = "ops-scrape-token-7f3a"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _need_redis_server() -> None:
    import shutil

    if shutil.which("redis-server"):
        return
    if IN_CI:
        pytest.fail("[CI] required binary missing: redis-server", pytrace=False)
    pytest.skip("needs the redis-server binary (a Redis of the test's own to kill and restart)")


def _stale_counts(folder: Path) -> None:
    """A process of an earlier run, long dead, that counted 1000 API answers into the folder."""
    script = (
        "from console import metrics\n"
        "metrics.HTTP_REQUESTS.labels(area='api', method='GET', status='404').inc(1000)\n"
        "import os; os._exit(0)\n"  # no atexit: as if it had been killed
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder), "DJANGO_SETTINGS_MODULE": "console.settings.test"}
    subprocess.run([str(VENV_BIN / "python"), "-c", script], env=env, cwd=REPO, check=True, timeout=60)
    assert list(folder.glob("counter_*.db"))


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory, docker_base_image: str) -> Iterator[dict[str, Any]]:
    _need_redis_server()
    root = tmp_path_factory.mktemp("ops")
    redis = RedisServer(root)
    redis.start()
    proxy = EngineProxy(str(root / "engine.sock"))
    proxy.start()
    multiproc = root / "metrics"
    multiproc.mkdir()
    _stale_counts(multiproc)
    console = Console(
        workdir=root / "console",
        installation_id=f"ops-{uuid.uuid4().hex[:10]}",
        database_url=f"sqlite:///{root / 'console' / 'console.sqlite3'}",
        redis_url=redis.url,
        extra_env={
            "DOCKER_HOST": proxy.endpoint,
            **tuning_env(
                {
                    "readyz.cache_s": 0.3,
                    "readyz.timeout_s": 2,
                    "sessions.reaper_interval_s": 3600,
                    "sessions.idle_sweep_interval_s": 3600,
                    "logs.format": "json",
                }
            ),
            "PROMETHEUS_MULTIPROC_DIR": str(multiproc),
            "METRICS_TOKEN": TOKEN,
        },
    )
    try:
        console.set_up()
        console.start_web("web")
        yield {"console": console, "redis": redis, "proxy": proxy, "multiproc": multiproc}
    finally:
        console.stop_all()
        redis.stop()
        proxy.kill()
        remove_docker_leftovers(console.installation_id)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    """Status, body and headers (names lower-cased) of a GET."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310 - 127.0.0.1 only
    try:
        with _DIRECT.open(request, timeout=30) as answer:
            return answer.status, answer.read(), {k.lower(): v for k, v in answer.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), {k.lower(): v for k, v in exc.headers.items()}


def readyz(console: Console, web: str = "web") -> tuple[int, dict[str, Any]]:
    # With the metrics token: the details (without it, /readyz says only ok or failing).
    status, body, _ = get(f"http://127.0.0.1:{console.web_ports[web]}/readyz", {"Authorization": f"Bearer {TOKEN}"})
    return status, json.loads(body)


def readyz_until(console: Console, status: int, what: str, timeout: float = 30) -> dict[str, Any]:
    """The body of the first /readyz answer with `status`."""

    def check() -> dict[str, Any] | None:
        got, body = readyz(console)
        return body if got == status else None

    return wait_for(check, timeout=timeout, what=what, every=0.1)


def scrape(console: Console, web: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, body, _ = get(f"http://127.0.0.1:{console.web_ports[web]}/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200, body[:500]
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


def test_readiness_names_redis_parts_then_the_engine_when_each_goes_away_and_comes_back(
    scaled: dict[str, Any],
) -> None:
    console, redis, proxy = scaled["console"], scaled["redis"], scaled["proxy"]
    status, body = readyz(console)
    assert status == 200, body
    backend = next(name for name in body["checks"] if name.startswith("backend:docker:"))
    assert set(body["checks"]) == {"database", "session_store", "channel_layer", "job_broker", backend}

    redis.kill()
    body = readyz_until(console, 503, "/readyz says Redis is gone")
    assert set(body["failing"]) == {"session_store", "channel_layer", "job_broker"}, body
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"][backend]["ok"] is True

    redis.start()  # the same port, empty
    readyz_until(console, 200, "/readyz ready again after Redis came back", timeout=60)

    proxy.kill()
    body = readyz_until(console, 503, "/readyz says the engine is gone")
    assert body["failing"] == [backend], body
    assert body["checks"][backend]["error"]

    proxy.start()
    body = readyz_until(console, 200, "/readyz ready with the engine back", timeout=60)
    assert body["failing"] == []


def _log_lines(path: Path, request_id: str) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if request_id not in line or not line.startswith("{"):
            continue
        record = json.loads(line)
        if record.get("request_id") == request_id:
            found.append(record)
    return found


def test_metrics_of_two_daphne_processes_and_a_worker_add_up(scaled: dict[str, Any]) -> None:
    console = scaled["console"]
    console.start_web("web2")
    worker = console.start_worker("worker")
    base = {name: f"http://127.0.0.1:{port}" for name, port in console.web_ports.items()}
    headers = {"Authorization": f"Bearer {console.token}"}
    for web, times in (("web", 3), ("web2", 5)):
        for n in range(times):
            status, _, answer_headers = get(
                f"{base[web]}/api/v1/spaces/{console.space_id}/sessions/none-{n}",
                {**headers, "X-Request-ID": f"ops-api-{web}-{n}"},
            )
            assert status == 404
            assert answer_headers["x-request-id"] == f"ops-api-{web}-{n}"

    # A job started from a page of web2 runs in the worker, under the page's request id.
    ui = console.ui("web2")
    csrf = ui._csrf("/jobs/")
    request = urllib.request.Request(  # noqa: S310 - 127.0.0.1 only
        f"{base['web2']}/jobs/diagnostics/",
        data=f"csrfmiddlewaretoken={csrf}".encode(),
        headers={"Referer": f"{base['web2']}/jobs/", "X-Request-ID": "ops-job-rid-1"},
        method="POST",
    )
    with ui.opener.open(request, timeout=60) as answer:
        assert answer.status == 200
    wait_for(
        lambda: (
            console.query("SELECT status FROM console_adminjob WHERE kind = 'console.diagnostics'") == [("succeeded",)]
        ),
        timeout=90,
        what=f"the diagnostics job in the worker ({worker.tail(20)})",
    )

    for web in ("web", "web2"):
        samples = scrape(console, web)
        # 3 + 5 answers from two processes; the 1000 of a dead earlier run were cleaned away.
        assert value(samples, "console_http_requests_total", area="api", status="404") == 8, web
        assert value(samples, "console_jobs_finished_total", kind="console.diagnostics", status="succeeded") == 1
        assert value(samples, "sandbox_sessions") == 0
        assert value(samples, "sandbox_terminals_open") == 0

    # The request id of the page is on the worker's lines for the job it ran.
    in_worker = _log_lines(worker.log_path, "ops-job-rid-1")
    assert {r["message"].rsplit(" ", 1)[-1] for r in in_worker if r["logger"] == "console.jobs"} >= {
        "started",
        "succeeded",
    }, worker.tail(40)
    in_web2 = _log_lines(console.processes["web2"].log_path, "ops-job-rid-1")
    assert any(r["message"].endswith("queued") for r in in_web2)
    api_line = _log_lines(console.processes["web"].log_path, "ops-api-web-2")
    assert [r["status"] for r in api_line if r["logger"] == "console.requests"] == [404]

    # A process that dies keeps what it counted: totals never drop.
    console.processes["web2"].kill()
    samples = scrape(console, "web")
    assert value(samples, "console_http_requests_total", area="api", status="404") == 8
