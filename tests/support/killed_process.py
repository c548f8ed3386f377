"""A real console-side Python process on the test database, to SIGKILL inside a window the
code leaves open (no `finally`, no atexit, no clean-up runs): what a crash or an OOM kill
leaves behind, seen by the test's own process through the real database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from django.db import connection

REPO = Path(__file__).resolve().parents[2]


def console_child(code: str) -> subprocess.Popen[str]:
    """Runs `code` after `django.setup()` on the test's PostgreSQL database; the code prints
    READY when it is inside the window to kill."""
    settings_dict = connection.settings_dict
    url = (
        f"postgres://{settings_dict['USER']}@{settings_dict['HOST'] or '127.0.0.1'}:"
        f"{settings_dict['PORT'] or 5432}/{settings_dict['NAME']}"
    )
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "console.settings.test"}
    prelude = "import django, sys, time\ndjango.setup()\n"
    return subprocess.Popen(
        [sys.executable, "-c", prelude + code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )


def kill_when_ready(child: subprocess.Popen[str]) -> None:
    """SIGKILL the child once it printed READY."""
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == "READY", f"child did not get there: {line!r} (rc {child.poll()})"
    os.kill(child.pid, signal.SIGKILL)  # no finally, no atexit, no cleanup
    child.wait(timeout=10)
