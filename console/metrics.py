"""The console's metrics: every series in one place, summed over processes.

Other modules import the series below and count; nothing else defines one. With
PROMETHEUS_MULTIPROC_DIR set (several Daphne processes and Celery workers on one host),
prometheus-client keeps each process's values in files of that folder and a scrape of any
process adds them up. The folder is prepared once per process (`prepare_multiprocess_dir`):
the first process of a fresh start empties it, and the live gauges of processes that died are
dropped at each scrape. Without it, values are this process's own (the embedded console).

Series that describe what the database holds (sessions by state, open terminals, queued jobs)
are read at scrape time by collectors registered with `register_scrape_collector`, so they are
right whichever process answers and are counted once. `current_values` reads the same series
for the dashboard's charts. The scrape endpoint and who may call it: console/ops_views.py.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_PID_IN_NAME = re.compile(r"_(\d+)\.db$")
_MARKER = "process_{pid}.alive"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _pids_in(folder: Path) -> set[int]:
    pids = {int(m[1]) for f in folder.glob("*.db") if (m := _PID_IN_NAME.search(f.name))}
    pids |= {int(f.name.split("_")[1].split(".")[0]) for f in folder.glob("process_*.alive")}
    return pids


def prepare_multiprocess_dir(folder: Path) -> None:
    """Make the folder and, when no process that wrote to it is alive any more (a fresh start),
    empty it; then mark this process alive. Under a file lock, so processes starting together
    agree on who empties it (and nobody empties it under a process already counting)."""
    folder.mkdir(parents=True, exist_ok=True)
    me = os.getpid()
    with (folder / ".prepare.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        others = {pid for pid in _pids_in(folder) if pid != me}
        if not any(_pid_alive(pid) for pid in others):
            for stale in [*folder.glob("*.db"), *folder.glob("process_*.alive")]:
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
        (folder / _MARKER.format(pid=me)).touch()


_multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")  # MULTIPROC_ENV
if _multiproc_dir:
    # Before prometheus_client is imported: it picks its value store from the environment.
    prepare_multiprocess_dir(Path(_multiproc_dir))

from prometheus_client import (  # noqa: E402
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric  # noqa: E402

MULTIPROCESS = bool(_multiproc_dir)

# --- The series -------------------------------------------------------------------------

RESOLVE_SECONDS = Histogram(
    "sandbox_resolve_seconds",
    "Time to resolve a session to a live sandbox, by path (fast: a bound sandbox answered; "
    "slow: the lifecycle lock was taken) and outcome (bound, claimed, pooled, created, rebuilt, error).",
    ["path", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
BACKEND_CALLS = Counter(
    "sandbox_backend_calls",
    "Calls into a sandbox backend (the contract's operations), by backend kind and operation.",
    ["backend_kind", "operation"],
)
BACKEND_ERRORS = Counter(
    "sandbox_backend_errors",
    "Backend calls that failed, by backend kind, operation and error kind (RemoteError.kind).",
    ["backend_kind", "operation", "error"],
)
BACKEND_SECONDS = Histogram(
    "sandbox_backend_call_seconds",
    "Duration of backend calls, by backend kind and operation.",
    ["backend_kind", "operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
REAPER_CLAIMS = Counter("sandbox_reaper_claims", "Sandboxes the reaper bound back to their session.", ["backend_kind"])
REAPER_DELETIONS = Counter(
    "sandbox_reaper_deletions", "Sandboxes the reaper deleted (no session owns them).", ["backend_kind"]
)
POOL_CLAIMS = Counter(
    "sandbox_pool_claims", "First resolves on a config with a warm pool, by outcome (hit, miss).", ["outcome"]
)
POOL_CLAIM_SECONDS = Histogram(
    "sandbox_pool_claim_seconds",
    "Time to hand a session a ready sandbox from a warm pool (a hit), resumed and adopted.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.5, 1, 2.5),
)
POOL_RESOLVE_SECONDS = Histogram(
    "sandbox_pool_resolve_seconds",
    "What an agent waited for a new session's resolve on a config with a warm pool (from the API"
    " request's start to its answer), by outcome (hit: ready from the pool; miss: created).",
    ["outcome"],
    buckets=(0.01, 0.025, 0.05, 0.075, 0.09, 0.1, 0.15, 0.2, 0.5, 1, 2.5, 5),
)
JOBS_FINISHED = Counter("console_jobs_finished", "Admin jobs that finished, by kind and status.", ["kind", "status"])
EGRESS_REFUSALS = Counter(
    "sandbox_egress_refusals",
    "Outbound attempts from sandboxes that the network policy refused, by enforcing layer.",
    ["layer"],
)
HTTP_REQUESTS = Counter(
    "console_http_requests",
    "HTTP requests answered, by area (api, pages), method and status code.",
    ["area", "method", "status"],
)
HTTP_SECONDS = Histogram(
    "console_http_request_seconds",
    "Time to answer HTTP requests, by area (api, pages).",
    ["area"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)


def record_egress_refusal(layer: str, count: int = 1) -> None:
    """Count refused outbound attempts; `layer` is EgressRefusal.layer (dns, packet, http, tls)."""
    if count > 0:
        EGRESS_REFUSALS.labels(layer=layer or "unknown").inc(count)


# --- Scrape-time collectors ---------------------------------------------------------------

GaugeRows = Callable[[], Iterable[tuple[dict[str, str], float]]]


class DatabaseGauge:
    """A gauge whose samples a function reads when scraped (from the database, usually)."""

    def __init__(self, name: str, documentation: str, labels: list[str], rows: GaugeRows) -> None:
        self.name, self.documentation, self.labels, self.rows = name, documentation, labels, rows

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        try:
            for labels, value in self.rows():
                family.add_metric([labels.get(label, "") for label in self.labels], value)
        except Exception:
            # One unreadable source (the database down) must not cost the process's own series.
            logger.warning("metrics: reading %s failed", self.name, exc_info=True)
            return
        yield family


# A registry each app fills when ready (not a cache: nothing to measure).
_scrape_collectors: dict[str, DatabaseGauge] = {}


def register_scrape_collector(gauge: DatabaseGauge) -> None:
    """Read `gauge` at every scrape (apps register theirs when ready; again = replaced)."""
    _scrape_collectors[gauge.name] = gauge


class _ThisProcess:
    """The default registry's series, for a process that is not in multiprocess mode."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def scrape_registry() -> CollectorRegistry:
    """A registry holding every process's series plus the scrape-time gauges."""
    registry = CollectorRegistry(auto_describe=False)
    if MULTIPROCESS:
        _drop_dead_processes(Path(_multiproc_dir))
        _FilesCollector(registry)
    else:
        registry.register(_ThisProcess())
    for gauge in _scrape_collectors.values():
        registry.register(gauge)
    return registry


class _FilesCollector(multiprocess.MultiProcessCollector):
    """The processes' files summed, but a scrape never fails over a file being made or removed.

    prometheus-client creates a process's file and sizes it afterwards, so a scrape can meet it
    empty; read, it raises and takes every series down with it (a 500; for good when a process
    was killed in that moment, its empty file never filled: prometheus/client_python#1199).
    An empty file has nothing recorded yet: it is left out. A file removed between listing and
    reading (a dead process's live gauges, dropped by a concurrent scrape) is listed again."""

    def collect(self) -> Iterable[Metric]:
        for attempt in range(3):
            files = []
            for name in Path(self._path).glob("*.db"):
                with contextlib.suppress(FileNotFoundError):
                    if name.stat().st_size > 0:
                        files.append(str(name))
            try:
                return self.merge(files, accumulate=True)
            except FileNotFoundError:
                if attempt == 2:
                    raise
        return []


def render() -> bytes:
    """The Prometheus text format of everything."""
    return generate_latest(scrape_registry())


def _drop_dead_processes(folder: Path) -> None:
    """Live gauges of dead processes go (their counters stay: the totals must not drop)."""
    for pid in _pids_in(folder):
        if pid != os.getpid() and not _pid_alive(pid):
            multiprocess.mark_process_dead(pid, str(folder))
            with contextlib.suppress(FileNotFoundError):
                (folder / _MARKER.format(pid=pid)).unlink()


@atexit.register
def _on_exit() -> None:
    if MULTIPROCESS:
        mark_this_process_dead()


def mark_this_process_dead() -> None:
    """For a process that ends (atexit; Celery's worker_process_shutdown)."""
    with contextlib.suppress(Exception):
        multiprocess.mark_process_dead(os.getpid(), _multiproc_dir)
        (Path(_multiproc_dir) / _MARKER.format(pid=os.getpid())).unlink(missing_ok=True)


# --- Reading for the dashboard ------------------------------------------------------------


def current_values(*names: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Current samples of the named series (as scraped: every process added up), e.g.
    `current_values("sandbox_sessions", "console_http_requests_total")`. A histogram's samples
    are named `<name>_bucket`, `_sum`, `_count`; ask for those names."""
    wanted = set(names)
    found: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name in names}
    for family in scrape_registry().collect():
        for sample in family.samples:
            if sample.name in wanted:
                found[sample.name].append((dict(sample.labels), float(sample.value)))
    return found


def total(samples: list[tuple[dict[str, str], float]], **match: str) -> float:
    """The sum of the samples whose labels match `match`."""
    return sum(value for labels, value in samples if all(labels.get(k) == v for k, v in match.items()))


def labels_of(samples: list[tuple[dict[str, str], float]], label: str) -> dict[str, float]:
    """Samples summed by one label's value (e.g. sessions by state)."""
    summed: dict[str, float] = {}
    for labels, value in samples:
        summed[labels.get(label, "")] = summed.get(labels.get(label, ""), 0.0) + value
    return summed
