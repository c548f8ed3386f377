"""Session runtime benchmark on the real Docker engine and Redis.

Measures, in one run (this machine is noisy, so every figure has its baseline beside it):
- warm resolve, on each session store (the database store — PostgreSQL here — and Redis): a
  bound, running session's resolve against a direct backend `get` of the same sandbox; the
  difference is what the runtime adds (binding and lease reads, the session row);
- resume after idle: resolve of a paused session, and of a stopped one;
- concurrency: 20 new sessions resolved at once, against 20 sequential direct creates.

Usage: python bench/session_resolve.py [N]   (REDIS_URL and DATABASE_URL default to the local
Redis and PostgreSQL; a test database is created and dropped)
The last line is one JSON object with warm_resolve_added_ms ({"database": ms, "redis": ms},
also flat as warm_resolve_added_ms_database / _redis), resume_paused_ms, resume_stopped_ms and
concurrent_vs_sequential_ratio (the last three on Redis).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings.test")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")
# Threads resolving at once need a real database server (SQLite locks whole tables).
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment, teardown_test_environment  # noqa: E402

from console.services import Actor  # noqa: E402


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


def timed(func: Callable[[], object]) -> float:
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    run_id = uuid.uuid4().hex[:8]
    settings.CONSOLE_INSTALLATION_ID = f"bench-{run_id}"
    setup_test_environment()
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        figures = run(n, run_id)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        teardown_test_environment()
    print(json.dumps(figures))


def run(n: int, run_id: str) -> dict[str, object]:
    from console.models import NetworkPolicy, Space
    from sandboxes.backends.base import META_INSTALLATION, ListQuery, NetworkSpec, SandboxSpec
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig, Session
    from sandboxes.sessions.runtime import Runtime
    from sandboxes.sessions.store import RedisSessionStore
    from sandboxes.sessions.store_db import DatabaseSessionStore

    space = Space.objects.create(name=f"bench {run_id}", slug=f"bench-{run_id}")
    NetworkPolicy.objects.create(space=space)
    local = PlatformBackend.objects.create(name=f"bench {run_id}", kind="docker")
    local.spaces.add(space)
    config = SandboxConfig.objects.create(
        space=space,
        name="bench",
        backend=local,
        default_template=DEFAULT_BASE_IMAGE,
        is_default=True,
        memory_mb=256,
        pids_limit=128,
        persistent_workspace=False,
    )
    stop_config = SandboxConfig.objects.create(
        space=space,
        name="bench-stop",
        backend=local,
        default_template=DEFAULT_BASE_IMAGE,
        memory_mb=256,
        pids_limit=128,
        idle_mode="stop",
        persistent_workspace=False,
    )
    runtime = Runtime(RedisSessionStore(os.environ["REDIS_URL"]))
    backend = get_backend(config)
    try:
        # Warm resolve against a direct get, interleaved so both see the same noise; on each store.
        warm_figures: dict[str, dict[str, float]] = {}
        for store_name, store_runtime in (("database", Runtime(DatabaseSessionStore())), ("redis", runtime)):
            key = f"warm-{store_name}"
            warm = store_runtime.resolve(space, key)
            for _ in range(20):
                store_runtime.resolve(space, key)
                backend.get(warm.sandbox.sandbox_id)
            sandbox_id = warm.sandbox.sandbox_id
            direct, resolved = [], []
            for _ in range(max(200, n * 40)):
                direct.append(timed(functools.partial(backend.get, sandbox_id)))
                resolved.append(timed(functools.partial(store_runtime.resolve, space, key)))
            warm_added = median_ms(resolved) - median_ms(direct)
            warm_figures[store_name] = {
                "added": round(warm_added, 3),
                "median": median_ms(resolved),
                "direct": median_ms(direct),
            }
            print(
                f"warm resolve ({store_name:8}) median {median_ms(resolved):8.3f} ms"
                f"   direct get {median_ms(direct):8.3f} ms   added {warm_added:7.3f} ms"
            )

        # Resume after idle: paused (memory kept) and stopped (memory freed).
        paused_samples, stopped_samples = [], []
        paused = runtime.resolve(space, "resume-paused")
        stopped = runtime.resolve(space, "resume-stopped", config=stop_config)
        for _ in range(n):
            runtime.pause(paused.session, actor=_system())
            paused_samples.append(timed(lambda: runtime.resolve(space, "resume-paused")))
            runtime.pause(stopped.session, actor=_system())
            stopped_samples.append(timed(lambda: runtime.resolve(space, "resume-stopped")))
        print(f"resume paused  median {median_ms(paused_samples):8.3f} ms")
        print(f"resume stopped median {median_ms(stopped_samples):8.3f} ms")

        # 20 new sessions at once against 20 sequential direct creates.
        spec = SandboxSpec(
            template_id=DEFAULT_BASE_IMAGE,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, "bench": "sequential"},
        )
        started = time.perf_counter()
        sequential_ids = [backend.create(spec).sandbox_id for _ in range(20)]
        sequential_s = time.perf_counter() - started
        for sandbox_id in sequential_ids:
            backend.delete(sandbox_id)

        def resolve_one(i: int) -> str:
            try:
                return runtime.resolve(space, f"burst-{i}").sandbox.sandbox_id
            finally:
                connection.close()

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=20) as pool:
            burst_ids = list(pool.map(resolve_one, range(20)))
        concurrent_s = time.perf_counter() - started
        assert len(set(burst_ids)) == 20
        ratio = round(concurrent_s / sequential_s, 3)
        print(
            f"20 concurrent resolves {concurrent_s:6.2f} s   20 sequential creates {sequential_s:6.2f} s"
            f"   ratio {ratio}"
        )
        return {
            "warm_resolve_added_ms": {name: figures["added"] for name, figures in warm_figures.items()},
            "warm_resolve_added_ms_database": warm_figures["database"]["added"],
            "warm_resolve_added_ms_redis": warm_figures["redis"]["added"],
            "warm_resolve_median_ms": {name: figures["median"] for name, figures in warm_figures.items()},
            "direct_get_median_ms": {name: figures["direct"] for name, figures in warm_figures.items()},
            "resume_paused_ms": median_ms(paused_samples),
            "resume_stopped_ms": median_ms(stopped_samples),
            "concurrent_vs_sequential_ratio": ratio,
            "concurrent_s": round(concurrent_s, 3),
            "sequential_s": round(sequential_s, 3),
            "n": n,
            "stores": ["database", "redis"],
        }
    finally:
        for info in list(
            backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}))
        ):
            backend.delete(info.sandbox_id)
        for session in Session.objects.filter(space=space).exclude(key="warm-database"):
            runtime.store.end_turn(runtime.keys(session)[2])
            binding = runtime.store.get_binding(runtime.keys(session)[0])
            if binding is not None:
                runtime.store.delete_binding_if(runtime.keys(session)[0], binding)


def _system() -> Actor:
    from console.services import SYSTEM

    return SYSTEM


if __name__ == "__main__":
    main()
