"""Hardened Docker sandboxes, proven from inside a sandbox as the session user (uid 1000).

Every destination here is a server this test starts on this machine: on the host's own
addresses (the space network's gateway, docker0, the uplink's address), in another space's
sandbox, on a dummy interface holding a link-local address, or in a network namespace the
test makes (the allowed control, and a link-local address reached through the host's forward
path). Nothing is ever sent to 169.254.169.254 or off the machine: tests/support/netns.py checks each
address is local or routed to the test's own namespace before it is handed out.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import docker
import pytest

from sandboxes.backends.base import (
    META_SPACE,
    BackendConfig,
    ErrorKind,
    ExecRequest,
    IdleMode,
    NetworkSpec,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
)
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import ROOT_CAPABILITIES
from sandboxes.backends.docker.egress.firewall import BRIDGE_PREFIX, TABLE_NAME, bridge_name, render_ruleset
from sandboxes.backends.docker.egress.rules import chain_name
from tests.support import egress_support
from tests.support.backend_conformance import OFFLINE, run
from tests.support.egress_support import (
    LISTENER_PORT,
    SandboxMaker,
    docker_backend,
    network_settings,
    sandbox_maker,
    start_listener,
)
from tests.support.netns import BannerServer, dummy_link_local, host_addresses, namespace

pytestmark = [pytest.mark.docker]

ONLINE = NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False)
# Linux capability numbers (capability.h) of the ones kept.
CAP_NUMBERS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7}
ENGINE_PORTS = (2375, 2376)
# Dropped (an older console's networks) or rejected with admin-prohibited (EHOSTUNREACH).
BLOCKED = ("timeout", "error 113")
# A dropped connection waits 2 s before it counts as "timeout".
probe = partial(egress_support.probe, timeout_s=2)


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str) -> Iterator[DockerBackend]:
    with docker_backend(test_run_id) as adapter:
        yield adapter


@pytest.fixture(scope="module")
def make_sandbox(backend: DockerBackend, docker_base_image: str, test_run_id: str) -> Iterator[SandboxMaker]:
    with sandbox_maker(backend, docker_base_image, test_run_id, prefix="space") as make:
        yield make


@pytest.fixture(scope="module")
def space_a() -> str:
    return f"space-a-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def sandbox_a(make_sandbox: SandboxMaker, space_a: str) -> SandboxInfo:
    return make_sandbox(ONLINE, space_a)


def as_user(backend: DockerBackend, sandbox_id: str, line: str) -> tuple[int, str]:
    result = backend.exec(sandbox_id, ExecRequest(shell=line, user="user", timeout_s=60))
    return result.exit_code, (result.stdout + result.stderr).decode(errors="replace")


def gateway_of(engine: docker.APIClient, sandbox_id: str) -> str:
    return str(network_settings(engine, sandbox_id)["Gateway"])


# Privileges -------------------------------------------------------------------------------


def test_only_the_named_capabilities_and_the_engines_default_profiles(
    backend: DockerBackend, sandbox_a: SandboxInfo, engine: docker.APIClient
) -> None:
    host_config = engine.inspect_container(sandbox_a.sandbox_id)["HostConfig"]
    assert host_config["CapDrop"] == ["ALL"]
    assert sorted(host_config["CapAdd"]) == sorted(ROOT_CAPABILITIES) == sorted(CAP_NUMBERS)
    assert host_config["SecurityOpt"] == ["no-new-privileges"]  # no seccomp/apparmor override
    assert not host_config["Privileged"]
    assert not host_config["Binds"]
    assert not engine.inspect_container(sandbox_a.sandbox_id)["Mounts"]
    status = dict(
        line.split(":\t", 1) for line in run(backend, sandbox_a.sandbox_id, "cat /proc/self/status").splitlines()
    )
    assert int(status["CapBnd"], 16) == sum(1 << n for n in CAP_NUMBERS.values())
    assert int(status["CapEff"], 16) == int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    assert status["Seccomp"].strip() == "2"  # the engine's default filter is on


def test_the_session_user_cannot_become_root_or_read_shadow(backend: DockerBackend, sandbox_a: SandboxInfo) -> None:
    sandbox_id = sandbox_a.sandbox_id
    # A setuid-root binary planted by the install path still runs as the user.
    root = backend.exec(
        sandbox_id, ExecRequest(shell="cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id", user="root")
    )
    assert root.exit_code == 0, root
    assert as_user(backend, sandbox_id, "/tmp/suid-id -u") == (0, "1000\n")
    refusals = {
        "su": "su -c id root < /dev/null",
        "sudo": "sudo -n id",
        "setuid": "python3 -c 'import os; os.setuid(0)'",
        "mount": "mount -t tmpfs none /mnt",
        "shadow": "cat /etc/shadow",
        "raw socket": "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
    }
    for what, line in refusals.items():
        code, output = as_user(backend, sandbox_id, line)
        assert code != 0, (what, output)
        assert "root:" not in output, what
    # Root itself lost what the install path does not need: no mounts, no raw sockets.
    for line in (
        "mount -t tmpfs none /mnt",
        "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'",
    ):
        assert backend.exec(sandbox_id, ExecRequest(shell=line, user="root")).exit_code != 0, line


def test_a_module_planted_in_the_workspace_never_runs_as_root(backend: DockerBackend, sandbox_a: SandboxInfo) -> None:
    """The adapter's own probes (list, stat) run python3 as root: isolated mode, from /."""
    sandbox_id = sandbox_a.sandbox_id
    planted = "import os\nopen('/tmp/planted-ran-as-%d' % os.geteuid(), 'w').close()\n"
    for module in ("json", "os", "stat"):
        code, _ = as_user(backend, sandbox_id, f"cat > /workspace/{module}.py << 'EOF'\n{planted}EOF")
        assert code == 0
    files = backend.files()
    files.list(sandbox_id, "/workspace")
    files.stat(sandbox_id, "/workspace/json.py")
    assert as_user(backend, sandbox_id, "ls /tmp | grep planted-ran || true") == (0, "")
    as_user(backend, sandbox_id, "rm -f /workspace/json.py /workspace/os.py /workspace/stat.py")


# The engine ---------------------------------------------------------------------------------


def test_the_engine_is_out_of_reach(backend: DockerBackend, sandbox_a: SandboxInfo, engine: docker.APIClient) -> None:
    sandbox_id = sandbox_a.sandbox_id
    _code, output = as_user(
        backend, sandbox_id, "ls -l /var/run/docker.sock /run/docker.sock 2>&1; grep -c docker.sock /proc/mounts"
    )
    assert "No such file" in output, output
    assert output.strip().endswith("0"), output
    targets = [
        (address, port) for address in {gateway_of(engine, sandbox_id), *host_addresses()} for port in ENGINE_PORTS
    ]
    answers = probe(backend, sandbox_id, targets)
    assert all(answer in (*BLOCKED, "refused") for answer in answers.values()), answers


# Networks -----------------------------------------------------------------------------------


def test_each_space_has_its_own_network_without_inter_container_traffic(
    backend: DockerBackend, sandbox_a: SandboxInfo, space_a: str, engine: docker.APIClient
) -> None:
    (name,) = engine.inspect_container(sandbox_a.sandbox_id)["NetworkSettings"]["Networks"]
    assert name == backend.space_network_name(space_a)
    network = engine.inspect_network(name)
    assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert network["Options"]["com.docker.network.bridge.name"] == bridge_name(name)
    assert bridge_name(name).startswith(BRIDGE_PREFIX)
    assert len(bridge_name(name)) <= 15
    # The space network's own resolver (dnsmasq on its gateway), never an outside one.
    assert engine.inspect_container(sandbox_a.sandbox_id)["HostConfig"]["Dns"] == [
        gateway_of(engine, sandbox_a.sandbox_id)
    ]


def test_other_sandboxes_of_any_space_are_unreachable(
    backend: DockerBackend, make_sandbox: SandboxMaker, sandbox_a: SandboxInfo, space_a: str, engine: docker.APIClient
) -> None:
    other_space = make_sandbox(ONLINE, f"space-b-{uuid.uuid4().hex[:8]}")
    same_space = make_sandbox(ONLINE, space_a)
    for server in (other_space, same_space):
        start_listener(backend, server.sandbox_id)
        # Control: the server answers inside its own sandbox.
        loopback = ("127.0.0.1", LISTENER_PORT)
        assert probe(backend, server.sandbox_id, [loopback]) == {f"127.0.0.1:{LISTENER_PORT}": "reached"}
    assert gateway_of(engine, other_space.sandbox_id) != gateway_of(engine, sandbox_a.sandbox_id)
    addresses = [network_settings(engine, server.sandbox_id)["IPAddress"] for server in (other_space, same_space)]
    targets = [(address, LISTENER_PORT) for address in addresses]
    answers = probe(backend, sandbox_a.sandbox_id, targets)
    assert all(answer != "reached" for answer in answers.values()), answers


def test_the_hosts_own_addresses_are_unreachable_but_allowed_outbound_works(
    backend: DockerBackend, sandbox_a: SandboxInfo, engine: docker.APIClient
) -> None:
    gateway = gateway_of(engine, sandbox_a.sandbox_id)
    addresses = sorted({gateway, *host_addresses()})
    with ExitStack() as stack, namespace() as allowed:
        servers = []
        for address in addresses:
            try:
                servers.append(stack.enter_context(BannerServer(address)))
            except OSError:  # another run's network went away since it was listed
                assert address != gateway
        outside = stack.enter_context(allowed.run(lambda: BannerServer(allowed.address)))
        answers = probe(backend, sandbox_a.sandbox_id, [(s.host, s.port) for s in [*servers, outside]])
        assert answers.pop(f"{outside.host}:{outside.port}") == "reached"  # outbound still works
        assert answers
        assert all(answer in BLOCKED for answer in answers.values()), answers
        assert all(not server.clients for server in servers)


def test_link_local_addresses_are_unreachable(backend: DockerBackend, sandbox_a: SandboxInfo) -> None:
    """On the host (a dummy interface: input path) and behind it (a namespace: forward path)."""
    forwarded = f"169.254.171.{random.randint(2, 250)}"
    with (
        dummy_link_local() as local,
        BannerServer(local) as on_host,
        namespace(address=forwarded) as behind,
        behind.run(lambda: BannerServer(behind.address)) as routed,
    ):
        control = probe(backend, sandbox_a.sandbox_id, [(behind.host_address, 9)])
        assert next(iter(control.values())) in BLOCKED  # the veth's host end is a host address too
        answers = probe(backend, sandbox_a.sandbox_id, [(local, on_host.port), (forwarded, routed.port)])
        assert all(answer in BLOCKED for answer in answers.values()), answers
        assert not on_host.clients
        assert not routed.clients


# The ruleset --------------------------------------------------------------------------------


def test_the_ruleset_is_in_force_and_applying_it_again_changes_nothing(
    backend: DockerBackend, sandbox_a: SandboxInfo
) -> None:
    def listed() -> str:
        # The fixed chains and this sandbox's own: other runs' sandboxes come and go meanwhile.
        chains = ["input", "sandbox_to_host", "forward", "sandbox_forward", chain_name(sandbox_a.sandbox_id)]
        text = ""
        for chain in chains:
            done = subprocess.run(
                ["nft", "list", "chain", "inet", TABLE_NAME, chain], capture_output=True, text=True, check=True
            )
            text += done.stdout
        element = subprocess.run(
            ["nft", "-j", "list", "map", "inet", TABLE_NAME, "sandboxes_v4"], capture_output=True, text=True, check=True
        )
        mine = "jump" in element.stdout and chain_name(sandbox_a.sandbox_id) in element.stdout
        # Counters move with traffic; the rules themselves must not.
        return re.sub(r"counter packets \d+ bytes \d+ ", "", text) + f"bound: {mine}"

    before = listed()
    assert before.endswith("bound: True")
    assert f'iifname "{BRIDGE_PREFIX}*" jump sandbox_to_host' in before
    assert "169.254.0.0/16" in before
    assert "fe80::/10" in before
    assert render_ruleset() == render_ruleset()
    fresh = DockerBackend(BackendConfig(kind="docker"))
    fresh.outbound.ensure_firewall()
    assert listed() == before
    assert fresh.outbound.status().startswith("nftables table inet sandbox_console in force; resolver upstream: ")
    # Flushed behind the console's back (a firewall reload): reported, then loaded again
    # before the next online sandbox.
    subprocess.run(["nft", "delete", "table", "inet", TABLE_NAME], check=True)
    try:
        assert fresh.outbound.status().startswith("NOT in force: the table inet sandbox_console is not loaded")
    finally:
        fresh.outbound.ensure_firewall()
    assert listed() == before
    subprocess.run(["nft", "-f", "-"], input=render_ruleset(), text=True, check=True)  # idempotent
    assert listed() == before
    fresh.close()


def test_without_root_the_ruleset_is_reported_not_applied() -> None:
    # The module is standard library only: run a copy from a folder the unprivileged user can
    # read (the checkout may sit in a folder only root may enter, as CI's clone can).
    folder = Path(tempfile.mkdtemp(prefix="console-firewall-"))
    try:
        folder.chmod(0o755)
        firewall = Path(__file__).resolve().parents[4] / "sandboxes" / "backends" / "docker" / "egress" / "firewall.py"
        shutil.copy(firewall, folder / "console_firewall.py")
        (folder / "console_firewall.py").chmod(0o644)
        script = (
            f"import sys; sys.path.insert(0, {str(folder)!r})\n"
            "from console_firewall import apply_ruleset, render_ruleset\n"
            "result = apply_ruleset(render_ruleset()); print(result.applied, result.detail)"
        )
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-I", "-c", script],
            capture_output=True,
            text=True,
            cwd="/",
            check=False,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.stdout.startswith("False "), done
    assert "does not run as root" in done.stdout


def test_a_remote_engine_gets_no_online_sandbox_until_its_host_filters(docker_base_image: str) -> None:
    remote = DockerBackend(BackendConfig(kind="docker", endpoint="tcp://127.0.0.1:9"))
    assert remote.outbound.status().startswith("NOT in force")
    with pytest.raises(RemoteError) as caught:
        remote.create(SandboxSpec(template_id=docker_base_image, network=ONLINE, metadata={}))
    assert caught.value.kind == ErrorKind.UNSUPPORTED
    assert "host_firewall=external" in caught.value.message
    external = DockerBackend(
        BackendConfig(kind="docker", endpoint="tcp://127.0.0.1:9", options={"host_firewall": "external"})
    )
    assert "outside the console" in external.outbound.status()
    with pytest.raises(RemoteError) as caught:
        DockerBackend(BackendConfig(kind="docker", options={"host_firewall": "off"}))
    assert caught.value.kind == ErrorKind.INVALID


def test_offline_sandboxes_stay_without_a_network(make_sandbox: SandboxMaker, backend: DockerBackend) -> None:
    offline = make_sandbox(OFFLINE, f"space-c-{uuid.uuid4().hex[:8]}")
    assert run(backend, offline.sandbox_id, "ls /sys/class/net").split() == ["lo"]


@pytest.mark.parametrize("volume", ["/etc", "/var/run/docker.sock", "./here", "../up"])
def test_a_host_path_is_never_mounted_as_the_workspace(
    backend: DockerBackend, docker_base_image: str, test_run_id: str, engine: docker.APIClient, volume: str
) -> None:
    marker = {"test-run": test_run_id, "case": uuid.uuid4().hex}
    with pytest.raises(RemoteError) as caught:
        backend.create(
            SandboxSpec(template_id=docker_base_image, network=OFFLINE, metadata=marker, workspace_volume=volume)
        )
    assert caught.value.kind == ErrorKind.INVALID
    assert engine.containers(all=True, filters={"label": f"console.meta.case={marker['case']}"}) == []


def test_a_space_network_lives_as_long_as_a_sandbox_is_on_it(
    docker_base_image: str, test_run_id: str, engine: docker.APIClient
) -> None:
    """Docker's address pools hold a few dozen networks: an unused space network goes."""
    space = f"space-d-{uuid.uuid4().hex[:8]}"
    metadata = {"test-run": test_run_id, META_SPACE: space}
    with docker_backend(test_run_id, idle_mode=IdleMode.STOP) as stopping:
        name = stopping.space_network_name(space)
        first, second = (
            stopping.create(SandboxSpec(template_id=docker_base_image, network=ONLINE, metadata=metadata)) for _ in "12"
        )
        try:
            assert stopping.pause(second.sandbox_id).state == SandboxState.STOPPED
            stopping.delete(first.sandbox_id)
            assert engine.networks(names=[name])  # the stopped one still needs it to resume
            assert stopping.connect(second.sandbox_id).state == SandboxState.RUNNING
            assert run(stopping, second.sandbox_id, "cat /sys/class/net/eth0/operstate") == "up\n"
        finally:
            stopping.delete(second.sandbox_id)
        assert [n for n in engine.networks(names=[name]) if n["Name"] == name] == []
        again = stopping.create(SandboxSpec(template_id=docker_base_image, network=ONLINE, metadata=metadata))
        stopping.delete(again.sandbox_id)
