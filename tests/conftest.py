"""Shared test plumbing: real services behind markers.

A test marked `docker`, `redis` or `postgres` needs that real service. Outside CI a missing
service skips the test with a message naming it; in CI (CI=true) it fails, so a broken
environment can never pass as green.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import pytest

from console.settings.test import worker_redis_url
from tests.support import network_guard

# No test looks a name up off this machine (tests/support/network_guard.py).
network_guard.install()

# The fake E2B/Cube servers' fixtures (fake_e2b_server, ...), the fake Kubernetes cluster's
# (fake_cluster, sandbox_template, kube_api) and the local OCI registry (oci_registry).
pytest_plugins = ["tests.fakes.fixtures", "tests.fakes.kube.fixtures", "tests.support.oci_registry"]

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
# Under pytest-xdist each worker has a Redis database of its own: the test settings already
# rewrote REDIS_URL for it; the default is rewritten here.
REDIS_URL = os.environ.get("REDIS_URL") or worker_redis_url("redis://127.0.0.1:6379/0")


@functools.cache
def docker_missing() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as exc:
        return f"the Docker engine does not answer ({exc.__class__.__name__}: {exc})"
    return None


@functools.cache
def redis_missing() -> str | None:
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as exc:
        return f"Redis at {REDIS_URL} does not answer ({exc})"
    return None


@functools.cache
def postgres_missing() -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return "DATABASE_URL does not name a PostgreSQL database"
    return None


SERVICE_CHECKS: dict[str, Callable[[], str | None]] = {
    "docker": docker_missing,
    "redis": redis_missing,
    "postgres": postgres_missing,
}


def require_service(name: str) -> None:
    problem = SERVICE_CHECKS[name]()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"[CI] required service missing: {problem}", pytrace=False)
    pytest.skip(f"needs {name}: {problem}")


@pytest.fixture(autouse=True)
def _require_marked_services(request: pytest.FixtureRequest) -> None:
    for name in SERVICE_CHECKS:
        if request.node.get_closest_marker(name) is not None:
            require_service(name)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    db = os.environ.get("DATABASE_URL", "sqlite (default)")
    lines.append(f"console services: database={db.split('@')[-1]} redis={REDIS_URL} CI={IN_CI}")
    for name, check in SERVICE_CHECKS.items():
        problem = check()
        lines.append(f"  {name}: {'answers' if problem is None else 'MISSING - ' + problem}")
    return lines


# Personas (alice, bob, carol, charlie, root) for every app's tests.
# `captured`: the log records of a test (tests/support/log_capture.py).
from tests.personas import world  # noqa: E402, F401
from tests.support.log_capture import captured  # noqa: E402, F401


@pytest.fixture
def tuned(settings: Any) -> Callable[..., None]:
    """Change tuning knobs for the rest of the test: `tuned({"terminal.reattach_s": 1})` or
    `tuned(terminal={"reattach_s": 1})`. Through pytest-django's `settings` (settings.TUNING,
    merged), so every override of the test is undone in one order at its end."""
    from console.tuning import merged

    def apply(values: Any = None, **by_room: Any) -> None:
        settings.TUNING = merged(settings.TUNING, values, **by_room)

    return apply
