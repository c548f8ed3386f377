"""Liveness and readiness: `/healthz` (this process answers) and `/readyz` (what it needs
answers: the database, the session store, the channel layer, the job broker and every
platform backend).

Checks are registered by the app that knows the part (`register_checks`): this module has
the console's own; sandboxes adds the session store and the backends (sandboxes/apps.py). All
of one readiness run go in parallel, each with readyz.timeout_s; one answer serves every
caller for readyz.cache_s (and callers arriving meanwhile wait for the run under way), so the
endpoint cannot be used to hammer the backends.

Without credentials /readyz answers only `{"status": "ok"}` (200) or `{"status": "failing"}`
(503): anyone who can reach the console may ask. A scraper allowed on /metrics (METRICS_TOKEN
as a bearer token, or METRICS_ALLOWED_NETWORKS; console/ops_views.py) also gets the details:
the parts by role ("database", "backend:docker:1f2e3d4c"), which are failing, and each failure
by its kind ("timeout", "unavailable", "OperationalError") — never a message, an endpoint, a
space or a backend's name even then.

A check failing with the kind "invalid" is a configuration that waiting cannot mend (a
backend whose unix:// endpoint is not a socket): that part is reported failing but does not
make the console unready, so one bad backend marks only itself unavailable.

`OpsEndpointsMiddleware` answers /healthz, /readyz and /metrics before any other middleware:
probes and scrapers reach the console by an address that is not in ALLOWED_HOSTS and over
plain HTTP behind TLS redirects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from .tuning import READYZ

logger = logging.getLogger(__name__)

Check = Callable[[], None]  # raises when the part does not answer
CheckSource = Callable[[], list[tuple[str, Check, bool]]]  # (name, check, required)


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    latency_ms: float
    required: bool = True
    error: str = ""

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.ok, "latency_ms": round(self.latency_ms, 1)}
        if not self.required:
            body["required"] = False
        if self.error:
            body["error"] = self.error
        return body


# A registry each app fills when ready (not a cache: nothing to measure).
_sources: dict[str, CheckSource] = {}


def register_checks(name: str, source: CheckSource) -> None:
    """Add a source of checks, called at every readiness run (so a list of backends is
    read afresh). A source that fails counts as one failed check named `name`."""
    _sources[name] = source


def error_name(exc: BaseException) -> str:
    """What a failure is called in the answer: a RemoteError's kind, else the class name."""
    kind = getattr(exc, "kind", None)
    return str(kind) if kind else exc.__class__.__name__


# --- The console's own checks ---------------------------------------------------------------


def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_channel_layer() -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer")

    async def round_trip() -> None:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "readyz.ping"})
        message = await asyncio.wait_for(layer.receive(channel), READYZ.timeout_s)
        if message.get("type") != "readyz.ping":
            raise RuntimeError("the channel layer returned another message")

    async_to_sync(round_trip)()


def check_job_broker() -> None:
    if settings.JOB_RUNNER != "celery":
        return  # jobs run in this process
    from .celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=max(1, int(READYZ.timeout_s)))
        conn.default_channel  # noqa: B018 - opening a channel is what proves the broker answers


def _console_checks() -> list[tuple[str, Check, bool]]:
    return [
        ("database", check_database, True),
        ("channel_layer", check_channel_layer, True),
        ("job_broker", check_job_broker, True),
    ]


register_checks("console", _console_checks)


# --- One readiness run ----------------------------------------------------------------------

# Roomy: a check that hangs past its timeout keeps its thread until the call gives up.
_pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="readyz")
_cache_lock = threading.Lock()
# readyz.cache_s; measured (bench/module_caches.py): a cached answer 15 us, a run of the checks 49 ms.
_cached: tuple[float, list[CheckResult]] | None = None
_in_flight: dict[str, Future[CheckResult]] = {}  # each check's last run (runs are one at a time)
_sources_in_flight: dict[str, Future[list[tuple[str, Check, bool]]]] = {}


def _closing(func: Callable[[], Any]) -> Any:
    """Run in a pool thread, which keeps no database connection between runs."""
    try:
        return func()
    finally:
        connection.close()


# Failures that are a part's own configuration: reported, never the console's readiness.
CONFIGURATION_ERRORS = {"invalid"}


def _timed(name: str, check: Check, required: bool) -> CheckResult:
    started = time.perf_counter()
    try:
        _closing(check)
    except Exception as exc:
        elapsed = (time.perf_counter() - started) * 1000
        error = error_name(exc)
        logger.warning("readiness: %s failed", name, extra={"check": name, "error": error})
        return CheckResult(name, False, elapsed, required and error not in CONFIGURATION_ERRORS, error)
    return CheckResult(name, True, (time.perf_counter() - started) * 1000, required)


def run_checks() -> list[CheckResult]:
    """Every registered check, in parallel, each bounded by readyz.timeout_s."""
    timeout = READYZ.timeout_s
    deadline = time.monotonic() + timeout
    listed: dict[str, Future[list[tuple[str, Check, bool]]]] = {}
    checks: list[tuple[str, Check, bool]] = []
    results: list[CheckResult] = []
    for name, source in _sources.items():
        previous = _sources_in_flight.get(name)
        if previous is not None and not previous.done():
            results.append(CheckResult(name, False, timeout * 1000, True, "timeout"))
            continue
        listed[name] = _sources_in_flight[name] = _pool.submit(_closing, source)
    for name, future in listed.items():
        try:
            checks.extend(future.result(timeout=max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            results.append(CheckResult(name, False, timeout * 1000, True, "timeout"))
        except Exception as exc:
            results.append(CheckResult(name, False, 0.0, True, error_name(exc)))
    # Each check gets the whole timeout from here: listing the backends is not their time.
    deadline = time.monotonic() + timeout
    running: list[tuple[str, bool, Future[CheckResult]]] = []
    for name, check, required in checks:
        last_run = _in_flight.get(name)
        if last_run is not None and not last_run.done():
            # Still hung from an earlier run: not run again, so hung checks never fill the pool
            # and starve the others (which would then all report a timeout).
            results.append(CheckResult(name, False, timeout * 1000, required, "timeout"))
            continue
        _in_flight[name] = run = _pool.submit(_timed, name, check, required)
        running.append((name, required, run))
    for name, required, done in running:
        try:
            results.append(done.result(timeout=max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            logger.warning("readiness: %s timed out", name, extra={"check": name, "error": "timeout"})
            results.append(CheckResult(name, False, timeout * 1000, required, "timeout"))
    return results


def readiness() -> list[CheckResult]:
    """The last run's results while fresh, else a new run (one at a time)."""
    global _cached
    with _cache_lock:
        if _cached is not None and time.monotonic() - _cached[0] < READYZ.cache_s:
            return _cached[1]
        results = run_checks()
        _cached = (time.monotonic(), results)
        return results


def forget_readiness() -> None:
    """Drop the cached answer (tests)."""
    global _cached
    with _cache_lock:
        _cached = None


def readiness_response(request: HttpRequest) -> JsonResponse:
    """ok/failing for anyone; the parts and their failures for an allowed scraper."""
    from .ops_views import metrics_allowed

    results = readiness()
    failing = [r.name for r in results if not r.ok and r.required]
    body: dict[str, Any] = {"status": "failing" if failing else "ok"}
    if metrics_allowed(request):
        body["failing"] = failing
        body["checks"] = {r.name: r.as_json() for r in sorted(results, key=lambda r: r.name)}
    response = JsonResponse(body, status=503 if failing else 200)
    response["Cache-Control"] = "no-store"
    # An unready console is an answer, not an error of Django's: no "Service Unavailable"
    # line at ERROR for every probe (the failing checks were logged once per run).
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def liveness_response() -> JsonResponse:
    response = JsonResponse({"status": "ok"})
    response["Cache-Control"] = "no-store"
    return response


# --- The middleware -------------------------------------------------------------------------

HEALTH_PATHS = {"/healthz", "/healthz/"}
READY_PATHS = {"/readyz", "/readyz/"}
METRICS_PATHS = {"/metrics", "/metrics/"}


def ops_response(request: HttpRequest) -> HttpResponse | None:
    path = request.path_info
    if path in HEALTH_PATHS:
        return liveness_response()
    if path in READY_PATHS:
        return readiness_response(request)
    if path in METRICS_PATHS:
        from .ops_views import metrics_response

        return metrics_response(request)
    return None


class OpsEndpointsMiddleware:
    """Answers /healthz, /readyz and /metrics first (GET/HEAD only); passes everything else on.

    Async-capable, so under Daphne a readiness run waits in a thread of its own rather than
    in the thread every synchronous view shares."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        if request.path_info in HEALTH_PATHS | READY_PATHS | METRICS_PATHS:
            return self._answer(request)
        return self.get_response(request)

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info in HEALTH_PATHS | READY_PATHS | METRICS_PATHS:
            if request.path_info in HEALTH_PATHS:
                return self._answer(request)
            response: HttpResponse = await sync_to_async(self._answer_closing, thread_sensitive=False)(request)
            return response
        answer: HttpResponse = await self.get_response(request)
        return answer

    @classmethod
    def _answer_closing(cls, request: HttpRequest) -> HttpResponse:
        """In a thread outside Django's request cycle: nothing closes its connection but us."""
        try:
            return cls._answer(request)
        finally:
            connection.close()

    @staticmethod
    def _answer(request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return HttpResponse(
                json.dumps({"error": "method not allowed"}),
                status=405,
                content_type="application/json",
                headers={"Allow": "GET, HEAD"},
            )
        response = ops_response(request)
        assert response is not None
        return response
