"""The "console diagnostics" job: checks the services the console depends on.

It is also the job the test suite runs end to end, in-process and through a real Celery
worker, because it touches the database, Redis and the channel layer like real jobs do.
"""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from .jobs import JobContext, JobFailed, job_handler


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return f"{connection.vendor} answers"


def _check_redis() -> str:
    if not settings.REDIS_URL:
        return "not configured (in-memory bindings and in-process jobs)"
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
    started = time.perf_counter()
    client.ping()
    return f"answers in {(time.perf_counter() - started) * 1000:.1f} ms"


def _check_channel_layer() -> str:
    layer = get_channel_layer()
    if layer is None:
        raise JobFailed("no channel layer is configured")

    async def round_trip() -> None:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "diagnostics.ping"})
        message = await layer.receive(channel)
        if message.get("type") != "diagnostics.ping":
            raise JobFailed("the channel layer returned a different message")

    async_to_sync(round_trip)()
    return f"{layer.__class__.__name__} round trip ok"


CHECKS = [
    ("database", _check_database),
    ("redis", _check_redis),
    ("channel layer", _check_channel_layer),
]


@job_handler("console.diagnostics", label="Console diagnostics")
def run_diagnostics(ctx: JobContext) -> dict[str, Any]:
    results: dict[str, str] = {}
    failures = []
    for index, (name, check) in enumerate(CHECKS):
        ctx.progress(int(index * 100 / len(CHECKS)), f"Checking {name}…")
        try:
            results[name] = check()
        except Exception as exc:
            results[name] = f"FAILED: {exc}"
            failures.append(name)
        ctx.log(f"{name}: {results[name]}")
    results["job runner"] = settings.JOB_RUNNER
    if failures:
        raise JobFailed("failed checks: " + ", ".join(failures))
    return results
