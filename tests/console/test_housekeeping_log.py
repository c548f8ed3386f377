"""The one-command start's logging (console.settings.dev): the periodic passes' routine lines
go to var/housekeeping.log, not the terminal, so the start's closing note and the requests
stay readable; their warnings, and every other line, stay on the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet

from tests.support.warm_manage import REPO

LOG_LINES = r"""
import logging
import django

django.setup()
jobs = logging.getLogger("console.jobs")
jobs.info("job 1 (sandboxes.idle_sweep) succeeded", extra={"job_kind": "sandboxes.idle_sweep"})
jobs.info("job 2 (sandboxes.test_connection) succeeded", extra={"job_kind": "sandboxes.test_connection"})
logging.getLogger("sandboxes.sessions.reaper").info("reaper pass: nothing to do")
logging.getLogger("sandboxes.sessions.reaper").warning("reaper: the store did not answer")
logging.getLogger("console.requests").info("GET /sessions/ 200")
"""


def run_with_dev_settings(var_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "console.settings.dev",
        "CONSOLE_VAR_DIR": str(var_dir),
        "DATABASE_URL": f"sqlite:///{var_dir / 'console.sqlite3'}",
        "SECRET_KEY": "housekeeping-log-test-" + "x" * 40,
        "FIELD_ENCRYPTION_KEY": Fernet.generate_key().decode(),
        "CONSOLE_TUNING": "logs.format=text",
    }
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-c", LOG_LINES], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_housekeeping_lines_go_to_their_file_and_the_rest_to_the_terminal(tmp_path: Path) -> None:
    done = run_with_dev_settings(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    terminal = done.stderr
    kept = (tmp_path / "housekeeping.log").read_text()
    assert "sandboxes.idle_sweep" in kept
    assert "reaper pass: nothing to do" in kept
    assert "sandboxes.idle_sweep" not in terminal
    assert "reaper pass: nothing to do" not in terminal
    # A job people started, a request, and every warning stay where people look.
    assert "sandboxes.test_connection" in terminal
    assert "GET /sessions/ 200" in terminal
    assert "reaper: the store did not answer" in terminal
    assert "reaper: the store did not answer" in kept
    assert "test_connection" not in kept
