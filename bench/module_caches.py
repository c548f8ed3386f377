"""What each module-level cache saves, against its uncached path, in one run.

Every cache in console/, sandboxes/ and skills/ keeps its place only with a figure from here
in a comment beside it. Each line times the cached call and the uncached one interleaved (this
machine is noisy, so both see the same load) and prints their medians and the ratio.

Usage: python bench/module_caches.py [N]   (REDIS_URL and DATABASE_URL default to the local
Redis and PostgreSQL; a test database is created and dropped; the Docker engine must run)
The last line is one JSON object: {name: {"cached_us", "uncached_us", "ratio"}}.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable

import support  # first: Django set up on the test settings (bench/support.py)
from django.conf import settings


def _us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def compare(name: str, cached: Callable[[], object], uncached: Callable[[], object], n: int) -> dict[str, float]:
    cached()
    uncached()
    hits, misses = [], []
    for _ in range(n):
        started = time.perf_counter()
        cached()
        hits.append(time.perf_counter() - started)
        started = time.perf_counter()
        uncached()
        misses.append(time.perf_counter() - started)
    figure = {"cached_us": _us(hits), "uncached_us": _us(misses)}
    figure["ratio"] = round(figure["uncached_us"] / max(figure["cached_us"], 0.1), 1)
    print(
        f"{name:28} cached {figure['cached_us']:10.1f} us   uncached {figure['uncached_us']:10.1f} us"
        f"   x{figure['ratio']}"
    )
    return figure


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with support.bench_database():
        figures = run(n)
    print(json.dumps(figures))


def run(n: int) -> dict[str, dict[str, float]]:
    import redis

    from console import health
    from console.models import NetworkPolicy, Space
    from sandboxes.backends.base import RemoteError
    from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
    from sandboxes.catalog import bridge
    from sandboxes.catalog.bridge import get_backend
    from sandboxes.inbound import links as inbound
    from sandboxes.inbound import proxy
    from sandboxes.models import PlatformBackend, SandboxConfig, Session
    from sandboxes.sessions import limits
    from skills.install.packages import console_pip_wheel

    space = Space.objects.create(name="bench caches", slug="bench-caches")
    NetworkPolicy.objects.create(space=space)
    local = PlatformBackend.objects.create(name="bench caches", kind="docker")
    local.spaces.add(space)
    config = SandboxConfig.objects.create(
        space=space, name="bench", backend=local, default_template=DEFAULT_BASE_IMAGE, is_default=True
    )
    session = Session.objects.create(space=space, key="bench", config=config, sandbox_id="bench-missing")
    figures: dict[str, dict[str, float]] = {}

    figures["limits._limits_cache"] = compare(
        "limits._limits_cache",
        lambda: limits.limits_of(space, max_age_s=limits.LIMITS_CACHE_S),
        lambda: limits.limits_of(space),
        n,
    )

    url = settings.REDIS_URL
    kept = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)

    def count_on(client: redis.Redis) -> None:
        pipe = client.pipeline()
        pipe.incr("bench:caches:count")
        pipe.expire("bench:caches:count", 60)
        pipe.execute()

    def count_on_new_client() -> None:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            count_on(client)
        finally:
            client.close()

    figures["redis clients"] = compare("redis client per URL", lambda: count_on(kept), count_on_new_client, n)
    kept.delete("bench:caches:count")

    key = ("path", "bench-missing", 8080)
    proxy._keep(proxy._cache, key, None)
    figures["proxy._cache"] = compare(
        "proxy._cache (target)",
        lambda: proxy._peek(proxy._cache, key),
        lambda: inbound.inbound_target("bench-missing", 8080),
        n,
    )

    def upstream_uncached() -> None:
        # What inbound_upstream does on a miss: the session row, then the engine.
        Session.objects.select_related("config__backend").filter(pk=session.pk).first()
        with contextlib.suppress(RemoteError):
            get_backend(config).get("bench-missing-sandbox")

    figures["proxy._upstreams"] = compare(
        "proxy._upstreams (address)",
        lambda: proxy._peek(proxy._cache, key),
        upstream_uncached,
        n,
    )

    def backend_uncached() -> None:
        backend = bridge._build(config)
        try:
            backend.get("bench-missing-sandbox")
        except RemoteError:
            pass
        finally:
            backend.close()

    def backend_cached() -> None:
        with contextlib.suppress(RemoteError):
            get_backend(config).get("bench-missing-sandbox")

    figures["bridge._backends"] = compare("bridge._backends (get)", backend_cached, backend_uncached, max(20, n // 10))

    target = inbound.InboundTarget(
        session_id=session.pk,
        space_id=space.pk,
        space_name=space.name,
        sandbox_id="bench-missing",
        port=8080,
        token="t",  # noqa: S106 - a placeholder, never compared
        inbound_on=True,
    )

    def touch_uncached() -> None:
        inbound._touched.clear()
        inbound.touch_inbound_activity(target)

    figures["inbound._touched"] = compare(
        "inbound._touched (write)", lambda: inbound.touch_inbound_activity(target), touch_uncached, n
    )

    health.readiness()
    figures["health._cached"] = compare(
        "health._cached (readyz)", health.readiness, health.run_checks, max(10, n // 20)
    )

    figures["console_pip_wheel"] = compare("console_pip_wheel", console_pip_wheel, console_pip_wheel.__wrapped__, 3)
    for cached_backend in list(bridge._backends.values()):
        cached_backend.close()
    return figures


if __name__ == "__main__":
    main()
