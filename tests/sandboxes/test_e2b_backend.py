"""The E2B backend against the fake E2B server: the conformance suite plus E2B's own rules.

The adapter is pointed at the fake only through its BackendConfig (endpoint, domain, API key,
`options["sandbox_url"]`, private endpoints allowed); everything else is the production path,
guarded transport included. The fake's containers run with network "none".
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandboxes.backends.e2b import E2BBackend
from tests.fakes.fixtures import FakeHandle
from tests.sandboxes.backend_conformance import BackendConformance

pytestmark = [pytest.mark.docker, pytest.mark.e2b]


@pytest.fixture(scope="module")
def template_id() -> str:
    return "base"


@pytest.fixture(scope="module")
def backend(fake_e2b_server: FakeHandle) -> Iterator[E2BBackend]:
    adapter = E2BBackend(fake_e2b_server.backend_config("e2b"))
    yield adapter
    adapter.close()


class TestE2BConformance(BackendConformance):
    """The shared contract, run against the fake E2B control plane and envd."""
