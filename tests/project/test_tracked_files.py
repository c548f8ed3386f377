"""What the repository tracks: no symbolic link, since a clone has none of the folders a
link made in one checkout (a worktree's `var`, `node_modules`) points at."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_no_symbolic_link_is_tracked() -> None:
    staged = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    links = [line.split("\t", 1)[1] for line in staged.splitlines() if line.startswith("120000 ")]
    assert not links, f"symbolic links tracked: {links}"
