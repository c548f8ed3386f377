"""Run some of a test module's tests again in a child pytest on SQLite (the embedded
default's database), for tests that must hold on both databases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def rerun_on_sqlite(test_file: str, selection: str, folder: Path, timeout_s: float = 600, **env: str) -> str:
    """The tests of `test_file` matching `-k selection`, in a child pytest whose database is a
    fresh SQLite file in `folder` (`env` on top of this process's environment). Skipped when
    this run is the SQLite run. Asserts the child passed; returns the tail of its output."""
    if connection.vendor == "sqlite":
        pytest.skip("this run is the SQLite run")
    child_env = {**os.environ, "DATABASE_URL": f"sqlite:///{folder / 'console.sqlite3'}", **env}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", test_file, "-q", "-p", "no:cacheprovider", "-k", selection],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    tail = (child.stdout + child.stderr)[-3000:]
    assert child.returncode == 0, tail
    return tail
