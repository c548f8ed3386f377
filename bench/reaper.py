"""Reaper benchmark on the real Docker engine: is one pass linear in the number of sandboxes?

Builds N console sandboxes as Docker containers that are created, never started (listing
needs no process), each with its session row in the database and its binding in the session
store this process's settings choose, so a pass deletes nothing; then times one reaper pass
(`sandboxes.sessions.reaper.reap_all`, the periodic job's own entry point) at N=100 and again at
N=1000. A pass that deletes anything is a failed run (the figures would be meaningless).

Figures: `per_sandbox_ms` at each N (median pass / N), `growth_ratio` = pass(1000) / pass(100)
(linear is 10, the goal is at most 12), and `list_ms` (the backend's listing alone, so the
store's share can be read off). The two sizes sit on two configs and are timed in turns
(small, large, small per round; the median of the rounds' ratios), so both see the same load
on this shared machine; `load_avg_1m` says how busy it was.

Usage: python bench/reaper.py [SMALL LARGE]   (REDIS_URL and DATABASE_URL default to the local
Redis and PostgreSQL; a test database is created and dropped). Every container carries the
label `console.bench-run=<run id>` and is removed at the end, on failure too.
The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from console.models import Space
    from sandboxes.models import SandboxConfig
    from sandboxes.sessions.store import SessionStore

BENCH_LABEL = "console.bench-run"
ROUNDS = 7


def main() -> None:
    small, large = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (100, 1000)
    with support.bench_database() as run_id:
        try:
            figures = run(small, large, run_id)
        finally:
            remove_containers(run_id)
    print(json.dumps(figures))


def run(small: int, large: int, run_id: str) -> dict[str, object]:
    from console.models import NetworkPolicy, Space
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig
    from sandboxes.sessions.store_select import get_store

    space = Space.objects.create(name=f"bench {run_id}", slug=f"bench-{run_id}")
    NetworkPolicy.objects.create(space=space)
    engine = PlatformBackend.objects.create(name=f"bench engine {run_id}", kind="docker")
    engine.spaces.add(space)
    configs = {
        n: SandboxConfig.objects.create(
            space=space, name=f"bench-{n}", backend=engine, default_template=DEFAULT_BASE_IMAGE, is_default=n == small
        )
        for n in (small, large)
    }
    store = get_store()
    print(f"store: {store.name}; engine: {get_backend(configs[small]).health().version}")
    try:
        for n, config in configs.items():
            started = time.perf_counter()
            add_sessions(space, config, store, range(n), run_id)
            print(f"N={n}: {n} sandboxes ready ({time.perf_counter() - started:.1f} s to make)")
        return measure(configs, store)
    finally:
        unbind_all(store)


def measure(configs: dict[int, SandboxConfig], store: SessionStore) -> dict[str, object]:
    """Passes of both sizes taken in turns, so both see the same load on this shared machine.

    Each round times small, large, small; its ratio is the large pass over the mean of the
    two small ones around it. The growth is the median of those ratios: a burst of other work
    on the machine spoils one round, not the figure.
    """
    from sandboxes.backends.base import META_CONFIG, META_INSTALLATION, ListQuery
    from sandboxes.catalog.bridge import get_backend

    small, large = sorted(configs)
    passes: dict[int, list[float]] = {small: [], large: []}
    listings: dict[int, list[float]] = {small: [], large: []}
    ratios: list[float] = []

    def listing(n: int) -> float:
        backend = get_backend(configs[n])
        query = ListQuery(
            metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_CONFIG: str(configs[n].id)}
        )
        return timed(lambda: len(list(backend.iter_sandboxes(query))))

    for round_ in range(ROUNDS + 1):
        lists = {n: listing(n) for n in (small, large)}
        before, big, after = (timed_pass(configs[n], store) for n in (small, large, small))
        if round_:  # the first round warms connections and caches up
            for n in (small, large):
                listings[n].append(lists[n])
            passes[small] += [before, after]
            passes[large].append(big)
            ratios.append(big / ((before + after) / 2))
    figures: dict[str, object] = {"store": store.name}
    for n in (small, large):
        median_ms = statistics.median(passes[n]) * 1000
        figures[f"pass_ms_{n}"] = round(median_ms, 2)
        figures[f"pass_best_ms_{n}"] = round(min(passes[n]) * 1000, 2)
        figures[f"list_ms_{n}"] = round(statistics.median(listings[n]) * 1000, 2)
        print(
            f"N={n}: pass {median_ms:9.2f} ms (best {figures[f'pass_best_ms_{n}']})"
            f"  per sandbox {median_ms / n:7.4f} ms  (listing alone {figures[f'list_ms_{n}']} ms)"
        )
    figures["reap_all_ms"] = round(timed_all() * 1000, 2)
    print(f"reap_all over both configs ({small + large} sandboxes): {figures['reap_all_ms']} ms")
    figures["per_sandbox_ms"] = {str(n): round(float(str(figures[f"pass_ms_{n}"])) / n, 4) for n in (small, large)}
    figures["growth_ratio"] = round(statistics.median(ratios), 2)
    figures["growth_ratios"] = [round(ratio, 2) for ratio in ratios]
    figures["linear_ratio"] = round(large / small, 2)
    figures["goal_growth_ratio_max"] = round(large / small * 1.2, 2)
    figures["rounds"] = ROUNDS
    figures["load_avg_1m"] = round(os.getloadavg()[0], 2)  # the machine is shared: read figures with it
    figures["n"] = [small, large]
    print(f"growth ratio {figures['growth_ratio']} (linear = {large / small:g}, goal <= {large / small * 1.2:g})")
    return figures


def timed(func: Callable[[], object]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def timed_pass(config: SandboxConfig, store: SessionStore) -> float:
    from sandboxes.sessions.reaper import reap_config

    started = time.perf_counter()
    report = reap_config(config, store, grace=timedelta(0))  # no age spares a sandbox: ownership alone must
    elapsed = time.perf_counter() - started
    if report.deleted or report.errors:
        raise SystemExit(f"a reaper pass deleted {len(report.deleted)} bound sandboxes ({report.errors}): void")
    return elapsed


def timed_all() -> float:
    from sandboxes.sessions.reaper import reap_all

    started = time.perf_counter()
    reports = reap_all(grace=timedelta(0))
    elapsed = time.perf_counter() - started
    if any(report.deleted or report.errors for report in reports):
        raise SystemExit(f"reap_all deleted bound sandboxes or failed: {[r.as_json() for r in reports]}")
    return elapsed


def add_sessions(space: Space, config: SandboxConfig, store: SessionStore, numbers: range, run_id: str) -> None:
    """Sessions numbered `numbers`: a row, a created (not started) container, a binding."""
    from sandboxes.backends.base import META_BINDING_VERSION
    from sandboxes.backends.docker.common import KIND_SANDBOX, LABEL_TEMPLATE, metadata_labels
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE, LABEL_KIND, LABEL_MANAGED
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import Session, SessionState
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.sessions.store import Binding, now_iso

    api = get_backend(config).api  # type: ignore[attr-defined]  # the Docker adapter's engine client
    sessions = Session.objects.bulk_create(
        [
            Session(space=space, config=config, key=f"bench-{config.name}-{i}", state=SessionState.RUNNING)
            for i in numbers
        ]
    )

    def make_container(session: Session) -> str:
        labels = {
            **metadata_labels({**Runtime.session_metadata(session), META_BINDING_VERSION: "1"}),
            LABEL_MANAGED: "1",
            LABEL_KIND: KIND_SANDBOX,
            LABEL_TEMPLATE: DEFAULT_BASE_IMAGE,
            BENCH_LABEL: run_id,
        }
        host_config = api.create_host_config(network_mode="none", dns=["127.0.0.1"])
        return str(api.create_container(DEFAULT_BASE_IMAGE, labels=labels, host_config=host_config)["Id"])

    with ThreadPoolExecutor(max_workers=4) as pool:
        ids = list(pool.map(make_container, sessions))
    for session, sandbox_id in zip(sessions, ids, strict=True):
        binding = Binding(sandbox_id=sandbox_id, version=1, config_id=str(session.config_id), created=now_iso())
        if not store.set_binding_if_absent(Runtime.keys(session)[0], binding):
            raise SystemExit(f"session {session.key} was already bound")
        session.sandbox_id = sandbox_id
    Session.objects.bulk_update(sessions, ["sandbox_id"])


def unbind_all(store: SessionStore) -> None:
    from sandboxes.models import Session
    from sandboxes.sessions.runtime import Runtime

    for session in Session.objects.all():
        key = Runtime.keys(session)[0]
        binding = store.get_binding(key)
        if binding is not None:
            store.delete_binding_if(key, binding)


def remove_containers(run_id: str) -> None:
    import docker

    client = docker.from_env(timeout=120)
    try:
        rows = client.api.containers(all=True, filters={"label": f"{BENCH_LABEL}={run_id}"})
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda row: client.api.remove_container(row["Id"], force=True), rows))
        print(f"removed {len(rows)} bench containers")
    finally:
        client.close()


if __name__ == "__main__":
    main()
