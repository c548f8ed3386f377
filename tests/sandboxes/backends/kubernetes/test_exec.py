"""The Kubernetes backend's `exec` through pods/exec on the fake cluster (a real Docker container
behind the pod): exit codes, output, stdin, users, deadlines, and the v4 fallback."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest

from sandboxes.backends.base import ErrorKind, ExecRequest, NotStarted, RemoteError
from sandboxes.backends.kubernetes.exec import MAX_QUERY_BYTES, PodExec, PodRef, carried, with_env
from sandboxes.backends.kubernetes.stream import V4, V5
from tests.fakes.kube import FakeCluster
from tests.fakes.kube.exec import V1, endpoint_of
from tests.support import kube_pods
from tests.support.kube_pods import pod_exec, running_pod

pytestmark = pytest.mark.docker


pod = kube_pods.pod
pods = kube_pods.pods


@pytest.fixture
def only_v4(fake_cluster: FakeCluster) -> Iterator[None]:
    """The fake as an API server before 1.30: no v5.channel.k8s.io."""
    endpoint = endpoint_of(fake_cluster)
    served = endpoint.protocols
    endpoint.protocols = (V4, V1)
    try:
        yield
    finally:
        endpoint.protocols = served


def test_exit_code_and_both_streams(pods: PodExec) -> None:
    result = pods.exec("sbx", ExecRequest(shell="echo out; echo err >&2; exit 3"))
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert not result.timed_out
    assert not result.truncated
    assert pods.exec("sbx", ExecRequest(argv=("true",))).exit_code == 0
    # A signal's death is reported as a shell does: 128 + the signal.
    assert pods.exec("sbx", ExecRequest(shell="kill -TERM $$")).exit_code == 143


def test_argv_reaches_the_command_unchanged(pods: PodExec) -> None:
    args = ("two words", "it's", '"quoted"', "$HOME", "line\nbreak", "-n", "a=b", "ünï")
    result = pods.exec(
        "sbx", ExecRequest(argv=("python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *args))
    )
    assert result.exit_code == 0, result.stderr
    assert tuple(json.loads(result.stdout)) == args


def test_user_env_and_working_directory(pods: PodExec) -> None:
    script = 'printf "%s %s %s %s" "$(id -u)" "$(id -g)" "$HOME" "$PWD"; printf " %s" "$GREETING"'
    as_user = pods.exec("sbx", ExecRequest(shell=script, env={"GREETING": "hello there"}, cwd="/tmp"))
    assert as_user.stdout == b"1000 1000 /home/user /tmp hello there"
    as_root = pods.exec("sbx", ExecRequest(shell=script, user="root", cwd="/"))
    assert as_root.stdout == b"0 0 /root / "
    with pytest.raises(RemoteError) as missing:
        pods.exec("sbx", ExecRequest(argv=("true",), cwd="/no/such/place"))
    assert missing.value.kind == ErrorKind.INVALID
    assert "/no/such/place" in missing.value.message
    with pytest.raises(RemoteError) as missing_root_dir:
        pods.exec("sbx", ExecRequest(argv=("true",), cwd="/root/nothing here"))
    assert missing_root_dir.value.kind == ErrorKind.INVALID
    with pytest.raises(RemoteError) as bad_env:
        pods.exec("sbx", ExecRequest(argv=("true",), env={"A B": "x"}))
    assert bad_env.value.kind == ErrorKind.INVALID
    with pytest.raises(RemoteError) as bad_user:
        pods.exec("sbx", ExecRequest(argv=("true",), user="admin"))
    assert bad_user.value.kind == ErrorKind.INVALID


def test_large_output_whole_and_capped(pods: PodExec) -> None:
    size = 8 * 1024 * 1024
    script = f"head -c {size} /dev/urandom > /tmp/big; cat /tmp/big; sha256sum /tmp/big >&2"
    result = pods.exec("sbx", ExecRequest(shell=script, max_output_bytes=16 * 1024 * 1024, timeout_s=120))
    assert result.exit_code == 0
    assert len(result.stdout) == size
    assert not result.truncated
    assert result.stderr.split()[0].decode() == hashlib.sha256(result.stdout).hexdigest()
    capped = pods.exec("sbx", ExecRequest(shell="cat /tmp/big; echo done >&2", max_output_bytes=1000))
    assert capped.exit_code == 0
    assert capped.truncated
    assert len(capped.stdout) == 1000
    assert capped.stderr == b"done\n"


def test_stdin_arrives_whole_and_ends(pods: PodExec) -> None:
    data = os.urandom(3 * 1024 * 1024) + bytes(range(256))
    result = pods.exec("sbx", ExecRequest(argv=("sha256sum",), stdin=data, timeout_s=120))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    # A command that never reads its input still ends, and one that reads it gets EOF.
    assert pods.exec("sbx", ExecRequest(argv=("true",), stdin=b"x" * 200_000)).exit_code == 0
    assert pods.exec("sbx", ExecRequest(argv=("cat",), stdin=b"")).stdout == b""


def test_a_deadline_kills_the_whole_process_group(pods: PodExec) -> None:
    marker = "4099"
    result = pods.exec("sbx", ExecRequest(shell=f"sleep {marker} & sleep {marker}; echo never", timeout_s=1.5))
    assert result.timed_out
    assert result.exit_code == 137
    assert result.duration_s < 10
    assert b"never" not in result.stdout
    left = pods.exec("sbx", ExecRequest(shell=f"ps -eo args | grep -c '^sleep {marker}$' || true"))
    assert left.stdout.strip() == b"0"


def test_a_missing_pod_is_not_started(fake_cluster: FakeCluster) -> None:
    pods = pod_exec(fake_cluster, PodRef("default", "no-such-pod"))
    with pytest.raises(NotStarted) as gone:
        pods.exec("sbx", ExecRequest(argv=("true",)))
    assert gone.value.kind == ErrorKind.NOT_FOUND
    assert "no-such-pod" in gone.value.message


def test_without_the_exec_permission_it_is_forbidden(fake_cluster: FakeCluster, pod: PodRef) -> None:
    token = fake_cluster.token_with([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}])
    with pytest.raises(RemoteError) as refused:
        pod_exec(fake_cluster, pod, token).exec("sbx", ExecRequest(argv=("true",)))
    assert refused.value.kind == ErrorKind.FORBIDDEN


def test_speaks_v5_and_falls_back_to_v4(pods: PodExec, pod: PodRef, only_v4: None) -> None:
    stream = pods.open(pod, ("true",), stdin=False, tty=False, what="probe")
    try:
        assert stream.protocol == V4
    finally:
        stream.close()
    # v4 cannot close stdin: the command still gets EOF after the bytes sent.
    data = os.urandom(100_000)
    result = pods.exec("sbx", ExecRequest(argv=("sha256sum",), stdin=data))
    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert pods.exec("sbx", ExecRequest(shell="exit 7")).exit_code == 7


def test_v5_is_taken_when_served(pods: PodExec, pod: PodRef) -> None:
    stream = pods.open(pod, ("true",), stdin=False, tty=False, what="probe")
    try:
        assert stream.protocol == V5
    finally:
        stream.close()


def test_in_a_pod_that_runs_as_a_user_root_is_refused_in_words(fake_cluster: FakeCluster) -> None:
    with running_pod(fake_cluster, runAsUser=1000, runAsGroup=1000) as non_root:
        pods = pod_exec(fake_cluster, non_root)
        assert pods.exec("sbx", ExecRequest(shell='echo "$(id -u):$(id -g) $HOME"')).stdout == b"1000:1000 /home/user\n"
        with pytest.raises(RemoteError) as refused:
            pods.exec("sbx", ExecRequest(argv=("true",), user="root"))
        assert refused.value.kind == ErrorKind.UNSUPPORTED
        assert "uid 1000" in refused.value.message


def test_a_command_too_long_for_a_url_goes_on_stdin(pods: PodExec) -> None:
    args = tuple(f'{index}: it\'s "odd" $HOME `x` \\ \n\t' + "y" * 3000 for index in range(4))
    program = (
        "import sys, json, hashlib; print(json.dumps(sys.argv[1:])); "
        "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    )
    request = ExecRequest(argv=("python3", "-c", program, *args), stdin=b"input \x00 bytes" * 1000, cwd="/tmp")
    long_argv = with_env("user", {}, request.argv or ())
    sent, fed = carried(long_argv, request.stdin, long_argv)
    assert len(urlencode([("command", part) for part in sent])) <= MAX_QUERY_BYTES
    assert fed is not None
    assert fed.endswith(request.stdin or b"")
    result = pods.exec("sbx", request)
    assert result.exit_code == 0, result.stderr
    echoed, digest = result.stdout.decode().rsplit("\n", 2)[:2]
    assert tuple(json.loads(echoed)) == args
    assert digest == hashlib.sha256(request.stdin or b"").hexdigest()
    # Without input of its own, the command reads none (it does not wait on the stream).
    assert pods.exec("sbx", ExecRequest(argv=("sh", "-c", "cat; echo end", *args))).stdout == b"end\n"
    # The deadline still kills the whole group.
    slow = pods.exec("sbx", ExecRequest(argv=("sh", "-c", "sleep 4098 & sleep 4098", *args), timeout_s=1.5))
    assert slow.timed_out
    left = pods.exec("sbx", ExecRequest(shell="ps -eo args | grep -c '^sleep 4098$' || true"))
    assert left.stdout.strip() == b"0"
