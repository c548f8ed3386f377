"""Health, readiness, metrics, request ids and logs, in this process (console/health.py,
console/metrics.py, console/ops_views.py, console/logs.py).

The parts that need several processes or a service to break are in
tests/console/test_ops_processes.py.
Readiness runs its checks in threads of its own, so those tests commit their rows
(transactional database) for the threads to see them.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from console import health, metrics
from console.logs import ReadableFormatter, RequestIdFilter
from console.models import AdminJob, JobStatus
from sandboxes.models import Session, SessionState, Terminal
from tests.factories import make_backend, make_config, make_space, make_user
from tests.support.log_capture import Captured
from tests.support.tuning import Tuned

SCRAPER_TOKEN = "readyz-scraper-token-0123456789"


@pytest.fixture(autouse=True)
def _fresh_readiness(settings: Any) -> Iterator[None]:
    settings.METRICS_TOKEN = SCRAPER_TOKEN
    health.forget_readiness()
    yield
    health.forget_readiness()


def readyz_details(**extra: Any) -> Any:
    """/readyz as an allowed scraper asks it: with the metrics token, so with the details."""
    return Client().get("/readyz", HTTP_AUTHORIZATION=f"Bearer {SCRAPER_TOKEN}", **extra)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Silent:
    """A TCP server on loopback that accepts and never answers (a backend that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def counter(name: str, **labels: str) -> float:
    return metrics.total(metrics.current_values(name)[name], **labels)


# --- /healthz and /readyz ---------------------------------------------------------------------


@pytest.mark.django_db
def test_healthz_answers_without_a_login_or_an_allowed_host() -> None:
    answer = Client().get("/healthz", HTTP_HOST="10.1.2.3:8000")  # a pod address, not in ALLOWED_HOSTS
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    assert Client().post("/healthz").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_readyz_lists_every_part_with_its_latency() -> None:
    space = make_space("Tenant Zebra Corp", slug="zebra")
    engine = make_backend(space, name="Zebra's private engine")
    answer = readyz_details(HTTP_HOST="10.1.2.3")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    name = f"backend:docker:{str(engine.id)[:8]}"
    assert set(body["checks"]) == {"database", "session_store", "channel_layer", "job_broker", name}
    assert body["status"] == "ok"
    assert body["failing"] == []
    assert all(check["ok"] and check["latency_ms"] >= 0 for check in body["checks"].values())
    assert b"Zebra" not in answer.content


@pytest.mark.django_db(transaction=True)
def test_readyz_is_503_naming_the_backend_that_does_not_answer_and_tells_nothing_else(
    tuned: Tuned, settings: Any
) -> None:
    space = make_space("Tenant Walrus Ltd", slug="walrus")
    port = closed_port()
    endpoint = f"http://127.0.0.1:{port}"
    dead = make_backend(
        space,
        name="Walrus E2B account",
        kind="e2b",
        endpoint=endpoint,
        domain=f"127.0.0.1:{port}",
        allow_private_endpoints=True,
        api_key="e2b_walrus_secret_key_123",
    )
    answer = readyz_details()
    assert answer.status_code == 503
    body = answer.json()
    name = f"backend:e2b:{str(dead.id)[:8]}"
    assert body["status"] == "failing"
    assert body["failing"] == [name]
    assert body["checks"][name]["ok"] is False
    assert body["checks"][name]["error"]
    assert body["checks"]["database"]["ok"] is True
    for secret in (b"Walrus", b"walrus", b"e2b_walrus_secret_key_123", str(port).encode(), b"127.0.0.1"):
        assert secret not in answer.content

    # Only reported: the console stays ready, the backend's state is still shown.
    tuned({"readyz.backends": "reported"})
    health.forget_readiness()
    reported = readyz_details()
    assert reported.status_code == 200
    assert reported.json()["checks"][name] == {**reported.json()["checks"][name], "ok": False, "required": False}


@pytest.mark.django_db(transaction=True)
def test_readyz_checks_run_in_parallel_within_the_timeout(tuned: Tuned, settings: Any) -> None:
    silent = Silent()
    try:
        space = make_space()
        hung = [
            make_backend(
                space,
                kind="e2b",
                endpoint=f"http://127.0.0.1:{silent.port}",
                domain=f"127.0.0.1:{silent.port}",
                allow_private_endpoints=True,
                api_key="k",
            )
            for _ in range(3)
        ]
        tuned({"readyz.timeout_s": 1.0})
        started = time.monotonic()
        answer = readyz_details()
        elapsed = time.monotonic() - started
        assert answer.status_code == 503
        body = answer.json()
        assert sorted(body["failing"]) == sorted(f"backend:e2b:{str(b.id)[:8]}" for b in hung)
        assert {body["checks"][name]["error"] for name in body["failing"]} == {"timeout"}
        # Three checks hanging one after another would take 3 s; in parallel, one timeout.
        assert elapsed < 2.5, elapsed
    finally:
        silent.close()


@pytest.mark.django_db(transaction=True)
def test_readyz_answers_from_its_cache_so_it_cannot_hammer_the_backends(tuned: Tuned, settings: Any) -> None:
    space = make_space()
    make_backend(space)
    make_backend(space)
    tuned({"readyz.cache_s": 60})
    before = counter("sandbox_backend_calls_total", operation="health")
    answers = [Client().get("/readyz").status_code for _ in range(5)]
    assert answers == [200] * 5
    assert counter("sandbox_backend_calls_total", operation="health") - before == 2  # one run, two backends
    health.forget_readiness()
    assert Client().get("/readyz").status_code == 200
    assert counter("sandbox_backend_calls_total", operation="health") - before == 4


# --- /metrics ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_metrics_are_refused_unless_a_scraper_is_allowed(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = []
    settings.METRICS_ALLOW_LOOPBACK = False
    assert Client().get("/metrics").status_code == 403

    settings.METRICS_ALLOW_LOOPBACK = True  # development: loopback, and no proxy in between
    assert Client().get("/metrics").status_code == 200
    assert Client().get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403
    assert Client().get("/metrics", REMOTE_ADDR="192.0.2.10").status_code == 403

    settings.METRICS_ALLOW_LOOPBACK = False
    settings.METRICS_TOKEN = "scrape-token-0123456789"
    refused = Client().get("/metrics")
    assert refused.status_code == 401
    assert refused["WWW-Authenticate"].startswith("Bearer")
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-0123456789", HTTP_HOST="10.0.0.7:9000")
    assert ok.status_code == 200
    assert ok["Content-Type"].startswith("text/plain; version=0.0.4")

    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_NETWORKS = ["192.0.2.0/24"]
    assert Client().get("/metrics", REMOTE_ADDR="192.0.2.10").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="198.51.100.1").status_code == 403
    # Behind one trusted proxy, the address it saw counts, not the proxy's own.
    settings.FORWARDED_FOR_PROXIES = 1
    assert Client().get("/metrics", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 403
    assert Client().get("/metrics", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR="192.0.2.55").status_code == 200


@pytest.mark.django_db
def test_metrics_show_what_the_database_holds_and_what_this_process_counted(settings: Any) -> None:
    settings.METRICS_TOKEN = "t0k3n-for-the-scraper"
    space = make_space()
    config = make_config(space, name="c1")
    for key, state in [("a", SessionState.RUNNING), ("b", SessionState.RUNNING), ("c", SessionState.PAUSED)]:
        Session.objects.create(space=space, config=config, key=key, state=state)
    user = make_user()
    session = Session.objects.get(key="a")
    Terminal.objects.create(session=session, user=user, opened="2026-01-01T00:00:00Z")
    Terminal.objects.create(session=session, user=user, opened="2026-01-01T00:00:00Z", closed="2026-01-01T01:00:00Z")
    AdminJob.objects.create(kind="console.diagnostics", status=JobStatus.QUEUED)

    api_401 = counter("console_http_requests_total", area="api", status="401")
    refusals = counter("sandbox_egress_refusals_total", layer="dns")
    assert Client().get(f"/api/v1/spaces/{space.id}/sessions/a").status_code == 401
    metrics.record_egress_refusal("dns", 3)

    text = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t0k3n-for-the-scraper").content.decode()
    backend = config.backend.name
    assert f'sandbox_sessions{{backend="{backend}",backend_kind="docker",state="running"}} 2.0' in text
    assert f'sandbox_sessions{{backend="{backend}",backend_kind="docker",state="paused"}} 1.0' in text
    assert "sandbox_terminals_open 1.0" in text
    assert 'console_jobs{kind="console.diagnostics",status="queued"} 1.0' in text
    values = metrics.current_values("console_http_requests_total", "sandbox_egress_refusals_total")
    assert metrics.total(values["console_http_requests_total"], area="api", status="401") == api_401 + 1
    assert metrics.total(values["sandbox_egress_refusals_total"], layer="dns") == refusals + 3
    assert metrics.labels_of(metrics.current_values("sandbox_sessions")["sandbox_sessions"], "state") == {
        "running": 2.0,
        "paused": 1.0,
    }


# --- Request ids and the log set-up -------------------------------------------------------------


@pytest.mark.django_db
def test_a_sane_request_id_is_kept_and_echoed_others_are_replaced() -> None:
    kept = Client().get("/login/", HTTP_X_REQUEST_ID="agent-turn.42:a")
    assert kept["X-Request-ID"] == "agent-turn.42:a"
    for bad in ["x" * 65, "two words", "new\nline", "<script>", ""]:
        answer = Client().get("/login/", HTTP_X_REQUEST_ID=bad)
        assert answer["X-Request-ID"] != bad
        assert len(answer["X-Request-ID"]) == 32
    first, second = Client().get("/login/"), Client().get("/login/")
    assert first["X-Request-ID"] != second["X-Request-ID"]


@pytest.mark.django_db
def test_json_lines_carry_the_request_id_and_the_decided_fields(captured: Captured) -> None:
    space = make_space()
    Client().get(f"/api/v1/spaces/{space.id}/sessions/k", HTTP_X_REQUEST_ID="req-json-1")
    lines = [json.loads(line) for line in captured.lines if "req-json-1" in line]
    api_line = next(line for line in lines if line["logger"] == "console.requests")
    assert api_line["request_id"] == "req-json-1"
    assert api_line["status"] == 401
    assert api_line["route"] == "api:session"
    assert {"time", "level", "message", "duration_ms"} <= set(api_line)


def test_the_readable_format_is_one_line_with_the_id_and_fields() -> None:
    record = logging.LogRecord("sandboxes.x", logging.INFO, __file__, 1, "resolve of session %s", ("k1",), None)
    record.sandbox_id = "abc123"
    RequestIdFilter().filter(record)
    line = ReadableFormatter().format(record)
    assert "INFO" in line
    assert "sandboxes.x [-] resolve of session k1" in line
    assert "sandbox_id=abc123" in line


@pytest.mark.django_db(transaction=True)
def test_a_job_started_by_a_page_logs_under_the_request_id_of_that_page(captured: Captured) -> None:
    root = make_user("root-obs", superuser=True)
    client = Client()
    client.force_login(root)
    answer = client.post("/jobs/diagnostics/", HTTP_X_REQUEST_ID="req-job-7")
    assert answer.status_code in (200, 302), answer.content
    job = AdminJob.objects.get(kind="console.diagnostics")
    deadline = time.monotonic() + 30
    while AdminJob.objects.get(pk=job.pk).status not in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.1)
    job_lines = [r for r in captured.records if r.name == "console.jobs" and getattr(r, "job_id", "") == str(job.id)]
    assert {r.getMessage().rsplit(" ", 1)[-1] for r in job_lines} >= {"queued", "started", "succeeded"}
    assert {r.request_id for r in job_lines} == {"req-job-7"}  # type: ignore[attr-defined]
    # The thread that ran it is not the request's, yet it carries the request's id.
    assert {r.threadName for r in job_lines if r.getMessage().endswith("started")} != {threading.current_thread().name}


@pytest.mark.django_db
def test_a_non_ascii_bearer_on_metrics_is_refused_not_a_500(settings: Any) -> None:
    settings.METRICS_TOKEN = "scrape-token-0123456789"
    settings.METRICS_ALLOWED_NETWORKS = []
    settings.METRICS_ALLOW_LOOPBACK = False
    client = Client(raise_request_exception=False)
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer sécret")
    assert response.status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token-0123456789").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_backend_that_hangs_does_not_take_the_other_checks_down_with_it(tuned: Tuned) -> None:
    """Each readiness run leaves the hung check's thread behind; once the pool is full of
    them, the database check itself never runs and /readyz reports it failing."""
    import threading

    from console import health

    release = threading.Event()

    def hangs() -> None:
        release.wait(60)

    tuned({"readyz.timeout_s": 0.2, "readyz.cache_s": 0})
    health.register_checks("a-hung-backend", lambda: [("backend:hung", hangs, True)])
    try:
        for _ in range(health._pool._max_workers + 2):
            health.forget_readiness()
            results = {r.name: r for r in health.readiness()}
        assert "database" in results, results  # else: the console's own source never got a thread
        assert results["database"].ok, results["database"]
    finally:
        release.set()
        health._sources.pop("a-hung-backend", None)
        health.forget_readiness()
