"""Docker listing on the real engine: a page costs its own rows, whatever else exists.

The engine filters by label and state and stops after the page (keyset `before=<id>` in its
own newest-first order), so a full listing reads each container about once, and a sandbox
deleted between pages (the reaper does that) neither hides the next page nor repeats one.
Containers here are created, never started: listing needs no running process.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandboxes.backends.base import BackendConfig, ErrorKind, ListQuery, RemoteError, SandboxState
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import KIND_SANDBOX, metadata_labels
from sandboxes.backends.docker.image import LABEL_KIND, LABEL_MANAGED

pytestmark = [pytest.mark.docker]


@pytest.fixture
def backend(docker_base_image: str) -> Iterator[DockerBackend]:
    adapter = DockerBackend(BackendConfig(kind="docker"))
    yield adapter
    adapter.close()


@pytest.fixture
def group(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[Callable[[int], list[str]]]:
    """Creates n console sandboxes (not started) of one group; their ids newest first."""
    made: list[str] = []
    metadata = {"test-run": test_run_id, "console-space": f"listing-{uuid.uuid4().hex[:8]}"}

    def make(n: int) -> list[str]:
        api = backend.api
        labels = {**metadata_labels(metadata), LABEL_MANAGED: "1", LABEL_KIND: KIND_SANDBOX}
        for _ in range(n):
            host_config = api.create_host_config(network_mode="none", dns=["127.0.0.1"])
            made.append(api.create_container(docker_base_image, labels=labels, host_config=host_config)["Id"])
        return list(reversed(made))

    make.metadata = metadata  # type: ignore[attr-defined]
    yield make
    for container_id in made:
        backend.delete(container_id)  # idempotent: some were deleted by the test


def _count_engine_rows(backend: DockerBackend, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of each container listing the engine sent (the real engine answers; this only counts)."""
    sent: list[int] = []
    real = backend.api.containers

    def counting(*args: Any, **kwargs: Any) -> Any:
        rows = real(*args, **kwargs)
        sent.append(len(rows))
        return rows

    monkeypatch.setattr(backend.api, "containers", counting)
    return sent


def test_a_full_listing_reads_each_container_about_once(
    backend: DockerBackend, group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = group(9)
    sent = _count_engine_rows(backend, monkeypatch)
    listed = [info.sandbox_id for info in backend.iter_sandboxes(ListQuery(metadata=group.metadata, limit=2))]
    assert listed == ids  # newest first, nothing twice, nothing skipped
    assert len(sent) == 5
    assert sum(sent) <= 9 + 4, f"the engine sent {sent} rows for 9 sandboxes in pages of 2"


def test_deleting_the_last_row_of_a_page_skips_nothing(backend: DockerBackend, group: Any) -> None:
    ids = group(7)
    first = backend.list(ListQuery(metadata=group.metadata, limit=3))
    assert [info.sandbox_id for info in first.items] == ids[:3]
    backend.delete(ids[2])  # the row the next page would start after
    second = backend.list(ListQuery(metadata=group.metadata, limit=3, page_token=first.next_token))
    assert [info.sandbox_id for info in second.items] == ids[3:6]
    third = backend.list(ListQuery(metadata=group.metadata, limit=3, page_token=second.next_token))
    assert [info.sandbox_id for info in third.items] == ids[6:]
    assert third.next_token is None


def test_deleting_a_whole_page_skips_nothing(backend: DockerBackend, group: Any) -> None:
    ids = group(5)
    first = backend.list(ListQuery(metadata=group.metadata, limit=2))
    for info in first.items:
        backend.delete(info.sandbox_id)
    rest = backend.list(ListQuery(metadata=group.metadata, limit=10, page_token=first.next_token))
    assert [info.sandbox_id for info in rest.items] == ids[2:]
    assert rest.next_token is None


def test_states_are_filtered_by_the_engine(backend: DockerBackend, group: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = group(3)
    backend.api.start(ids[0])
    sent = _count_engine_rows(backend, monkeypatch)
    running = backend.list(ListQuery(metadata=group.metadata, states=frozenset({SandboxState.RUNNING})))
    created = backend.list(ListQuery(metadata=group.metadata, states=frozenset({SandboxState.STARTING})))
    assert [info.sandbox_id for info in running.items] == ids[:1]
    assert [info.sandbox_id for info in created.items] == ids[1:]
    assert sent == [1, 2]


@pytest.mark.parametrize("token", ["not a token", "AAAA", "AAAAAAAAAAAAAAAAAAAAAAAA"])
def test_a_malformed_token_is_invalid(backend: DockerBackend, token: str) -> None:
    with pytest.raises(RemoteError) as caught:
        backend.list(ListQuery(limit=1, page_token=token))
    assert caught.value.kind == ErrorKind.INVALID
