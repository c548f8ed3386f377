"""The one-command start's logging (console.settings.dev): the periodic passes' routine lines
go to var/housekeeping.log, not the terminal, so the start's closing note and the requests
stay readable; their warnings, and every other line, stay on the terminal. The file is rotated
at a size (console.logs.SharedRotatingFileHandler), by whichever of the processes writing it
finds it full, without losing or repeating a line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from cryptography.fernet import Fernet

from console.logs import HOUSEKEEPING_BACKUPS, HOUSEKEEPING_MAX_BYTES, SharedRotatingFileHandler, logging_config
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


WRITER = r"""
import logging, sys
from console.logs import SharedRotatingFileHandler

path, name, count, max_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
handler = SharedRotatingFileHandler(path, max_bytes=max_bytes, backups=10_000)
handler.setFormatter(logging.Formatter("%(message)s"))
log = logging.getLogger("writer")
log.addHandler(handler)
log.setLevel(logging.INFO)
for number in range(count):
    log.info("%s line %05d %s", name, number, "x" * 40)
"""


def rotated_files(path: Path) -> list[Path]:
    return [path, *sorted(path.parent.glob(path.name + ".*[0-9]"), key=lambda p: int(p.suffix[1:]))]


def test_the_log_rotates_at_its_size_and_keeps_only_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "housekeeping.log"
    handler = SharedRotatingFileHandler(str(path), max_bytes=1000, backups=2)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("test.rotation.single")
    log.addHandler(handler)
    log.propagate = False
    try:
        for number in range(200):
            log.warning("line %03d %s", number, "y" * 40)  # 49 bytes with its newline
    finally:
        log.removeHandler(handler)
        handler.close()
    files = rotated_files(path)
    assert [p.name for p in files] == ["housekeeping.log", "housekeeping.log.1", "housekeeping.log.2"]
    assert all(p.stat().st_size < 1000 + 49 for p in files)
    assert path.read_text().splitlines()[-1].startswith("line 199 ")
    kept = [line for p in reversed(files) for line in p.read_text().splitlines()]
    assert kept == [f"line {n:03d} {'y' * 40}" for n in range(200 - len(kept), 200)]  # in order, none lost between


def test_processes_sharing_the_log_lose_and_repeat_no_line(tmp_path: Path) -> None:
    path = tmp_path / "housekeeping.log"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), name, "3000", "20000"],
            cwd=REPO,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings.test"},
        )
        for name in ("one", "two", "three")
    ]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0, 0]
    files = rotated_files(path)
    assert len(files) > 10  # it rotated many times, under all three
    lines = [line for p in files for line in p.read_text().splitlines()]
    assert sorted(lines) == sorted(
        f"{name} line {n:05d} {'x' * 40}" for name in ("one", "two", "three") for n in range(3000)
    )
    assert all(p.stat().st_size <= 20000 + 3 * 58 for p in files)  # a line or so from each past the size
    # Rotated only when full: a process rotating per its own view (RotatingFileHandler) also
    # renames the fresh file another just started, leaving backups of a few lines.
    assert all(p.stat().st_size >= 20000 for p in files[1:])
    assert not any(path.parent.glob("*.log.0"))


def test_the_start_settings_rotate_the_housekeeping_log() -> None:
    config = logging_config(log_format="text", level="INFO", housekeeping_log="/tmp/h.log")
    handler = config["handlers"]["housekeeping"]
    assert handler["()"] == "console.logs.SharedRotatingFileHandler"
    assert handler["max_bytes"] == HOUSEKEEPING_MAX_BYTES
    assert handler["backups"] == HOUSEKEEPING_BACKUPS
