"""Settings for the test suite.

DATABASE_URL picks the database (CI: PostgreSQL); REDIS_URL is read by the tests that need
Redis, but the console under test keeps the in-process runner unless a test opts in.
"""

import os

from .base import *  # noqa: F403
from .base import DATABASES, TUNING, VAR_DIR

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
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not the in-memory default: threads racing on the session store need real locks.
    import tempfile

    DATABASES["default"]["TEST"] = {"NAME": os.path.join(tempfile.gettempdir(), f"console-test-{os.getpid()}.sqlite3")}
