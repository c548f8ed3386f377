"""The resolver's process and refusal words (no root, no engine). Stopping a network's resolver
does not wait for its zombie to be reaped.

A daemonized dnsmasq's parent is the host's init; where init reaps late (seconds on some hosts,
never when the console is a container's pid 1) the old wait on /proc/<pid> held every policy
change, and the network's DNS, for up to 3 s. These run real processes of the test's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sandboxes.backends.docker.egress.dns import Resolver, process_exited
from sandboxes.backends.docker.egress.refusals import NO_UPSTREAM_RULE
from sandboxes.backends.docker.egress.refusals import dns_rule as dns_refusal_rule
from sandboxes.backends.docker.egress.state import SandboxState


def _wait_zombie(pid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            if handle.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return
        time.sleep(0.01)
    raise AssertionError("the child did not become a zombie")


def test_a_running_process_has_not_exited_a_zombie_and_a_reaped_one_have() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert process_exited(child.pid) is False
        os.kill(child.pid, signal.SIGTERM)
        _wait_zombie(child.pid)  # not reaped yet: /proc/<pid> is still there
        assert os.path.exists(f"/proc/{child.pid}")
        assert process_exited(child.pid) is True
    finally:
        child.kill()
        child.wait()
    assert process_exited(child.pid) is True


def test_stop_returns_once_the_resolver_is_a_zombie(tmp_path: Path) -> None:
    resolver = Resolver(str(tmp_path), "sbx-test")
    # A process that passes running_pid's check (dnsmasq in argv[0], the conf on its command
    # line) and that only this test, its parent, would reap: it stays a zombie after SIGTERM.
    child = subprocess.Popen(
        ["dnsmasq-stand-in", "-c", "import time; time.sleep(30)", f"--conf-file={resolver.conf}"],
        executable=sys.executable,
    )
    try:
        Path(resolver.pid_file).write_text(f"{child.pid}\n")
        deadline = time.monotonic() + 5
        while resolver.running_pid() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the interpreter's cmdline is in /proc once it has exec'd
        assert resolver.running_pid() == child.pid
        started = time.monotonic()
        resolver.stop()
        took = time.monotonic() - started
        assert os.path.exists(f"/proc/{child.pid}"), "still unreaped: the case the wait must not hang on"
        assert took < 1.0, f"stop waited {took:.2f} s for a zombie"
        assert not Path(resolver.pid_file).exists()
    finally:
        child.kill()
        child.wait()


def _state(allow: tuple[str, ...] = (), deny: tuple[str, ...] = (), online: bool = True) -> SandboxState:
    return SandboxState("ab" * 32, "sbx-test", ("172.30.0.2",), (), online, allow, deny)


def test_a_refused_name_the_lists_allow_blames_the_missing_upstream_not_the_allow_list() -> None:
    # No EGRESS_DNS_UPSTREAM: the resolver answers nothing, so allowed names are refused too.
    assert dns_refusal_rule(_state(allow=("allowed.test",)), "allowed.test", "") == NO_UPSTREAM_RULE
    assert dns_refusal_rule(_state(allow=("*.allowed.test",)), "a.allowed.test", "") == NO_UPSTREAM_RULE
    assert dns_refusal_rule(_state(), "any.test", "") == NO_UPSTREAM_RULE  # no allow list at all
    # A name outside the list, or denied, keeps its own reason; with an upstream nothing changes.
    assert dns_refusal_rule(_state(allow=("allowed.test",)), "other.test", "") == "not in the allow list"
    assert dns_refusal_rule(_state(allow=("198.51.100.0/24",)), "other.test", "") == "not in the allow list"
    assert dns_refusal_rule(_state(deny=("bad.test",)), "bad.test", "") == "deny entry bad.test"
    assert dns_refusal_rule(_state(online=False), "allowed.test", "") == "outbound off"
    assert dns_refusal_rule(_state(allow=("allowed.test",)), "other.test", "127.0.0.1#53") == "not in the allow list"
