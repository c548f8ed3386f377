"""Releasing a Docker space network leaves nothing behind on the host: after its sandboxes
are deleted and the network goes, the packet filter's table, the processes and the egress
state folder hold nothing that names it (listed before and after, compared), and the
component's housekeeping removes what a network released behind the console's back left.
Every name is unique to the test and answered by a dnsmasq of its own; nothing leaves the
machine."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.backends.base import META_SPACE, NetworkSpec, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.egress.component import DockerEgress, EgressSettings
from sandboxes.backends.docker.egress.firewall import bridge_name, table_lines
from sandboxes.backends.docker.egress.proxy import squid_available
from sandboxes.backends.docker.egress.rules import chain_name, domain_sets, network_sets
from sandboxes.backends.docker.egress.state import EgressState, SandboxState
from tests.support.egress_support import docker_backend, upstream_dns

pytestmark = [pytest.mark.docker]

TAG = secrets.token_hex(4)
ZONE = f"rel{TAG}.test"
DENIED = f"bad-rel{TAG}.test"


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str) -> Iterator[DockerBackend]:
    with (
        upstream_dns({ZONE: "203.0.113.7", DENIED: "203.0.113.8"}) as upstream,
        docker_backend(test_run_id, upstream) as adapter,
    ):
        yield adapter


def host_state(backend: DockerBackend, network: str, sandbox_ids: list[str]) -> dict[str, list[str]]:
    """What the host holds that names this network, its sandboxes or the test's names."""
    bridge = bridge_name(network)
    names = [bridge, DENIED, *(chain_name(i) for i in sandbox_ids)]
    names += [*domain_sets(f"*.{ZONE}"), *domain_sets(DENIED), *network_sets(f"*.{ZONE}", bridge)]
    processes = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=True).stdout
    folder = Path(backend.outbound.state.folder)
    files = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    filler = folder / "dns" / "deny-fill.conf"
    proxy_spaces = Path(backend.outbound.proxy.state_dir) / "spaces"
    return {
        "nft": [line.strip() for line in table_lines() if any(n in line for n in names)],
        "processes": [line for line in processes.splitlines() if bridge in line],
        "files": sorted(f for f in files if any(n in f for n in (bridge, *sandbox_ids))),
        "filler": [line for line in (filler.read_text().splitlines() if filler.exists() else []) if DENIED in line],
        "squid": sorted(p.name for p in proxy_spaces.glob("*.json") if network in p.name),
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="the packet filter and the resolvers run as root")
def test_a_released_network_leaves_no_rule_set_process_or_file(backend: DockerBackend, docker_base_image: str) -> None:
    space = f"release-{uuid.uuid4().hex[:8]}"
    network = backend.networks.space_network_name(space)
    rules = [{"domain": f"*.{ZONE}", "methods": ["GET"], "path_prefix": "/", "action": "allow"}]
    spec = NetworkSpec.parse(
        allow_internet_access=True,
        allow_public_traffic=False,
        allow_out=(f"*.{ZONE}",),
        deny_out=(DENIED,),
        l7_rules=rules if squid_available() else (),
    )
    before = host_state(backend, network, [])
    assert not any(before.values()), before
    made = []
    try:
        for _ in range(2):
            metadata = {"test-run": "release", META_SPACE: space}
            made.append(backend.create(SandboxSpec(template_id=docker_base_image, network=spec, metadata=metadata)))
        during = host_state(backend, network, [m.sandbox_id for m in made])
        # The state there is to remove: the bridge's elements and chains, the sets, the
        # resolver and its files, the deny filler's line, squid's entry.
        assert all(during[k] for k in ("nft", "processes", "files", "filler")), during
        assert bool(during["squid"]) == squid_available()
    finally:
        for sandbox in made:
            backend.delete(sandbox.sandbox_id)
    after = host_state(backend, network, [m.sandbox_id for m in made])
    assert after == before


@pytest.mark.skipif(os.geteuid() != 0, reason="the packet filter and the resolvers run as root")
def test_housekeeping_removes_what_a_network_removed_elsewhere_left(
    backend: DockerBackend, docker_base_image: str
) -> None:
    space = f"release-{uuid.uuid4().hex[:8]}"
    network = backend.networks.space_network_name(space)
    spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
    sandbox = backend.create(
        SandboxSpec(template_id=docker_base_image, network=spec, metadata={"test-run": "release", META_SPACE: space})
    )
    # Removed behind the console's back (by hand, a sweep of another process): no delete ran.
    backend.api.remove_container(sandbox.sandbox_id, force=True)
    backend.api.remove_network(network)
    assert host_state(backend, network, [sandbox.sandbox_id])["nft"]
    line = backend.outbound.housekeeping()
    assert line.startswith("egress housekeeping: pruned ")
    assert "released 0 network(s)" not in line
    assert not any(host_state(backend, network, [sandbox.sandbox_id]).values())


def test_reading_refusals_changes_nothing(backend: DockerBackend, tmp_path: Path) -> None:
    """refusals() is a read: a recorded sandbox whose container is gone is not pruned, an old
    gone record not dropped, no denied name resolved (housekeeping's work, not a read's)."""
    settings = EgressSettings.from_options(
        {
            "egress_state_dir": str(tmp_path),
            "proxy_state_dir": str(tmp_path / "proxy"),
            "host_firewall": "auto",
            "egress_log_max_bytes": "1024",
        }
    )
    egress = DockerEgress(backend.engine, backend.networks, settings)
    state = EgressState(str(tmp_path))
    with state.locked():
        pass  # the folder exists
    missing = "0" * 64
    spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, deny_out=(DENIED,))
    state.write(SandboxState.of(missing, "sbx-00000000000", ("172.30.9.2",), (), True, spec))
    old = tmp_path / "sandboxes" / f"{'1' * 64}.gone"
    old.write_text(json.dumps({"sandbox_id": "1" * 64, "bridge": "sbx-00000000000", "online": False}))
    os.utime(old, (0, 0))
    (tmp_path / "refusals.json").write_bytes(b"{}\n" * 1024)  # over the size set above
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert egress.refusals("")[0] == []
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    # Housekeeping does that work.
    line = egress.housekeeping()
    assert "pruned 1 sandbox(es)" in line, line
    assert not old.exists()
    assert "rotated 1 log(s)" in line, line
    assert (tmp_path / "refusals.json").stat().st_size == 0
    assert (tmp_path / "refusals.json.1").stat().st_size == 3 * 1024


def test_logs_are_rotated_by_size(tmp_path: Path) -> None:
    from sandboxes.backends.docker.egress.logs import rotate

    log = tmp_path / "sbx-x.log"
    log.write_bytes(b"x" * 2048)
    assert not rotate(str(log), 4096)
    assert rotate(str(log), 1024)
    assert log.stat().st_size == 0
    assert (tmp_path / "sbx-x.log.1").stat().st_size == 2048


@pytest.mark.skipif(os.geteuid() != 0, reason="the packet filter and the resolvers run as root")
def test_a_late_release_spares_the_network_made_again_under_the_same_name(
    backend: DockerBackend, docker_base_image: str
) -> None:
    """A delete removes the space's last sandbox and its network; before its `release` takes
    the state lock, a create of the same space makes the network again (same name, same
    bridge) and attaches a sandbox. The late release must not strip the new sandbox's chain
    and binding: its packets would then meet no chain of their own on a bridge no longer
    `managed`, and only the older console's rules (link-local, other bridges) would hold."""
    space = f"release-{uuid.uuid4().hex[:8]}"
    network = backend.networks.space_network_name(space)
    spec = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=(f"*.{ZONE}",))
    sandbox = backend.create(
        SandboxSpec(template_id=docker_base_image, network=spec, metadata={"test-run": "release", META_SPACE: space})
    )
    try:
        chain = chain_name(sandbox.sandbox_id)
        v4, v6 = backend.networks.subnets(network)[1], ()
        before = host_state(backend, network, [sandbox.sandbox_id])
        assert any(chain in line for line in before["nft"]), before
        backend.outbound.release(network, v4, v6)  # the late release of the earlier network
        after = host_state(backend, network, [sandbox.sandbox_id])
        # Its chain, binding, managed bridge and gateways, resolver and files: all kept.
        assert after == before
        assert backend.outbound.state.read(sandbox.sandbox_id) is not None
    finally:
        backend.delete(sandbox.sandbox_id)
    assert not any(host_state(backend, network, [sandbox.sandbox_id]).values())


@pytest.mark.skipif(os.geteuid() != 0, reason="the packet filter and the resolvers run as root")
def test_switching_outbound_off_releases_the_network_it_leaves(backend: DockerBackend, docker_base_image: str) -> None:
    """Outbound switched off live on a space's only sandbox: the sandbox leaves its network, so
    the network is released as at a delete (its bridge's elements, the sandbox's chain, the
    set copies, the resolver, the deny filler's line, squid's entry); switched on again, the
    sandbox gets all of it back."""
    space = f"release-{uuid.uuid4().hex[:8]}"
    network = backend.networks.space_network_name(space)
    rules = [{"domain": f"*.{ZONE}", "methods": ["GET"], "path_prefix": "/", "action": "allow"}]
    spec = NetworkSpec.parse(
        allow_internet_access=True,
        allow_public_traffic=False,
        allow_out=(f"*.{ZONE}",),
        deny_out=(DENIED,),
        l7_rules=rules if squid_available() else (),
    )
    before = host_state(backend, network, [])
    sandbox = backend.create(
        SandboxSpec(template_id=docker_base_image, network=spec, metadata={"test-run": "release", META_SPACE: space})
    )
    try:
        during = host_state(backend, network, [sandbox.sandbox_id])
        backend.outbound.update(
            sandbox.sandbox_id, NetworkSpec(allow_internet_access=False, allow_public_traffic=False)
        )
        off = host_state(backend, network, [sandbox.sandbox_id])
        assert off == before
        assert not backend.networks.exists(network)
        backend.outbound.update(sandbox.sandbox_id, spec)
        again = host_state(backend, network, [sandbox.sandbox_id])
        assert again.keys() == during.keys()
        # (the deny filler's file is shared by every backend of the host's state folder: not compared)
        assert {k: bool(again[k]) for k in ("nft", "processes", "files", "squid")} == {
            k: bool(during[k]) for k in ("nft", "processes", "files", "squid")
        }
        assert any(chain_name(sandbox.sandbox_id) in line for line in again["nft"])
    finally:
        backend.delete(sandbox.sandbox_id)
    assert host_state(backend, network, [sandbox.sandbox_id]) == before
