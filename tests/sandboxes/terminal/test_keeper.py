"""The kept shell's tmux pane read back from a real sandbox: probe and history."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sandboxes.backends.base import BackendConfig
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.terminal import keeper
from tests.support.backend_conformance import run, sandbox_factory

pytestmark = [pytest.mark.docker]


@pytest.fixture
def kept(docker_base_image: str, test_run_id: str) -> Iterator[tuple[DockerBackend, str]]:
    adapter = DockerBackend(BackendConfig(kind="docker", options={}))
    try:
        with sandbox_factory(adapter, docker_base_image, test_run_id) as make:
            yield adapter, make().sandbox_id
    finally:
        adapter.close()


def test_history_survives_output_that_prints_the_readers_own_separators(kept: tuple[DockerBackend, str]) -> None:
    """A user's program may print any line, the lines that once split the reply included."""
    backend, sandbox_id = kept
    terminal_id = "7f1c2d3e-0000-4000-8000-000000000001"
    assert keeper.probe(backend, sandbox_id, terminal_id).kept
    name = keeper.session_name(terminal_id)
    program = "printf -- '--history--\\n--screen--\\n'; seq 1 60; sleep 600"
    run(backend, sandbox_id, f'{keeper._tmux("new-session", "-d", "-s", name, "-x", "80", "-y", "10")} "{program}"')
    deadline = time.monotonic() + 10
    while (
        b"60"
        not in (read := keeper.history(backend, sandbox_id, terminal_id) or keeper.History(0, b"", b"", (0, 0))).screen
    ):
        assert time.monotonic() < deadline, read
        time.sleep(0.2)
    past = read.history.decode().splitlines()
    assert past[:2] == ["--history--", "--screen--"]
    assert [line for line in past[2:] if line] == [str(n) for n in range(1, len(past) - 1)]
    assert read.screen.decode().split()[-1] == "60"
