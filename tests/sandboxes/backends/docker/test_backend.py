"""The Docker backend against the real engine: the conformance suite plus Docker's own rules.

Every container, image and volume carries this run's label and is swept at session end
(tests/sandboxes/conftest.py). Sandboxes run with network "none" unless a test needs the
managed bridge, and always with DNS 127.0.0.1: nothing here leaves the machine.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

import docker
import pytest

from netpolicy import PolicyError
from sandboxes.backends.base import (
    BackendConfig,
    ErrorKind,
    ExecRequest,
    IdleMode,
    ListQuery,
    NetworkCapabilities,
    NetworkSpec,
    PtySize,
    RemoteError,
    Resources,
    SandboxSpec,
    SandboxState,
    TemplateBuildSpec,
)
from sandboxes.backends.capabilities import PtyHandle
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import _KILL_GROUP
from sandboxes.backends.docker.egress.proxy import squid_available
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.backend_conformance import (
    BackendConformance,
    SandboxFactory,
    run,
    sandbox_factory,
    shell_request,
)

pytestmark = [pytest.mark.docker]


# Records, as uid 1000, every file created, moved in, written or changed in any folder uid 1000
# can write (inotify: IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE), one path a
# line in $1/events; $1/ready lists the folders once they are watched. $1 itself is not watched.
WATCHER = """
import ctypes, os, struct, sys
own = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
folders = {}
for top, subs, _ in os.walk("/"):
    subs[:] = [s for s in subs if os.path.join(top, s) not in ("/proc", "/sys", own)]
    if os.access(top, os.W_OK):
        wd = libc.inotify_add_watch(fd, top.encode(), 0x2 | 0x4 | 0x8 | 0x80 | 0x100)
        assert wd >= 0, (top, ctypes.get_errno())
        folders[wd] = top
events = open(os.path.join(own, "events"), "a", buffering=1)
with open(os.path.join(own, "listed"), "w") as listed:
    listed.write("\\n".join(sorted(folders.values())) + "\\n")
os.rename(os.path.join(own, "listed"), os.path.join(own, "ready"))
while True:
    data, at = os.read(fd, 65536), 0
    while at < len(data):
        wd, _, _, length = struct.unpack_from("iIII", data, at)
        name = data[at + 16 : at + 16 + length].rstrip(b"\\0").decode(errors="replace")
        at += 16 + length
        events.write(os.path.join(folders[wd], name) + "\\n")
"""
# Starts WATCHER ($0) in the background with its own folder; prints the folders it watches.
START_WATCHER = (
    'mkdir -m 700 /tmp/.watch && (setsid python3 -c "$0" /tmp/.watch > /dev/null 2>&1 < /dev/null &)'
    "; for i in $(seq 200); do [ -e /tmp/.watch/ready ] && exec cat /tmp/.watch/ready; sleep 0.05; done; exit 1"
)


# As uid 1000: links every absolute path ending in .pid that appears in any process's command line
# to /etc/console-victim, as soon as the process shows up (for 60 s); $1/ready once it scans.
PID_FILE_RACER = """
import os, re, sys, time
seen = set()
path = re.compile(rb"/[A-Za-z0-9_./-]+[.]pid")
end = time.time() + 60
open(os.path.join(sys.argv[1], "ready"), "w").close()
while time.time() < end:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid in seen:
            continue
        seen.add(pid)
        try:
            found = path.findall(open("/proc/%s/cmdline" % pid, "rb").read())
        except OSError:
            continue
        for link in found:
            try:
                os.symlink("/etc/console-victim", link)
            except OSError:
                pass
"""


@pytest.fixture(scope="module")
def template_id(docker_base_image: str) -> str:
    return docker_base_image


@pytest.fixture(scope="module")
def backend(docker_base_image: str, test_run_id: str) -> Iterator[DockerBackend]:
    config = BackendConfig(kind="docker", options={"network": docker_test_network_name(test_run_id)})
    adapter = DockerBackend(config)
    yield adapter
    adapter.close()


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.DockerClient]:
    client = docker.from_env(timeout=60)
    yield client
    client.close()


class TestDockerConformance(BackendConformance):
    """The shared contract, run against the local engine."""


# Docker-specific behaviour ---------------------------------------------------------------


class TestDockerBackend:
    """Process groups, idle modes, networks, limits, templates and terminals on Docker."""

    @pytest.fixture(scope="class")
    def make_sandbox(self, backend: DockerBackend, template_id: str, test_run_id: str) -> Iterator[SandboxFactory]:
        with sandbox_factory(backend, template_id, test_run_id) as make:
            yield make

    def test_timeout_kills_the_process_group_inside_the_container(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        result = backend.exec(info.sandbox_id, shell_request("sleep 301 & (sleep 302 &) ; sleep 303", timeout_s=1))
        assert result.timed_out
        left = run(backend, info.sandbox_id, "ps -eo args | grep '^sleep 30' || true")
        assert left == ""

    def test_a_timeout_kills_its_own_group_only_and_leaves_no_file(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        info = make_sandbox()
        before = run(backend, info.sandbox_id, "ls -A /tmp /run", user="root")
        run(backend, info.sandbox_id, "setsid sleep 401 > /dev/null 2>&1 < /dev/null &")
        result = backend.exec(info.sandbox_id, shell_request("sleep 402 & sleep 403", timeout_s=1))
        assert result.timed_out
        left = run(backend, info.sandbox_id, "ps -eo args | grep '^sleep 40' || true")
        assert left == "sleep 401\n"  # another group: untouched; the timed-out exec's: killed
        assert run(backend, info.sandbox_id, "ls -A /tmp /run", user="root") == before

    def test_a_root_exec_writes_nothing_where_the_user_can_write(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        """A file a root exec's machinery wrote in a folder uid 1000 can write (a pid file in
        /tmp, say) is a path the user can plant a link at for root to write through (the
        host's fs.protected_symlinks may be 0). Watched with inotify as uid 1000 in every such
        folder, root execs (plain, fed stdin, timed out and so killed by a second root exec)
        create and change nothing there, whether or not they remove it afterwards; the
        watcher does see the one file a root command writes there on purpose."""
        info = make_sandbox()
        started = backend.exec(info.sandbox_id, ExecRequest(argv=("sh", "-c", START_WATCHER, WATCHER)))
        assert started.exit_code == 0, started
        watched = started.stdout.decode().split()
        assert {"/tmp", "/workspace", "/dev/shm"} <= set(watched), watched
        assert run(backend, info.sandbox_id, "true", user="root") == ""
        assert backend.exec(info.sandbox_id, ExecRequest(argv=("cat",), user="root", stdin=b"fed")).stdout == b"fed"
        assert backend.exec(info.sandbox_id, shell_request("sleep 407", user="root", timeout_s=1)).timed_out
        assert "sleep 407" not in run(backend, info.sandbox_id, "ps -eo args", user="root")
        run(backend, info.sandbox_id, "echo on purpose > /tmp/written-by-root", user="root")
        events = run(
            backend,
            info.sandbox_id,
            "for i in $(seq 100); do grep -qx /tmp/written-by-root /tmp/.watch/events && break; sleep 0.05; done;"
            " sort -u /tmp/.watch/events",
            user="root",
        )
        assert events.split() == ["/tmp/written-by-root"]

    def test_a_root_kill_skips_a_users_process_carrying_the_mark(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        # A root exec's mark is in its command line, which uid 1000 can read: a user process
        # may carry a copy, in a `timeout` leading its own group. Root's killer is not theirs.
        info = make_sandbox()
        mark = "9.000123456789012345"
        run(backend, info.sandbox_id, f"setsid timeout -s KILL {mark} sleep 406 > /dev/null 2>&1 < /dev/null &")
        backend.exec(info.sandbox_id, ExecRequest(argv=("/bin/sh", "-c", _KILL_GROUP, mark), user="root"))
        assert "sleep 406" in run(backend, info.sandbox_id, "ps -eo args")
        backend.exec(info.sandbox_id, ExecRequest(argv=("/bin/sh", "-c", _KILL_GROUP, mark)))  # the user's own
        assert "sleep 406" not in run(backend, info.sandbox_id, "ps -eo args")

    def test_idle_mode_stop_keeps_files_but_not_processes(
        self, template_id: str, test_run_id: str, make_sandbox: SandboxFactory
    ) -> None:
        stopping = DockerBackend(BackendConfig(kind="docker", idle_mode=IdleMode.STOP))
        info = make_sandbox(adapter=stopping)
        run(stopping, info.sandbox_id, "echo kept > /workspace/kept.txt")
        run(stopping, info.sandbox_id, "setsid nohup sleep 1000 > /dev/null 2>&1 < /dev/null &")
        assert stopping.pause(info.sandbox_id).state == SandboxState.STOPPED
        assert stopping.pause(info.sandbox_id).state == SandboxState.STOPPED
        assert stopping.connect(info.sandbox_id).state == SandboxState.RUNNING
        assert run(stopping, info.sandbox_id, "cat /workspace/kept.txt") == "kept\n"
        assert "sleep 1000" not in run(stopping, info.sandbox_id, "ps -eo args")
        stopping.close()

    def test_pause_is_idempotent_and_reads_a_changed_state_back(
        self, backend: DockerBackend, make_sandbox: SandboxFactory, engine: docker.DockerClient
    ) -> None:
        # pause skips the inspect for a sandbox it has seen; what the engine refuses sends it
        # back to looking at the real state.
        info = make_sandbox()
        assert backend.pause(info.sandbox_id) == dataclasses.replace(info, state=SandboxState.PAUSED)
        assert backend.pause(info.sandbox_id).state == SandboxState.PAUSED  # already paused: 409, then a look
        engine.api.unpause(info.sandbox_id)
        engine.api.stop(info.sandbox_id, timeout=1)  # stopped behind the backend's back
        assert backend.pause(info.sandbox_id).state == SandboxState.STOPPED
        engine.api.remove_container(info.sandbox_id, force=True)
        with pytest.raises(RemoteError) as caught:
            backend.pause(info.sandbox_id)
        assert caught.value.kind == ErrorKind.NOT_FOUND

    def test_exec_on_a_paused_sandbox_is_a_conflict(self, backend: DockerBackend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        assert backend.pause(info.sandbox_id).state == SandboxState.PAUSED
        with pytest.raises(RemoteError) as caught:
            backend.exec(info.sandbox_id, ExecRequest(argv=("true",)))
        assert caught.value.kind == ErrorKind.CONFLICT

    def test_offline_sandboxes_have_no_network_and_online_ones_a_managed_bridge(
        self, backend: DockerBackend, make_sandbox: SandboxFactory, engine: docker.DockerClient
    ) -> None:
        offline = make_sandbox()
        online = make_sandbox(network=NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False))
        assert run(backend, offline.sandbox_id, "ls /sys/class/net").split() == ["lo"]
        assert "eth0" in run(backend, online.sandbox_id, "ls /sys/class/net").split()
        networks = engine.api.inspect_container(online.sandbox_id)["NetworkSettings"]["Networks"]
        assert list(networks) == [backend.space_network_name("")]  # no space in its metadata
        # The resolver is the space network's own dnsmasq on its gateway; never an outside one.
        (endpoint,) = networks.values()
        assert engine.api.inspect_container(online.sandbox_id)["HostConfig"]["Dns"] == [endpoint["Gateway"]]
        assert engine.api.inspect_container(offline.sandbox_id)["HostConfig"]["Dns"] == ["127.0.0.1"]
        assert "nameserver 127.0.0.1" in run(backend, offline.sandbox_id, "cat /etc/resolv.conf")
        # On a user-defined network the engine's embedded DNS forwards to it.
        assert "nameserver 127.0.0.11" in run(backend, online.sandbox_id, "cat /etc/resolv.conf")

    def test_network_rules_docker_cannot_honour_are_refused(self, template_id: str, test_run_id: str) -> None:
        # An entry that is no destination never reaches the adapter: the spec is typed.
        with pytest.raises(PolicyError):
            NetworkSpec.parse(allow_internet_access=True, allow_public_traffic=False, allow_out=("not a destination!",))
        # Lists on an engine whose packet filter the console does not apply: refused, nothing made.
        external = DockerBackend(BackendConfig(kind="docker", options={"host_firewall": "external"}))
        marker = {"test-run": test_run_id, "console-session": f"refused-{uuid.uuid4().hex[:8]}"}
        network = NetworkSpec.parse(
            allow_internet_access=True, allow_public_traffic=False, allow_out=("203.0.113.0/24",)
        )
        try:
            with pytest.raises(RemoteError) as caught:
                external.create(SandboxSpec(template_id=template_id, network=network, metadata=marker))
            assert caught.value.kind == ErrorKind.UNSUPPORTED
            assert external.list(ListQuery(metadata=marker)).items == ()
        finally:
            external.close()

    def test_network_capabilities_are_what_the_local_engine_enforces(self, backend: DockerBackend) -> None:
        caps = backend.network_capabilities()
        assert caps.outbound_toggle
        assert caps.inbound_toggle  # through the console's own proxy (test_inbound.py)
        assert (
            caps.l7_rules == squid_available()
        )  # HTTP rules: tests/sandboxes/backends/docker/egress/test_http_rules.py
        assert caps.allow_out_cidr
        assert caps.allow_out_domain
        assert caps.deny_out_cidr
        assert caps.deny_out_domain
        assert caps.live_update
        assert backend.inbound() is not None
        remote = DockerBackend(BackendConfig(kind="docker", endpoint="tcp://127.0.0.1:9"))
        assert remote.network_capabilities() == NetworkCapabilities(outbound_toggle=True, inbound_toggle=True)
        assert remote.egress() is None

    def test_resource_limits_reach_the_engine(self, make_sandbox: SandboxFactory, engine: docker.DockerClient) -> None:
        info = make_sandbox(resources=Resources(cpus=0.5, memory_mb=256, pids=64))
        host_config = engine.api.inspect_container(info.sandbox_id)["HostConfig"]
        assert host_config["NanoCpus"] == 500_000_000
        assert host_config["Memory"] == 256 * 1024 * 1024
        assert host_config["PidsLimit"] == 64

    def test_labels_carry_metadata_and_console_markers(
        self, make_sandbox: SandboxFactory, engine: docker.DockerClient
    ) -> None:
        info = make_sandbox(metadata={"console-space": "space-1"})
        labels = engine.api.inspect_container(info.sandbox_id)["Config"]["Labels"]
        assert labels["console.managed"] == "1"
        assert labels["console.kind"] == "sandbox"
        assert labels["console.meta.console-space"] == "space-1"
        assert engine.api.inspect_container(info.sandbox_id)["Path"] == "/usr/bin/tini"

    def test_unreachable_engine_is_unavailable(self) -> None:
        adapter = DockerBackend(BackendConfig(kind="docker", endpoint="unix:///tmp/no-such-docker.sock"))
        with pytest.raises(RemoteError) as caught:
            adapter.list(ListQuery())
        assert caught.value.kind == ErrorKind.UNAVAILABLE
        assert caught.value.retryable
        health = adapter.health()
        assert not health.ok
        assert health.detail

    def test_huge_output_is_truncated_not_buffered(self, backend: DockerBackend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        cap = 64 * 1024
        result = backend.exec(
            info.sandbox_id,
            shell_request("head -c 200000000 /dev/zero; echo done >&2", max_output_bytes=cap, timeout_s=60),
        )
        assert result.exit_code == 0
        assert result.truncated
        assert len(result.stdout) == cap
        assert result.stderr == b"done\n"

    def test_workspace_volume_outlives_its_sandbox(
        self, backend: DockerBackend, make_sandbox: SandboxFactory, test_run_id: str
    ) -> None:
        volume = f"sandbox-console-test-{uuid.uuid4().hex[:10]}"
        first = make_sandbox(workspace_volume=volume)
        run(backend, first.sandbox_id, "echo persisted > /workspace/state.txt")
        backend.delete(first.sandbox_id)
        second = make_sandbox(workspace_volume=volume)
        assert run(backend, second.sandbox_id, "cat /workspace/state.txt; stat -c %u /workspace") == (
            "persisted\n1000\n"
        )
        volumes = backend.volumes()
        with pytest.raises(RemoteError) as caught:
            volumes.delete(volume)
        assert caught.value.kind == ErrorKind.CONFLICT
        backend.delete(second.sandbox_id)
        volumes.delete(volume)
        volumes.delete(volume)

    def test_an_image_with_several_names_is_listed_under_each(
        self, backend: DockerBackend, engine: docker.DockerClient, template_id: str, test_run_id: str
    ) -> None:
        """A template image an admin also tagged (pushed to a registry, say) stays offered under
        its own name, and the other name is a template too."""
        other = f"sandbox-console/also-{test_run_id}:latest"
        engine.images.get(template_id).tag(other)
        try:
            listed = {item.template_id for item in backend.templates().list()}
            assert {template_id, other} <= listed
        finally:
            engine.images.remove(other)

    def test_templates_list_excludes_snapshots(
        self, backend: DockerBackend, make_sandbox: SandboxFactory, template_id: str, test_run_id: str
    ) -> None:
        templates, snapshots = backend.templates(), backend.snapshots()
        snapshot = snapshots.create(make_sandbox().sandbox_id, labels={"test-run": test_run_id})
        try:
            listed = templates.list()
            assert template_id in {item.template_id for item in listed}
            assert all(not item.template_id.startswith("snap-") for item in listed)
            assert all(item.labels.get("console.kind") == "template" for item in listed)
            with pytest.raises(RemoteError) as caught:
                templates.get(snapshot.snapshot_id)
            assert caught.value.kind == ErrorKind.NOT_FOUND
        finally:
            snapshots.delete(snapshot.snapshot_id)

    def test_a_sandbox_from_a_snapshot_carries_its_own_labels_not_the_sources(
        self, backend: DockerBackend, make_sandbox: SandboxFactory, engine: docker.DockerClient, test_run_id: str
    ) -> None:
        """A build sandbox's purpose does not follow its snapshot into sessions (docker ps filters)."""
        build = make_sandbox(metadata={"console-purpose": "skill-build", "console-skill-image": "42"})
        snapshot = backend.snapshots().create(build.sandbox_id, labels={"test-run": test_run_id})
        try:
            session = make_sandbox(template_id=snapshot.snapshot_id, metadata={"console-session": "s-1"})
            assert backend.get(session.sandbox_id).metadata == {"test-run": test_run_id, "console-session": "s-1"}
            labels = engine.containers.get(session.sandbox_id).labels
            assert labels["console.meta.console-session"] == "s-1"
            assert labels.get("console.meta.console-purpose", "") == ""
            assert labels.get("console.meta.console-skill-image", "") == ""
            leftovers = engine.containers.list(filters={"label": "console.meta.console-purpose=skill-build"})
            assert session.sandbox_id not in {c.id for c in leftovers}
            assert build.sandbox_id in {c.id for c in leftovers}
        finally:
            backend.delete(session.sandbox_id)
            backend.snapshots().delete(snapshot.snapshot_id)

    def test_template_from_script_and_delete_refused_while_in_use(
        self, backend: DockerBackend, make_sandbox: SandboxFactory, template_id: str, test_run_id: str
    ) -> None:
        templates = backend.templates()
        name = f"test-{uuid.uuid4().hex[:8]}"
        built = templates.create(
            TemplateBuildSpec(
                name=name,
                base_template_id=template_id,
                script="echo baked > /opt/baked.txt && chmod 644 /opt/baked.txt",
                labels={"test-run": test_run_id},
            )
        )
        try:
            assert built.name == name
            assert built.template_id in {t.template_id for t in templates.list()}
            user = make_sandbox(template_id=built.template_id)
            assert run(backend, user.sandbox_id, "cat /opt/baked.txt; id -u") == "baked\n1000\n"
            with pytest.raises(RemoteError) as caught:
                templates.delete(built.template_id)
            assert caught.value.kind == ErrorKind.CONFLICT
            backend.delete(user.sandbox_id)
        finally:
            templates.delete(built.template_id)
        templates.delete(built.template_id)
        with pytest.raises(RemoteError) as caught:
            templates.get(built.template_id)
        assert caught.value.kind == ErrorKind.NOT_FOUND

    def test_failed_template_script_is_invalid_and_leaves_no_build_container(
        self, backend: DockerBackend, engine: docker.DockerClient, test_run_id: str
    ) -> None:
        with pytest.raises(RemoteError) as caught:
            backend.templates().create(
                TemplateBuildSpec(
                    name=f"test-{uuid.uuid4().hex[:8]}", script="exit 3", labels={"test-run": test_run_id}
                )
            )
        assert caught.value.kind == ErrorKind.INVALID
        assert engine.api.containers(all=True, filters={"label": f"test-run={test_run_id}"}) == []

    def test_file_owners_and_error_kinds(self, backend: DockerBackend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        files = backend.files()
        files.write(info.sandbox_id, "/opt/owned-by-root.txt", b"x", user="root")
        files.write(info.sandbox_id, "/workspace/new/dir/owned-by-user.txt", b"y")
        owners = run(backend, info.sandbox_id, "stat -c %u /opt/owned-by-root.txt /workspace/new/dir/owned-by-user.txt")
        assert owners.split() == ["0", "1000"]
        expected = [
            (lambda: files.make_dir(info.sandbox_id, "/root/not-yours"), ErrorKind.FORBIDDEN),
            (lambda: files.remove(info.sandbox_id, "/workspace/missing"), ErrorKind.NOT_FOUND),
            (lambda: files.read(info.sandbox_id, "/workspace"), ErrorKind.INVALID),
            (lambda: files.list(info.sandbox_id, "/opt/owned-by-root.txt"), ErrorKind.INVALID),
            (lambda: files.write(info.sandbox_id, "/", b""), ErrorKind.INVALID),
            (lambda: files.stat(info.sandbox_id, "workspace"), ErrorKind.INVALID),
        ]
        for call, kind in expected:
            with pytest.raises(RemoteError) as caught:
                call()
            assert caught.value.kind == kind, caught.value

    def test_pty_of_a_command_that_ends_at_once_still_opens(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        """The first resize races the command's end; the output must still be readable."""
        info = make_sandbox()
        ptys = backend.pty()
        assert ptys is not None
        for _ in range(5):  # the race is timing-dependent: try it a few times
            handle = ptys.open(info.sandbox_id, PtySize(cols=80, rows=24), command=("echo", "quick"))
            try:
                assert b"quick" in _read_until(handle, b"quick")
            finally:
                handle.kill()

    def test_pty_runs_a_shell_resizes_and_is_killed(self, backend: DockerBackend, make_sandbox: SandboxFactory) -> None:
        info = make_sandbox()
        terminal = backend.pty().open(info.sandbox_id, PtySize(cols=100, rows=30))
        try:
            assert terminal.fileno() is not None
            terminal.write(b"stty size; echo marker-$((40+2))\n")
            output = _read_until(terminal, b"marker-42")
            assert b"30 100" in output
            terminal.resize(PtySize(cols=120, rows=40))
            terminal.write(b"stty size\n")
            assert b"40 120" in _read_until(terminal, b"40 120")
            assert terminal.is_running()
        finally:
            terminal.kill()
        _wait_ended(terminal)
        terminal.kill()  # idempotent

    def test_pty_kill_takes_only_a_process_id_from_the_users_pid_file(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        """The terminal's pid file is the session user's to rewrite; root's kill must not
        signal what it names when that is not one process (-1 is every process)."""
        info = make_sandbox()
        started = backend.exec(
            info.sandbox_id, ExecRequest(shell="setsid sleep 300 > /dev/null 2>&1 & echo $! > /tmp/victim.pid")
        )
        assert started.exit_code == 0, started
        root_started = backend.exec(
            info.sandbox_id,
            ExecRequest(shell="setsid sleep 300 > /dev/null 2>&1 & echo $! > /run/root-victim.pid", user="root"),
        )
        assert root_started.exit_code == 0, root_started
        for named in ("-1", "$(cat /run/root-victim.pid)", "1"):
            terminal = backend.pty().open(info.sandbox_id, PtySize(cols=80, rows=24))
            try:
                terminal.write(f"echo {named} > /tmp/.console-pty/*.pid; echo marker-$((40+2))\n".encode())
                _read_until(terminal, b"marker-42")
            finally:
                terminal.kill()
            alive = backend.exec(
                info.sandbox_id,
                ExecRequest(shell='kill -0 "$(cat /tmp/victim.pid)" && ps -o pid= -p "$(cat /run/root-victim.pid)"'),
            )
            assert alive.exit_code == 0, f"the terminal kill signalled {named}: {alive}"

    def test_a_root_terminal_never_writes_through_a_link_the_user_plants(
        self, backend: DockerBackend, make_sandbox: SandboxFactory
    ) -> None:
        """A terminal records its shell's pid in a file named in its command line; a root one
        must not write it where uid 1000 can plant a link (the host's fs.protected_symlinks
        may be 0). A racer as uid 1000 links every pid-file path it sees in a new process's
        command line to a root-owned file while root terminals are opened, used and closed:
        the file stays as it was, and each terminal still ends when killed."""
        info = make_sandbox()
        assert run(backend, info.sandbox_id, "echo original > /etc/console-victim", user="root") == ""
        started = backend.exec(
            info.sandbox_id,
            ExecRequest(
                argv=(
                    "sh",
                    "-c",
                    'mkdir -m 700 /tmp/.racer && (setsid python3 -c "$0" /tmp/.racer > /dev/null 2>&1 < /dev/null &)'
                    "; for i in $(seq 200); do [ -e /tmp/.racer/ready ] && exit 0; sleep 0.05; done; exit 1",
                    PID_FILE_RACER,
                )
            ),
        )
        assert started.exit_code == 0, started
        for _ in range(20):
            terminal = backend.pty().open(info.sandbox_id, PtySize(cols=80, rows=24), user="root")
            try:
                terminal.write(b"echo uid-$(id -u) marker-$((40+2))\n")
                assert b"uid-0 marker-42" in _read_until(terminal, b"uid-0 marker-42")
            finally:
                terminal.kill()
            _wait_ended(terminal)
        assert run(backend, info.sandbox_id, "cat /etc/console-victim", user="root") == "original\n"


def _wait_ended(terminal: PtyHandle, within: float = 5) -> None:
    """Until the terminal (killed) no longer runs; fails past `within` seconds."""
    deadline = time.monotonic() + within
    while terminal.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not terminal.is_running()


def _read_until(terminal: object, needle: bytes, timeout: float = 10) -> bytes:
    assert isinstance(terminal, PtyHandle)
    output = b""
    deadline = time.monotonic() + timeout
    while needle not in output and time.monotonic() < deadline:
        output += terminal.read(timeout=max(deadline - time.monotonic(), 0.01))
    assert needle in output, output
    return output


def test_base_image_is_rebuilt_only_when_its_recipe_changes(
    docker_base_image: str, engine: docker.DockerClient
) -> None:
    from sandboxes.backends.docker.image import LABEL_RECIPE, base_recipe, build_base_image

    image = engine.images.get(docker_base_image)
    assert image.labels[LABEL_RECIPE] == base_recipe()
    assert build_base_image(client=engine) == image.id  # same recipe: nothing built
    probe = engine.containers.run(
        docker_base_image,
        ["sh", "-c", "for c in vim top less python3 tmux; do command -v $c; done"],
        network_mode="none",
        remove=True,
    )
    assert probe.decode().split() == [
        "/usr/local/bin/vim",
        "/usr/bin/top",
        "/usr/bin/less",
        "/usr/bin/python3",
        "/usr/bin/tmux",  # keeps web-terminal shells (sandboxes/terminal/keeper.py)
    ]
    # An image of the same recipe digest that lacks an added package is not current.
    from sandboxes.backends.docker.image import LABEL_PACKAGES, image_is_current

    assert image_is_current(image.labels)
    assert not image_is_current({**image.labels, LABEL_PACKAGES: ""})
