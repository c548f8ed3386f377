"""The adapters warmed up at a console process's start (sandboxes/catalog/warm_up.py): in a
fresh process, the Docker adapter's module is not imported by Django's set-up, and is once
the ASGI entry point (what Daphne loads) has been imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import connection

from sandboxes.models import PlatformBackend
from tests.support.console_process import REPO

ADAPTER = "sandboxes.backends.docker.backend"
PROBE = f"""
import json, sys
import django
django.setup()
before = {ADAPTER!r} in sys.modules
import time
import console.asgi
for _ in range(200):  # warmed in a background thread
    if {ADAPTER!r} in sys.modules:
        break
    time.sleep(0.05)
print(json.dumps({{"before": before, "after": {ADAPTER!r} in sys.modules}}))
"""


@pytest.mark.django_db(transaction=True)
def test_a_started_console_has_the_docker_adapter_imported() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the probe process reaches the test database over PostgreSQL")
    PlatformBackend.objects.create(name="warmed", kind="docker")
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings.test", "DATABASE_URL": url}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen == {"before": False, "after": True}
