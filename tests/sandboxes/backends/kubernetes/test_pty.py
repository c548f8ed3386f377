"""The Kubernetes backend's terminals: TTY execs through pods/exec on the fake cluster, with the
size on the resize channel, input, output, and the shell's end."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sandboxes.backends.base import ErrorKind, ExecRequest, PtySize, RemoteError
from sandboxes.backends.capabilities import PtyHandle
from sandboxes.backends.kubernetes.exec import PodExec
from sandboxes.backends.kubernetes.pty import KubernetesPtys
from tests.support import kube_pods

pytestmark = pytest.mark.docker


pod = kube_pods.pod
pods = kube_pods.pods


@pytest.fixture
def shell(pods: PodExec) -> Iterator[PtyHandle]:
    handle = KubernetesPtys(pods).open("sbx", PtySize(cols=101, rows=31), command=("bash", "--norc", "-i"))
    yield handle
    handle.kill()


def read_until(handle: PtyHandle, needle: bytes, timeout: float = 20) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not in the terminal's output: {seen[-500:]!r}")
        try:
            chunk = handle.read(65536, timeout=0.5)
        except RemoteError as exc:
            if exc.kind != ErrorKind.TIMEOUT:
                raise
            continue
        if not chunk:
            raise AssertionError(f"the terminal ended before {needle!r}: {seen[-500:]!r}")
        seen += chunk
    return seen


def test_size_input_and_output(shell: PtyHandle) -> None:
    shell.write(b"stty size; echo at-$((40+2))\n")
    assert b"31 101" in read_until(shell, b"at-42")
    shell.resize(PtySize(cols=77, rows=22))
    shell.write(b"stty size; echo at-$((40+3))\n")
    assert b"22 77" in read_until(shell, b"at-43")
    # Clamped as the contract says.
    shell.resize(PtySize(cols=5000, rows=0))
    shell.write(b"stty size; echo at-$((40+4))\n")
    assert b"1 1000" in read_until(shell, b"at-44")


def test_the_shell_runs_as_the_user_where_asked(pods: PodExec) -> None:
    handle = KubernetesPtys(pods).open(
        "sbx", PtySize(), command=("bash", "--norc", "-i"), cwd="/tmp", env={"X_MARK": "m1"}
    )
    try:
        handle.write(b'echo "who-$(id -u)-$PWD-$X_MARK-$TERM"\n')
        read_until(handle, b"who-1000-/tmp-m1-xterm-256color")
    finally:
        handle.kill()


def test_a_large_output_arrives_whole(shell: PtyHandle) -> None:
    shell.write(b"seq 1 200000; echo seq-$((1+1))-done\n")
    seen = read_until(shell, b"seq-2-done", timeout=60)
    assert b"\r\n199999\r\n200000\r\n" in seen


def test_kill_ends_the_shell_in_the_pod(pods: PodExec, shell: PtyHandle) -> None:
    shell.write(b"echo pid-$$-x\n")
    seen = read_until(shell, b"-x\r\n")
    pid = seen.rsplit(b"pid-", 1)[1].split(b"-")[0].decode()
    assert shell.is_running()
    shell.kill()
    assert not shell.is_running()
    deadline = time.monotonic() + 10
    while pods.exec("sbx", ExecRequest(argv=("kill", "-0", pid))).exit_code == 0:
        assert time.monotonic() < deadline, f"shell {pid} still runs after kill"
        time.sleep(0.2)
    shell.kill()  # idempotent


def test_a_shell_that_exits_ends_the_stream(shell: PtyHandle) -> None:
    shell.write(b"exit 5\n")
    deadline = time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline, "the stream did not end"
        try:
            if shell.read(65536, timeout=0.5) == b"":
                break
        except RemoteError:
            continue
    assert not shell.is_running()
    with pytest.raises(RemoteError) as closed:
        shell.write(b"echo\n")
    assert closed.value.kind == ErrorKind.GONE


def test_many_open_terminals_leave_commands_running(pods: PodExec) -> None:
    handles = [KubernetesPtys(pods).open("sbx", PtySize(), command=("bash", "--norc", "-i")) for _ in range(12)]
    try:
        assert pods.exec("sbx", ExecRequest(argv=("echo", "still"), timeout_s=20)).stdout == b"still\n"
        for index, handle in enumerate(handles):
            handle.write(f"echo t-$((100+{index}))\n".encode())
            read_until(handle, f"t-{100 + index}".encode())
    finally:
        for handle in handles:
            handle.kill()
