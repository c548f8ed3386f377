"""A recorded Cube release that no longer holds (the cluster was upgraded or rolled back
since the connection test recorded it): the network switches must still mean what the
space's policy says. Before v0.5 `allowPublicTraffic` is the egress master switch, from
v0.5 it is inbound (services/sandboxes.rs build_cubevs_context / build_cube_network_config),
so a body built for the wrong release opens what the policy closes."""

from __future__ import annotations

import pytest

from sandboxes.backends.base import NetworkSpec, SandboxSpec
from sandboxes.backends.cube.backend import CubeBackend
from tests.fakes.fixtures import FakeHandle

pytestmark = [pytest.mark.docker, pytest.mark.cube]


def _row(fake: FakeHandle, sandbox_id: str) -> dict[str, object]:
    rows = [row for row in fake.state()["sandboxes"] if row["sandboxID"] == sandbox_id]
    assert rows
    return rows[0]


def test_a_stale_later_record_on_an_old_cube_keeps_internet_off(
    fake_cube_04_server: FakeHandle, test_run_id: str
) -> None:
    # Recorded cube-0.5 (not pinned), the cluster is before v0.5: internet off with inbound
    # on sent allowPublicTraffic=true, which that release reads as "egress on".
    adapter = CubeBackend(fake_cube_04_server.backend_config("cube", protocol="cube-0.5"))
    network = NetworkSpec(allow_internet_access=False, allow_public_traffic=True)
    info = adapter.create(SandboxSpec(template_id="base", network=network, metadata={"test-run": test_run_id}))
    try:
        assert _row(fake_cube_04_server, info.sandbox_id)["egress"] is False
    finally:
        adapter.delete(info.sandbox_id)
        adapter.close()


def test_a_stale_old_record_on_a_later_cube_keeps_inbound_closed(
    fake_cube_server: FakeHandle, test_run_id: str
) -> None:
    # Recorded cube-0.4, the cluster was upgraded: internet on with inbound off sent
    # allowPublicTraffic=true (the old egress meaning), which v0.5+ reads as "ports public".
    adapter = CubeBackend(fake_cube_server.backend_config("cube", protocol="cube-0.4"))
    network = NetworkSpec(allow_internet_access=True, allow_public_traffic=False)
    info = adapter.create(SandboxSpec(template_id="base", network=network, metadata={"test-run": test_run_id}))
    try:
        row = _row(fake_cube_server, info.sandbox_id)
        assert row["egress"] is True
        assert (row["network"] or {}).get("allowPublicTraffic") is False  # type: ignore[attr-defined]
        assert info.traffic_token  # inbound closed: the ports need the token
    finally:
        adapter.delete(info.sandbox_id)
        adapter.close()


def test_a_pinned_release_is_not_probed_at_create(fake_cube_04_server: FakeHandle, test_run_id: str) -> None:
    adapter = CubeBackend(fake_cube_04_server.backend_config("cube", protocol="cube-0.4", protocol_pinned="1"))
    fake_cube_04_server.forget_requests()
    info = adapter.create(
        SandboxSpec(
            template_id="base",
            # v0.4.0 serves every sandbox's ports: only public inbound can be honoured.
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=True),
            metadata={"test-run": test_run_id},
        )
    )
    try:
        assert ("api", "GET", "/snapshots") not in fake_cube_04_server.requests()
    finally:
        adapter.delete(info.sandbox_id)
        adapter.close()


def _create(adapter: CubeBackend, network: NetworkSpec, test_run_id: str) -> str:
    return adapter.create(
        SandboxSpec(template_id="base", network=network, metadata={"test-run": test_run_id})
    ).sandbox_id


def test_a_rollback_after_this_adapters_first_create_keeps_internet_off(
    fake_cube_server: FakeHandle, test_run_id: str
) -> None:
    # One adapter lives as long as its config row (catalog.bridge.get_backend): it probed
    # v0.5.1 at its first create, then the cluster was rolled back to v0.4.0 in place. Internet
    # off with inbound on sent allowPublicTraffic=true, which v0.4.0 reads as "egress on".
    adapter = CubeBackend(fake_cube_server.backend_config("cube"))
    network = NetworkSpec(allow_internet_access=False, allow_public_traffic=True)
    created = [_create(adapter, network, test_run_id)]
    try:
        fake_cube_server.configure(cube_version="0.4.0")
        created.append(_create(adapter, network, test_run_id))
        assert _row(fake_cube_server, created[-1])["egress"] is False
    finally:
        fake_cube_server.configure(cube_version=fake_cube_server.cube_version)
        for sandbox_id in created:
            adapter.delete(sandbox_id)
        adapter.close()


def test_an_upgrade_after_this_adapters_first_create_keeps_inbound_closed(
    fake_cube_04_server: FakeHandle, test_run_id: str
) -> None:
    # Probed v0.4.0 at the first create, then upgraded to v0.5.1 in place: internet on with
    # inbound off sent allowPublicTraffic=true (the old egress meaning): ports public.
    adapter = CubeBackend(fake_cube_04_server.backend_config("cube"))
    created = [_create(adapter, NetworkSpec(allow_internet_access=True, allow_public_traffic=True), test_run_id)]
    try:
        fake_cube_04_server.configure(cube_version="0.5.1")
        network = NetworkSpec(allow_internet_access=True, allow_public_traffic=False)
        created.append(_create(adapter, network, test_run_id))
        row = _row(fake_cube_04_server, created[-1])
        assert row["egress"] is True
        assert (row["network"] or {}).get("allowPublicTraffic") is False  # type: ignore[attr-defined]
    finally:
        fake_cube_04_server.configure(cube_version=fake_cube_04_server.cube_version)
        for sandbox_id in created:
            adapter.delete(sandbox_id)
        adapter.close()
