"""Settings for the test suite.

DATABASE_URL picks the database (CI: PostgreSQL); REDIS_URL is read by the tests that need
Redis, but the console under test keeps the in-process runner unless a test opts in.
"""

import os

from .base import *  # noqa: F403
from .base import DATABASES, REDIS_URL, TUNING, VAR_DIR

SECRET_KEY = "test-secret-key-not-for-production"  # noqa: S105
FIELD_ENCRYPTION_KEY = "i-jd3i8P6hAsBXbyr7FvRh-DyH0dvHOP5x0g-mmpuj8="
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STATIC_URL = "/static/"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
JOB_RUNNER = os.environ.get("TEST_JOB_RUNNER", "inprocess")
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
MEDIA_ROOT = VAR_DIR / "test-media"
CONSOLE_INSTALLATION_ID = "test-" + os.environ.get("PYTEST_XDIST_WORKER", "main")


def worker_redis_url(url: str) -> str:
    """`url` for this pytest-xdist worker: gwN uses the Nth Redis database after url's (gw0
    keeps it), as pytest-django gives each worker a test database of its own. Outside xdist,
    `url` itself."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + int(worker[2:])
    return parts._replace(path=f"/{db}").geturl()


# Once per worker: the processes a test starts inherit the worker's REDIS_URL (or the one the
# test gives them) and keep it.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker and REDIS_URL and os.environ.get("TEST_REDIS_WORKER") != _worker:
    REDIS_URL = os.environ["REDIS_URL"] = worker_redis_url(REDIS_URL)
    os.environ["TEST_REDIS_WORKER"] = _worker
    CELERY_BROKER_URL = REDIS_URL
LOGGING = {"version": 1, "disable_existing_loggers": False}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
RUN_SCHEDULER = False  # tests run periodic functions themselves
# Test runs share one engine under one installation id while each has its own database: the
# per-installation clean-up would take another run's live objects for orphans. Tests of it
# switch it on under an installation id of their own.
TUNING = {**TUNING, "sessions.reaper_unmanaged": False}
# No pool in tests: a test's threads each hold a connection until they close it, and a
# pool that ran dry would turn a slow test into one that waits for POOL_TIMEOUT_S. The pool
# is exercised by the console run as a process (tests/support/console_process.py, benches).
DATABASES["default"].get("OPTIONS", {}).pop("pool", None)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not the in-memory default: threads racing on the session store need real locks.
    import tempfile

    DATABASES["default"]["TEST"] = {"NAME": os.path.join(tempfile.gettempdir(), f"console-test-{os.getpid()}.sqlite3")}
