"""One console per var/ (scripts/lock.sh, sourced first by scripts/start.sh): a second
`make start` on a folder whose console still runs stops at once with the reason, before it
sets anything up, and a folder whose console has ended starts.

`start.sh` runs from a copy of `scripts/` in a folder of the test's own whose `.venv/bin/python`
fails at once: a start that gets past the lock stops at its first setup step, and nothing is
ever installed into the real virtualenv.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REFUSED = "another console is running on"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", root / "scripts")
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 'stand-in python: no setup here' >&2\nexit 3\n")
    python.chmod(0o755)
    return root


def env_for(var_dir: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": str(var_dir.parent), "CONSOLE_VAR_DIR": str(var_dir)}


def start(checkout: Path, var_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(checkout / "scripts" / "start.sh")],
        env=env_for(var_dir),
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def hold(checkout: Path, var_dir: Path, script: str) -> subprocess.Popen[str]:
    """A console stand-in: takes the lock as start.sh does, then runs `script` (bash)."""
    holder = subprocess.Popen(
        ["bash", "-c", f"source scripts/lock.sh && {{ {script}; }}"],
        env=env_for(var_dir),
        cwd=checkout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not (var_dir / "console.lock").is_file() or not (var_dir / "console.lock").read_text():
        assert holder.poll() in (None, 0), holder.stderr.read() if holder.stderr else ""
        assert time.monotonic() < deadline, "the stand-in never took the lock"
        time.sleep(0.05)
    return holder


def test_a_second_start_on_a_running_console_s_var_dir_refuses(checkout: Path, tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    holder = hold(checkout, var_dir, "exec sleep 60")
    try:
        started = time.monotonic()
        second = start(checkout, var_dir)
        took = time.monotonic() - started
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)

    assert second.returncode != 0
    assert REFUSED in second.stderr, second.stderr
    assert str(var_dir) in second.stderr
    assert f"pid {holder.pid}" in second.stderr  # who holds it
    assert "CONSOLE_VAR_DIR" in second.stderr  # and what to do instead
    assert not (checkout / "var" / "setup.log").exists(), "the second start began setting up"
    assert took < 10


def test_the_lock_lasts_while_any_process_of_the_console_lives(checkout: Path, tmp_path: Path) -> None:
    # start.sh itself gone, its server still finishing its requests: still one console.
    var_dir = tmp_path / "var"
    holder = hold(checkout, var_dir, "sleep 60 & echo $!")
    assert holder.stdout is not None
    server = int(holder.stdout.readline())
    holder.wait(10)
    try:
        second = start(checkout, var_dir)
        assert REFUSED in second.stderr, second.stderr
    finally:
        os.kill(server, signal.SIGKILL)
    time.sleep(0.3)

    third = start(checkout, var_dir)

    # Past the lock: it stops at its first setup step (the stand-in python), as it should here.
    assert REFUSED not in third.stderr, third.stderr
    assert "setting up Python packages" in third.stdout + third.stderr


def test_another_var_dir_starts_beside_a_running_console(checkout: Path, tmp_path: Path) -> None:
    holder = hold(checkout, tmp_path / "var", "exec sleep 60")
    try:
        other = start(checkout, tmp_path / "other-var")
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(10)
    assert REFUSED not in other.stderr, other.stderr
    assert "setting up Python packages" in other.stdout + other.stderr
