"""The installation id of the one-command start (scripts/keys.sh, console/settings/dev.py):
generated once per var/ and kept there like the secret key, so two consoles on one Docker
engine never take each other's sandboxes for their own; the environment still wins, and a
console from before keeps the "local" its sandboxes carry.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def keys_env(var_dir: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "CONSOLE_VAR_DIR": str(var_dir),
        "PYTHON_BIN": sys.executable,
        **extra,
    }


def installation_id_of_a_start(var_dir: Path, **extra: str) -> str:
    """What `make start` exports to the console's processes for this var/."""
    done = subprocess.run(
        ["bash", "-c", 'source scripts/keys.sh >/dev/null && printf %s "$CONSOLE_INSTALLATION_ID"'],
        env=keys_env(var_dir, **extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def installation_id_of_manage_py(var_dir: Path) -> str:
    """What `manage.py` run by hand on that var/ uses (the development settings)."""
    done = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.CONSOLE_INSTALLATION_ID)"],
        env={**keys_env(var_dir), "DJANGO_SETTINGS_MODULE": "console.settings.dev"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_two_fresh_var_dirs_get_different_installation_ids(tmp_path: Path) -> None:
    first = installation_id_of_a_start(tmp_path / "first")
    second = installation_id_of_a_start(tmp_path / "second")

    assert first
    assert second
    assert first != second
    assert "local" not in (first, second)
    assert (tmp_path / "first" / "console-installation-id").read_text().strip() == first
    assert (tmp_path / "first" / "console-installation-id").stat().st_mode & 0o077 == 0


def test_the_id_is_kept_across_starts_and_read_by_manage_py(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    generated = installation_id_of_a_start(var_dir)

    assert installation_id_of_a_start(var_dir) == generated
    assert installation_id_of_manage_py(var_dir) == generated


def test_the_environment_wins(tmp_path: Path) -> None:
    var_dir = tmp_path / "var"
    installation_id_of_a_start(var_dir)
    assert installation_id_of_a_start(var_dir, CONSOLE_INSTALLATION_ID="moved-console") == "moved-console"


def test_a_console_from_before_keeps_local(tmp_path: Path) -> None:
    # Its sandboxes carry "local": a new id would orphan every one of them.
    var_dir = tmp_path / "var"
    var_dir.mkdir()
    (var_dir / "secret-key").write_text("an-older-consoles-key\n")

    assert installation_id_of_a_start(var_dir) == "local"
    assert installation_id_of_a_start(var_dir) == "local"
