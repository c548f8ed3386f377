"""What git may use while it talks to a repository: time and memory, against servers that
never stop sending (local servers only)."""

from __future__ import annotations

import time

import pytest

from skills.sources.git import GitError, GitLimits, GitPolicy, remote_commit
from tests.support.git_repos import RefFloodServer


def test_a_server_sending_refs_forever_stops_git_at_its_memory_limit() -> None:
    """git keeps every advertised ref in memory until the list ends: a server that never ends
    it must not grow the console host's memory for the whole timeout."""
    flood = RefFloodServer(total=150_000_000)
    policy = GitPolicy(allowed_hosts=frozenset({f"127.0.0.1:{flood.port}"}))
    limits = GitLimits(timeout_s=20, memory_bytes=64 * 1024 * 1024)
    started = time.monotonic()
    try:
        with pytest.raises(GitError, match=r"needed more than 64.0 MiB of memory"):
            remote_commit(f"git://127.0.0.1:{flood.port}/skills", "", policy, limits)
    finally:
        flood.close()
    assert time.monotonic() - started < 15
    assert flood.sent < 150_000_000
