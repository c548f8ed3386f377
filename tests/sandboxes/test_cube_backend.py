"""The Cube backend against the fake Cube server (C-later by default): the conformance suite
plus one test per Cube quirk the adapter handles (each names the quirk it pins)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandboxes.backends.cube import CubeBackend
from tests.fakes.fixtures import FakeHandle
from tests.sandboxes.backend_conformance import BackendConformance

pytestmark = [pytest.mark.docker, pytest.mark.e2b, pytest.mark.cube]


@pytest.fixture(scope="module")
def template_id() -> str:
    return "base"


@pytest.fixture(scope="module")
def backend(fake_cube_server: FakeHandle) -> Iterator[CubeBackend]:
    adapter = CubeBackend(fake_cube_server.backend_config("cube"))
    yield adapter
    adapter.close()


class TestCubeConformance(BackendConformance):
    """The shared contract, run against the fake CubeAPI and envd 0.2.0."""
