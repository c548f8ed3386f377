"""`make start`'s closing note (scripts/start.sh): after setup it says where the console
answers, who to log in as, the first password or how to set a new one, and what it changed
on the host; the password is not lost above the request lines.

`start.sh` runs from a copy of `scripts/` with stand-ins: a `.venv/bin/python` that answers
the management commands as a first run does (and serves nothing), an empty `setup.sh`, and a
`docker` that finds no engine, so nothing is installed and the host is left alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STAND_IN_PYTHON = f"""#!/bin/sh
case "$*" in
  -c*) exec {sys.executable} "$@" ;;
  *bootstrap_console*)
    if [ -n "$FIRST_RUN" ]; then
      echo "  First admin created; this password is shown only once:"
      echo "    username: ${{CONSOLE_ADMIN_USER:-admin}}"
      echo "    password: pw-stand-in-123"
    else
      echo "Admin user 'admin' exists (change its password with manage.py changepassword)."
    fi ;;
  *register_local_engine*) echo "Platform backends exist; nothing registered." ;;
  *"tuning processes.shutdown_grace_s"*) echo 1 ;;
  *console.serve*) echo "serving (stand-in), metrics in ${{PROMETHEUS_MULTIPROC_DIR:-none}}" ;;
esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", root / "scripts")
    (root / "scripts" / "setup.sh").write_text("exit 0\n")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    stand_ins = root / "stand-in-bin"
    stand_ins.mkdir()
    (stand_ins / "docker").write_text("#!/bin/sh\nexit 1\n")  # no engine answers
    (stand_ins / "docker").chmod(0o755)
    return root


def start(checkout: Path, **env: str) -> str:
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "start.sh")],
        env={
            "PATH": f"{checkout / 'stand-in-bin'}:{os.environ.get('PATH', '')}",
            "HOME": str(checkout),
            "CONSOLE_VAR_DIR": str(checkout / "var"),
            **env,
        },
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_first_start_closes_with_the_url_the_admin_and_the_password(checkout: Path) -> None:
    out = start(checkout, FIRST_RUN="1", HOST="127.0.0.2", PORT="8123")
    note = out[out.index("=====") :]
    assert "http://127.0.0.2:8123/" in note
    assert "Log in as:  admin" in note
    assert "Password:   pw-stand-in-123" in note
    assert "manage.py changepassword admin" in note
    assert "Changed on this host: nothing beyond this folder." in note
    assert "var/housekeeping.log" in note
    # Setup is done when it is printed: the server's lines come after it.
    assert out.index("=====") < out.index("serving (stand-in)")


def test_a_later_start_says_how_to_set_a_new_password(checkout: Path) -> None:
    note = start(checkout, CONSOLE_ADMIN_USER="ops")
    assert "Log in as:  ops" in note
    assert "set on the first run (printed then, never stored)" in note
    assert "manage.py changepassword ops" in note
    assert "pw-stand-in" not in note


def test_the_note_names_the_housekeeping_log_where_the_console_writes_it(checkout: Path) -> None:
    """Settings put it in CONSOLE_VAR_DIR (console/settings/dev.py): the note says that file."""
    elsewhere = checkout / "data"
    note = start(checkout, CONSOLE_VAR_DIR=str(elsewhere))
    assert f"{elsewhere}/housekeeping.log" in note


def test_a_console_of_its_own_folder_keeps_its_logs_and_metrics_there(checkout: Path) -> None:
    """A second console (`CONSOLE_VAR_DIR=… PORT=… make start`, docs/operations.md) writes
    nothing into the checkout's var/: two consoles never share a setup log, a beat schedule,
    worker logs or a metrics folder (their numbers would add up on /metrics)."""
    elsewhere = checkout / "data"
    out = start(checkout, CONSOLE_VAR_DIR=str(elsewhere), REDIS_URL="redis://127.0.0.1:9/0")
    assert not (checkout / "var").exists()
    assert (elsewhere / "setup.log").is_file()
    assert (elsewhere / "celery-worker.log").is_file()
    assert (elsewhere / "celery-beat.log").is_file()
    assert f"logs: {elsewhere}/celery-worker.log, {elsewhere}/celery-beat.log" in out
    assert f"setup in {elsewhere}/setup.log" in out
    assert f"metrics in {elsewhere}/metrics" in out
