"""The fake cluster's pods/exec, driven by the unmodified official `kubernetes` client: its
`stream()` one-shot and interactive (stdin, resize, v5's close), its `WSClient` asking for v4
and the unnamed protocol, and the refusals it meets (protocol, pod, container, permission)."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest
import websocket
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import stream, ws_client

from sandboxes.backends.kubernetes.exec import PodRef
from tests.fakes.kube import FakeCluster
from tests.fakes.kube.fixtures import kube_client
from tests.support import kube_pods

pytestmark = pytest.mark.docker


pod = kube_pods.pod
pods = kube_pods.pods


@pytest.fixture
def core(kube_api: Any) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_api)


def run(core: k8s.CoreV1Api, pod: PodRef, command: list[str], **options: Any) -> Any:
    streams: dict[str, Any] = {"stdin": False, "stdout": True, "stderr": True, "tty": False}
    return stream(
        core.connect_get_namespaced_pod_exec, pod.pod, pod.namespace, command=command, **{**streams, **options}
    )


def raw_client(core: k8s.CoreV1Api, pod: PodRef, protocol: str, command: list[str]) -> ws_client.WSClient:
    """The client's own WSClient, asking for one subprotocol."""
    configuration = core.api_client.configuration
    query = [("command", part) for part in command] + [("stdout", "true"), ("stderr", "true")]
    url = f"{configuration.host}/api/v1/namespaces/{pod.namespace}/pods/{pod.pod}/exec?{urlencode(query)}"
    headers = {
        "authorization": configuration.auth_settings()["BearerToken"]["value"],
        "sec-websocket-protocol": protocol,
    }
    return ws_client.WSClient(configuration, ws_client.get_websocket_url(url), headers, capture_all=True)


def test_one_shot_output(core: k8s.CoreV1Api, pod: PodRef) -> None:
    assert run(core, pod, ["sh", "-c", "echo out; sleep 0.2; echo err >&2"]) == "out\nerr\n"
    assert run(core, pod, ["printf", "%s|", "two words", "it's"]) == "two words|it's|"


def test_a_long_command_fits_in_the_query(core: k8s.CoreV1Api, pod: PodRef) -> None:
    # Go's net/http reads a request line of up to 1 MiB; the command travels in it.
    assert run(core, pod, ["sh", "-c", 'printf %s "$0" | wc -c', "x" * 100_000]).strip() == "100000"


def test_exit_status_on_channel_3(core: k8s.CoreV1Api, pod: PodRef) -> None:
    failed = run(core, pod, ["sh", "-c", "exit 3"], _preload_content=False)
    failed.run_forever(timeout=30)
    status = json.loads(failed.read_channel(ws_client.ERROR_CHANNEL))
    assert status["status"] == "Failure"
    assert status["reason"] == "NonZeroExitCode"
    assert status["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    assert status["message"].startswith("command terminated with non-zero exit code")
    ok = run(core, pod, ["true"], _preload_content=False)
    ok.run_forever(timeout=30)
    assert ok.subprotocol == ws_client.V5_CHANNEL_PROTOCOL
    assert ok.returncode == 0
    seven = run(core, pod, ["sh", "-c", "exit 7"], _preload_content=False)
    seven.run_forever(timeout=30)
    assert seven.returncode == 7


def test_a_command_the_runtime_cannot_start_is_an_internal_error(core: k8s.CoreV1Api, pod: PodRef) -> None:
    missing = run(core, pod, ["/no/such/program"], _preload_content=False)
    missing.run_forever(timeout=30)
    assert missing.read_stdout(timeout=0) == ""
    status = json.loads(missing.read_channel(ws_client.ERROR_CHANNEL))
    assert (status["reason"], status["code"]) == ("InternalError", 500)
    assert "/no/such/program" in status["message"]


def test_interactive_tty_with_resize(core: k8s.CoreV1Api, pod: PodRef) -> None:
    shell = run(core, pod, ["bash", "--norc", "-i"], stdin=True, tty=True, _preload_content=False)
    shell.write_channel(ws_client.RESIZE_CHANNEL, json.dumps({"Width": 123, "Height": 45}))
    shell.write_stdin("stty size; echo mark-$((20+1))\n")
    seen = ""
    deadline = time.monotonic() + 20
    while "mark-21" not in seen and time.monotonic() < deadline:
        shell.update(timeout=1)
        seen += shell.read_stdout(timeout=0) or ""
    assert "45 123" in seen, seen
    shell.write_stdin("exit 4\n")
    shell.run_forever(timeout=20)
    assert shell.returncode == 4


def test_stdin_ends_with_v5_close(core: k8s.CoreV1Api, pod: PodRef) -> None:
    counter = run(core, pod, ["wc", "-c"], stdin=True, _preload_content=False)
    counter.write_stdin(b"x" * 300_000)
    counter.close_channel(ws_client.STDIN_CHANNEL)
    counter.run_forever(timeout=30)
    assert counter.returncode == 0
    assert counter.read_all().strip() == "300000"


def test_v4_and_the_unnamed_protocol(core: k8s.CoreV1Api, pod: PodRef) -> None:
    v4 = raw_client(core, pod, "v4.channel.k8s.io", ["sh", "-c", "echo four; exit 2"])
    v4.run_forever(timeout=30)
    assert v4.subprotocol == "v4.channel.k8s.io"
    assert v4.returncode == 2
    assert v4.read_all() == "four\n"
    # The first protocol offered that the server knows wins.
    either = raw_client(core, pod, "v4.channel.k8s.io,v5.channel.k8s.io", ["true"])
    either.run_forever(timeout=30)
    assert either.subprotocol == "v4.channel.k8s.io"
    # channel.k8s.io: a failure is only its message, as text; success says nothing.
    old = raw_client(core, pod, "channel.k8s.io", ["sh", "-c", "exit 3"])
    old.run_forever(timeout=30)
    assert old.read_channel(ws_client.ERROR_CHANNEL).startswith("command terminated with non-zero exit code")
    fine = raw_client(core, pod, "channel.k8s.io", ["true"])
    fine.run_forever(timeout=30)
    assert fine.read_channel(ws_client.ERROR_CHANNEL) == ""


def test_an_unknown_protocol_is_refused_at_the_handshake(core: k8s.CoreV1Api, pod: PodRef) -> None:
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        raw_client(core, pod, "v9.channel.k8s.io", ["true"])
    assert refused.value.status_code == 403


def test_refusals_are_statuses(fake_cluster: FakeCluster, core: k8s.CoreV1Api, pod: PodRef) -> None:
    with pytest.raises(ApiException) as missing:
        run(core, PodRef(pod.namespace, "no-such-pod"), ["true"])
    assert "404" in str(missing.value.reason)
    assert 'pods \\"no-such-pod\\" not found' in str(missing.value.reason)
    with pytest.raises(ApiException) as container:
        run(core, pod, ["true"], container="nope")
    assert "400" in str(container.value.reason)
    assert "container nope is not valid" in str(container.value.reason)
    reader = kube_client(
        fake_cluster, fake_cluster.token_with([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
    )
    try:
        with pytest.raises(ApiException) as forbidden:
            run(k8s.CoreV1Api(reader), pod, ["true"])
        assert "403" in str(forbidden.value.reason)
        assert "pods/exec" in str(forbidden.value.reason)
    finally:
        reader.close()
    # Without an upgrade (a plain GET) there is nothing to stream.
    with pytest.raises(ApiException) as plain:
        core.connect_get_namespaced_pod_exec(pod.pod, pod.namespace, command=["true"], stdout=True)
    assert plain.value.status == 400
    assert "Upgrade request required" in str(plain.value.body)
