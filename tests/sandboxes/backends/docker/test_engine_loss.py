"""The Docker engine going away in the middle of a call, through the adapter and the console.

The shared dockerd keeps running: each test talks to it through an `EngineProxy` on a socket
of its own and kills the proxy at a chosen moment (tests/support/engine_proxy.py). Every
failure must be `unavailable` (retryable) with a message naming what was being done, never a
hang, a 500 or a made-up result. Containers made through the proxy are removed afterwards
through the real socket.
"""

from __future__ import annotations

import http.client
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import docker
import pytest
import requests.exceptions
import urllib3.exceptions
from django.urls import reverse

from console.models import JobStatus
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import (
    META_INSTALLATION,
    META_SESSION,
    BackendConfig,
    ErrorKind,
    ListQuery,
    PtySize,
    RemoteError,
    SandboxSpec,
    SandboxState,
)
from sandboxes.backends.capabilities import PtyHandle
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import EXEC_BACKSTOP_GRACE_S, _translate
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.reaper import reap_config
from sandboxes.sessions.store_select import get_store
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent, validate
from tests.sandboxes.catalog.test_configs import run_queued_job
from tests.sandboxes.conftest import docker_test_network_name
from tests.support.backend_conformance import OFFLINE, run, shell_request
from tests.support.engine_proxy import EngineProxy

pytestmark = [pytest.mark.docker]

# docker-py's paths carry the API version: POST /v1.41/exec/<id>/start.
EXEC_START = r"^POST /v[\d.]+/exec/\w+/start"
CREATE = r"^POST /v[\d.]+/containers/create"
CASE_LABEL = "console.meta.case"


# Fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[docker.APIClient]:
    """The real engine, for looking behind the proxy's back and cleaning up."""
    client = docker.from_env(timeout=60)
    yield client.api
    client.close()


@pytest.fixture
def proxy() -> Iterator[EngineProxy]:
    # Under /tmp, not tmp_path: a Unix socket path holds at most 107 bytes.
    directory = tempfile.mkdtemp(prefix="engine-proxy-")
    engine_proxy = EngineProxy(os.path.join(directory, "docker.sock"))
    engine_proxy.start()
    yield engine_proxy
    engine_proxy.kill()
    os.rmdir(directory)


@pytest.fixture
def metadata(engine: docker.APIClient, test_run_id: str) -> Iterator[dict[str, str]]:
    """Metadata naming this test's sandboxes; whatever carries it is removed afterwards."""
    case = uuid.uuid4().hex
    yield {"test-run": test_run_id, "case": case}
    for row in engine.containers(all=True, filters={"label": f"{CASE_LABEL}={case}"}):
        engine.remove_container(row["Id"], force=True)


@pytest.fixture
def backend(proxy: EngineProxy, test_run_id: str) -> Iterator[DockerBackend]:
    options = {"timeout": "10", "network": docker_test_network_name(test_run_id)}
    adapter = DockerBackend(BackendConfig(kind="docker", endpoint=proxy.endpoint, options=options))
    yield adapter
    adapter.close()


@pytest.fixture
def sandbox(backend: DockerBackend, docker_base_image: str, metadata: dict[str, str]) -> str:
    return backend.create(SandboxSpec(template_id=docker_base_image, network=OFFLINE, metadata=metadata)).sandbox_id


# Helpers ----------------------------------------------------------------------------------


def assert_unavailable(error: RemoteError, doing: str) -> None:
    assert error.kind == ErrorKind.UNAVAILABLE, error
    assert error.retryable
    assert doing in error.message, error.message


def processes(engine: docker.APIClient, container_id: str) -> str:
    """The command lines running in a container, asked through the real socket."""
    exec_id = engine.exec_create(container_id, ["ps", "-eo", "args"])["Id"]
    return bytes(engine.exec_start(exec_id)).decode()


def eventually(condition: Callable[[], bool], within: float) -> bool:
    # Polls: what happens inside a sandbox sends no event to wait on.
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def read_to_end(pty: PtyHandle, within: float) -> ErrorKind | None:
    """Read until end of stream: None then, else the kind of the error that ended the reading
    (`timeout` when nothing came within `within`)."""
    deadline = time.monotonic() + within
    try:
        while pty.read(timeout=max(deadline - time.monotonic(), 0.01)):
            pass
    except RemoteError as exc:
        return exc.kind
    return None


# The adapter ------------------------------------------------------------------------------


def test_exec_in_flight_is_unavailable_and_its_command_dies_by_its_deadline(
    proxy: EngineProxy, backend: DockerBackend, sandbox: str, engine: docker.APIClient
) -> None:
    proxy.arm(EXEC_START, marker=b"started")
    with pytest.raises(RemoteError) as caught:
        backend.exec(sandbox, shell_request("sleep 301 & echo started; sleep 302; echo late", timeout_s=2))
    assert proxy.killed.is_set()
    assert_unavailable(caught.value, f"exec in sandbox {sandbox[:12]}")
    # Nothing can reach the engine to stop the command, so it outlives the call...
    assert "sleep 302" in processes(engine, sandbox)
    # ...but not its deadline: the backstop inside the sandbox kills the whole group.
    gone = eventually(lambda: "sleep 30" not in processes(engine, sandbox), within=2 + EXEC_BACKSTOP_GRACE_S + 3)
    assert gone, processes(engine, sandbox)


def test_exec_whose_connection_is_cut_is_unavailable_and_its_command_is_stopped(
    proxy: EngineProxy, backend: DockerBackend, sandbox: str, engine: docker.APIClient
) -> None:
    # The engine stays up, only the connection breaks: not a result with a made-up exit code.
    proxy.arm(EXEC_START, marker=b"started", keep_listening=True)
    with pytest.raises(RemoteError) as caught:
        backend.exec(sandbox, shell_request("sleep 311 & echo started; sleep 312", timeout_s=60))
    assert proxy.was_cut.is_set()
    assert not proxy.killed.is_set()
    assert_unavailable(caught.value, "was cut while the command ran")
    assert "sleep 31" not in processes(engine, sandbox)  # stopped now, not at its 60 s deadline


def test_create_in_flight_is_unavailable_and_leaves_a_container_the_console_finds(
    proxy: EngineProxy,
    backend: DockerBackend,
    engine: docker.APIClient,
    docker_base_image: str,
    metadata: dict[str, str],
) -> None:
    proxy.arm(CREATE)  # dies once the engine has made the container, before the answer
    with pytest.raises(RemoteError) as caught:
        backend.create(SandboxSpec(template_id=docker_base_image, network=OFFLINE, metadata=metadata))
    assert proxy.killed.is_set()
    assert len(proxy.requests(CREATE)) == 1  # asked once: a create is never retried blindly
    assert_unavailable(caught.value, "creating the sandbox")
    rows = engine.containers(all=True, filters={"label": f"{CASE_LABEL}={metadata['case']}"})
    assert len(rows) == 1
    assert rows[0]["Labels"]["console.managed"] == "1"
    assert rows[0]["Labels"]["console.kind"] == "sandbox"
    # Listed by its metadata once the engine is back: the runtime's claim and the reaper see it.
    proxy.start()
    listed = backend.list(ListQuery(metadata=metadata)).items
    assert [(info.sandbox_id, info.state) for info in listed] == [(rows[0]["Id"], SandboxState.STARTING)]


def test_terminal_read_ends_when_the_engine_goes_away(proxy: EngineProxy, backend: DockerBackend, sandbox: str) -> None:
    pty_capability = backend.pty()
    assert pty_capability is not None
    pty = pty_capability.open(sandbox, PtySize(rows=24, cols=80))
    proxy.arm(EXEC_START, marker=b"mark-2")  # the output, not the echo of the typed line
    pty.write(b"echo mark-$((1+1))\n")
    assert read_to_end(pty, within=10) in (None, ErrorKind.UNAVAILABLE)  # never a hang
    assert proxy.killed.is_set()
    assert not pty.is_running()
    pty.kill()  # returns: nothing left to reach


@pytest.mark.parametrize(
    "cut",
    [
        requests.exceptions.ChunkedEncodingError("Connection broken: IncompleteRead(3873 bytes read)"),
        urllib3.exceptions.ProtocolError("Connection broken", http.client.IncompleteRead(b"{", 1139)),
        http.client.IncompleteRead(b"{", 1139),
    ],
)
def test_an_answer_cut_midway_is_unavailable(cut: Exception) -> None:
    # What a pooled connection cut while the engine's answer came in raises (seen in CI when
    # the engine went away between two calls); the proxy cannot make it happen on demand.
    error = _translate(cut, "sandbox abc")
    assert_unavailable(error, "sandbox abc")


def test_the_same_backend_works_again_once_the_engine_is_back(
    proxy: EngineProxy, backend: DockerBackend, sandbox: str
) -> None:
    proxy.arm(EXEC_START, marker=b"started")
    with pytest.raises(RemoteError):
        backend.exec(sandbox, shell_request("echo started; sleep 5", timeout_s=10))
    with pytest.raises(RemoteError) as caught:
        backend.get(sandbox)
    assert_unavailable(caught.value, f"sandbox {sandbox}")
    proxy.start()
    assert run(backend, sandbox, "echo back") == "back\n"
    assert backend.get(sandbox).state == SandboxState.RUNNING
    assert backend.health().ok


def test_a_backend_first_used_while_the_engine_is_away_connects_once_it_is_back(proxy: EngineProxy) -> None:
    proxy.kill()
    backend = DockerBackend(BackendConfig(kind="docker", endpoint=proxy.endpoint, options={"timeout": "10"}))
    assert not backend.health().ok
    templates = backend.templates()
    assert templates is not None
    with pytest.raises(RemoteError) as caught:
        templates.list()
    assert_unavailable(caught.value, "connecting to the Docker engine")
    proxy.start()
    assert backend.health().ok
    backend.close()


# Through the console ----------------------------------------------------------------------

P = "/spaces/{space_id}/sessions/{key}"


@pytest.fixture
def proxied_config(
    world: World, proxy: EngineProxy, docker_base_image: str, settings: Any, test_run_id: str
) -> Iterator[SandboxConfig]:
    """Space A's default config, on the engine through the proxy, under an installation id
    of its own; its sandboxes and workspace volumes are removed through the real socket."""
    settings.CONSOLE_INSTALLATION_ID = f"test-{test_run_id}-{uuid.uuid4().hex[:6]}"
    config: SandboxConfig = make_config(
        world.space_a,
        name="behind a proxy",
        endpoint=proxy.endpoint,
        default_template=docker_base_image,
        is_default=True,
    )
    yield config
    real = DockerBackend(BackendConfig(kind="docker"))
    # Twice at most: a thread a race test let go (joined with a timeout) may still bind a
    # sandbox after the first listing, and its volume is then in use.
    for attempt in range(2):
        for info in real.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            real.delete(info.sandbox_id)
        try:
            for session in Session.objects.filter(config=config):
                real.delete_volume(session.workspace_volume)
            break
        except RemoteError:
            if attempt:
                raise
            time.sleep(2)
    real.close()


@pytest.fixture
def agent(world: World) -> Agent:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


def assert_api_unavailable(response: Any, path: str, doing: str) -> None:
    assert response.status_code == 503, response.content
    error = response.json()["error"]
    assert (error["code"], error["retryable"]) == ("unavailable", True)
    assert doing in error["message"], error["message"]
    validate(response, P + path, "post")


@pytest.mark.django_db
def test_api_exec_answers_503_retryable_when_the_engine_goes_away(
    proxy: EngineProxy, proxied_config: SandboxConfig, agent: Agent
) -> None:
    assert agent.post("s1", "resolve").status_code == 200
    proxy.arm(EXEC_START, marker=b"started")
    cut = agent.post("s1", "exec", {"shell": "echo started; sleep 30", "timeout_s": 2})
    assert proxy.killed.is_set()
    assert_api_unavailable(cut, "/exec", "exec in sandbox")
    # With the engine gone, the next call fails the same way, at its first engine call.
    assert_api_unavailable(agent.post("s1", "exec", {"shell": "true"}), "/exec", "the Docker engine is unreachable")


@pytest.mark.django_db
def test_api_resolve_cut_mid_create_is_503_and_the_next_resolve_claims_the_container(
    proxy: EngineProxy, proxied_config: SandboxConfig, agent: Agent, engine: docker.APIClient, settings: Any
) -> None:
    proxy.arm(CREATE)
    assert_api_unavailable(agent.post("s2", "resolve"), "/resolve", "creating the sandbox")
    proxy.start()  # the runtime's cached backend reconnects by itself
    resolved = agent.post("s2", "resolve")
    assert resolved.status_code == 200, resolved.content
    assert resolved.json()["action"] == "claimed"
    labels = [f"console.meta.{META_INSTALLATION}={settings.CONSOLE_INSTALLATION_ID}", f"console.meta.{META_SESSION}=s2"]
    made = engine.containers(all=True, filters={"label": labels})
    assert [row["Id"] for row in made] == [resolved.json()["sandbox_id"]]  # adopted, not duplicated


@pytest.mark.django_db
def test_session_page_and_actions_say_the_engine_is_unavailable(
    world: World, proxy: EngineProxy, proxied_config: SandboxConfig, agent: Agent
) -> None:
    assert agent.post("s3", "resolve").status_code == 200
    proxy.kill()
    session = Session.objects.get(space=world.space_a, key="s3")
    client = world.client_for("bob")
    page = client.get(session.get_absolute_url(), {"browse": "1"})
    assert page.status_code == 200
    assert "The backend said unavailable" in page.content.decode()
    assert "(retry later)" in page.content.decode()
    resumed = client.post(reverse("sandboxes:session_action", args=[session.id, "resume"]), follow=True)
    assert resumed.status_code == 200
    assert "The backend said unavailable" in resumed.content.decode()


@pytest.mark.django_db
def test_test_connection_cut_mid_create_fails_that_step_with_a_message(
    world: World, proxy: EngineProxy, proxied_config: SandboxConfig
) -> None:
    proxy.arm(CREATE)
    client = world.client_for("alice")
    assert client.post(reverse("sandboxes:config_test", args=[proxied_config.id])).status_code == 302
    job = run_queued_job()
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("step create failed: unavailable: creating the sandbox"), job.error
    job_page = client.get(job.get_absolute_url())
    assert job_page.status_code == 200
    assert "step create failed: unavailable" in job_page.content.decode()
    assert client.get(proxied_config.get_absolute_url()).status_code == 200
    # The half-made sandbox carries the config's metadata: the reaper lists it (and, being a
    # job's, deletes it once the job grace has passed).
    proxy.start()
    report = reap_config(proxied_config, get_store(), grace=timedelta(0))
    assert (report.listed, report.too_young, report.errors) == (1, 1, [])
