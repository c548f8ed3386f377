"""Warm pool benchmark on the real Docker engine, Redis and PostgreSQL, through the agent API.

Measures, in one run (every figure with its baseline beside it):
- pool_ready_p50_ms / p95: a new session's POST …/resolve answered with a running sandbox,
  taken from a full pool (sequential calls, the pool refilling behind them);
- cold_ready_p50_ms: the same call on a config without a pool (a create), and
  pool_speedup = cold p50 / pool p50;
- burst_20_p95_ms: 20 new sessions resolved at once from a pool of 20;
- refill_s: time for the emptied pool of 20 to be ready again (one refill pass);
- mb_per_ready_running / mb_per_ready_paused: memory of a ready sandbox (the engine's cgroup
  reading, page cache left out) waiting running and waiting paused; `kept` names the cheaper
  (paused only when it saves over 1 MiB and 10%: running spares the resume at claim).

Usage: python bench/warm_pool.py [N]   (REDIS_URL and DATABASE_URL default to the local Redis
and PostgreSQL; a test database is created and dropped; everything made is deleted)
The last line is one JSON object.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings
from django.db import connection
from django.test import Client

POOL = 20


def pct(samples: list[float], fraction: float) -> float:
    """Nearest-rank percentile, in ms (the Pools page's own, sandboxes/pools/stats.py)."""
    from sandboxes.pools.stats import percentile

    value = percentile(samples, fraction)
    assert value is not None
    return round(value * 1000, 1)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    with support.bench_database() as run_id:
        figures = run(n, run_id)
    print(json.dumps(figures))


def run(n: int, run_id: str) -> dict[str, object]:
    from console.models import NetworkPolicy, Space, SpaceLimits
    from console.services import SYSTEM
    from sandboxes.api.tokens import do_create_api_token
    from sandboxes.backends.base import META_INSTALLATION, ListQuery
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.models import PlatformBackend, SandboxConfig, Session
    from sandboxes.pools.keeper import refill

    local = PlatformBackend.objects.create(name=f"bench {run_id}", kind="docker", max_pool_size=POOL)
    common = {"backend": local, "default_template": DEFAULT_BASE_IMAGE, "memory_mb": 256, "pids_limit": 128}
    tokens: dict[str, str] = {}
    spaces: dict[str, Space] = {}
    configs: dict[str, SandboxConfig] = {}
    # Two spaces alike but for the pool: the baseline's sessions are created, the others claimed.
    for name, size in (("pooled", POOL), ("cold", 0)):
        space = spaces[name] = Space.objects.create(name=f"bench {name} {run_id}", slug=f"bench-{name}-{run_id}")
        NetworkPolicy.objects.create(space=space)
        SpaceLimits.objects.create(space=space, live_sessions=1000, api_requests_per_minute=100000)
        local.spaces.add(space)
        configs[name] = SandboxConfig.objects.create(
            space=space, name=name, is_default=True, pool_size=size, persistent_workspace=True, **common
        )
        tokens[name] = do_create_api_token(space, name="bench", actor=SYSTEM)[1]
    pooled, cold = configs["pooled"], configs["cold"]
    backend = get_backend(pooled)

    def resolve(key: str, config: SandboxConfig | None = None) -> tuple[float, dict[str, Any]]:
        name = "cold" if config is cold else "pooled"
        client = Client(HTTP_AUTHORIZATION=f"Bearer {tokens[name]}")
        started = time.perf_counter()
        answer = client.post(
            f"/api/v1/spaces/{spaces[name].pk}/sessions/{key}/resolve", data={}, content_type="application/json"
        )
        elapsed = time.perf_counter() - started
        assert answer.status_code == 200, answer.content[:300]
        return elapsed, answer.json()

    def fill() -> float:
        started = time.perf_counter()
        while True:
            report = refill(pooled)
            assert not report.errors, report.errors
            if not report.made and ready_count() >= POOL:
                return time.perf_counter() - started
            if report.skipped:  # a background refill holds the pool: wait for it
                time.sleep(0.05)

    def ready_count() -> int:
        from sandboxes.models import MemberState, PoolMember

        return PoolMember.objects.filter(config=pooled, state=MemberState.READY).count()

    try:
        from django.test import override_settings

        from console.tuning import merged

        with override_settings(TUNING=merged(settings.TUNING, {"pools.refill_on_change": False})):
            fill()
            # Warm the code paths once each (imports, connections), not counted.
            resolve(f"warm-{run_id}")
            resolve(f"warm-cold-{run_id}", cold)
            fill()
            pool_samples, cold_samples, actions = [], [], set()
            for i in range(n):
                # Interleaved so both see the same noise; the pool stays full (refilled
                # between calls, outside the timing).
                elapsed, answer = resolve(f"pool-{i}")
                pool_samples.append(elapsed)
                actions.add(answer["action"])
                assert answer["state"] == "running", answer
                elapsed, answer = resolve(f"cold-{i}", cold)
                cold_samples.append(elapsed)
                assert answer["action"] == "created", answer
                fill()
            assert actions == {"pooled"}, actions
            print(f"pool ready p50 {pct(pool_samples, 0.5)} ms p95 {pct(pool_samples, 0.95)} ms")
            print(f"cold ready p50 {pct(cold_samples, 0.5)} ms")

            # 20 at once from a full pool of 20.
            fill()
            barrier = threading.Barrier(POOL)

            def burst_one(i: int) -> tuple[float, str]:
                try:
                    barrier.wait()
                    elapsed, answer = resolve(f"burst-{i}")
                    return elapsed, answer["action"]
                finally:
                    connection.close()

            with ThreadPoolExecutor(max_workers=POOL) as workers:
                burst = list(workers.map(burst_one, range(POOL)))
            burst_actions = [action for _, action in burst]
            print(f"burst of {POOL}: p95 {pct([e for e, _ in burst], 0.95)} ms, actions {set(burst_actions)}")

            # The emptied pool of 20, made again.
            refill_s = fill()
            print(f"refill of {POOL}: {refill_s:.2f} s")

            running_mb = ready_memory(pooled)
            with override_settings(TUNING=merged(settings.TUNING, {"pools.keep_paused": True})):
                pooled.pool_size = 0
                refill(pooled)
                pooled.pool_size = 5
                refill(pooled)
                paused_mb = ready_memory(pooled)
            print(f"MB per ready sandbox: running {running_mb}, paused {paused_mb}")
        # Paused is kept only when it saves something worth a resume at every claim.
        kept = "paused" if paused_mb < running_mb - max(1.0, running_mb * 0.1) else "running"
        pool_p50 = pct(pool_samples, 0.5)
        cold_p50 = pct(cold_samples, 0.5)
        return {
            "pool_ready_p50_ms": pool_p50,
            "pool_ready_p95_ms": pct(pool_samples, 0.95),
            "cold_ready_p50_ms": cold_p50,
            "pool_speedup": round(cold_p50 / pool_p50, 2),
            "burst_20_p95_ms": pct([e for e, _ in burst], 0.95),
            "burst_20_pooled": burst_actions.count("pooled"),
            "refill_s": round(refill_s, 2),
            "mb_per_ready_running": running_mb,
            "mb_per_ready_paused": paused_mb,
            "kept": kept,
            "mb_per_ready_sandbox": paused_mb if kept == "paused" else running_mb,
            "n": n,
            "pool": POOL,
        }
    finally:
        for info in list(
            backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}))
        ):
            backend.delete(info.sandbox_id)
        volumes = backend.volumes()
        if volumes is not None:
            for volume in volumes.list({META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}):
                volumes.delete(volume.name)
            for session in Session.objects.filter(space__in=spaces.values()):
                volumes.delete(session.workspace_volume)


def ready_memory(config: Any) -> float:
    """Mean memory (MiB) of the pool's ready sandboxes, from the engine's cgroup reading."""
    import docker

    from sandboxes.models import MemberState, PoolMember

    time.sleep(2)  # let start-up settle
    api = docker.APIClient(timeout=60)
    readings = []
    for sandbox_id in PoolMember.objects.filter(config=config, state=MemberState.READY).values_list(
        "sandbox_id", flat=True
    ):
        memory = api.stats(sandbox_id, stream=False)["memory_stats"]
        stats = memory.get("stats", {})
        cache = stats.get("inactive_file", stats.get("total_inactive_file", 0))
        readings.append((memory["usage"] - cache) / 2**20)
    api.close()
    return round(statistics.mean(readings), 1) if readings else 0.0


if __name__ == "__main__":
    main()
