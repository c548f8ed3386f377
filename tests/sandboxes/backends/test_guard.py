"""The guarded transport under the E2B/Cube adapters: every control-plane and envd request
is re-resolved and checked at dial time, so a name that passed the check when the config was
saved but now resolves to a refused address (DNS rebinding) is refused.

Names are resolved by a resolver hook (no /etc/hosts, no DNS); refused addresses are never
dialled, and everything else goes to the fake server on loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from sandboxes.backends.base import BackendConfig, ErrorKind, ListQuery, RemoteError, SandboxSpec
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.backends.guard import check_endpoint
from tests.fakes.fixtures import FakeHandle
from tests.support.backend_conformance import OFFLINE, run

pytestmark = [pytest.mark.docker, pytest.mark.e2b]

METADATA_ADDRESS = "169.254.169.254"


class SwitchableResolver:
    """Resolves every name to one address, which a test can change between calls."""

    def __init__(self, address: str) -> None:
        self.addresses = {"*": address}
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        return [self.addresses.get(host, self.addresses["*"])]


def rebinding_config(fake: FakeHandle, kind: str, *, allow_private: bool = True) -> BackendConfig:
    port = fake.api_url.rsplit(":", 1)[1]
    return replace(
        fake.backend_config(kind, retries="0"),
        endpoint=f"http://api.rebind.test:{port}",
        allow_private_endpoints=allow_private,
        options={"sandbox_url": f"http://envd.rebind.test:{port}", "retries": "0"},
    )


@pytest.fixture
def resolver() -> SwitchableResolver:
    return SwitchableResolver("127.0.0.1")


@pytest.fixture
def e2b(fake_e2b: FakeHandle, resolver: SwitchableResolver) -> Iterator[E2BBackend]:
    adapter = E2BBackend(rebinding_config(fake_e2b, "e2b"), resolver=resolver)
    yield adapter
    adapter.close()


def test_a_control_plane_name_rebound_to_the_metadata_address_is_forbidden(
    fake_e2b: FakeHandle, e2b: E2BBackend, resolver: SwitchableResolver
) -> None:
    # Saving the config: the name resolves to loopback, allowed by the config's opt-in.
    assert check_endpoint(e2b.api_url, allow_private=True, resolver=resolver) == ["127.0.0.1"]
    assert e2b.health().ok
    # Dialling later: the same name now answers the cloud metadata address.
    resolver.addresses["*"] = METADATA_ADDRESS
    with pytest.raises(RemoteError) as caught:
        e2b.list(ListQuery())
    assert caught.value.kind == ErrorKind.FORBIDDEN
    assert METADATA_ADDRESS in caught.value.message
    assert not e2b.health().ok


def test_an_envd_name_rebound_after_create_is_forbidden(
    fake_e2b: FakeHandle, e2b: E2BBackend, resolver: SwitchableResolver
) -> None:
    info = e2b.create(SandboxSpec(template_id="base", network=OFFLINE))
    try:
        assert run(e2b, info.sandbox_id, "echo via-guard") == "via-guard\n"
        resolver.addresses["envd.rebind.test"] = METADATA_ADDRESS  # only the data plane moves
        with pytest.raises(RemoteError) as caught:
            run(e2b, info.sandbox_id, "true")
        assert caught.value.kind == ErrorKind.FORBIDDEN
        files = e2b.files()
        with pytest.raises(RemoteError) as caught:
            files.read(info.sandbox_id, "/etc/hostname")
        assert caught.value.kind == ErrorKind.FORBIDDEN
        assert "envd.rebind.test" in resolver.calls
    finally:
        resolver.addresses.pop("envd.rebind.test", None)
        e2b.delete(info.sandbox_id)


def test_loopback_without_the_opt_in_is_forbidden_and_not_retried(
    fake_e2b: FakeHandle, resolver: SwitchableResolver
) -> None:
    adapter = E2BBackend(rebinding_config(fake_e2b, "e2b", allow_private=False), resolver=resolver)
    waits: list[float] = []
    adapter.sleep = waits.append
    with pytest.raises(RemoteError) as caught:
        adapter.get("anything")
    assert caught.value.kind == ErrorKind.FORBIDDEN
    assert "allow private endpoints" in caught.value.message
    assert waits == []
    adapter.close()


@pytest.mark.cube
def test_cube_goes_through_the_guard_too(fake_cube: FakeHandle, resolver: SwitchableResolver) -> None:
    adapter = CubeBackend(rebinding_config(fake_cube, "cube"), resolver=resolver)
    assert adapter.health().ok
    resolver.addresses["*"] = METADATA_ADDRESS
    with pytest.raises(RemoteError) as caught:
        adapter.list(ListQuery())
    assert caught.value.kind == ErrorKind.FORBIDDEN
    adapter.close()
