"""The engine calls spoken on the engine's unix socket directly (wire.py): docker-py is not
asked, kept connections the engine closed are replaced, an engine object builds one docker-py
client and one wire however many threads ask at once, the engine's refusals are said as
docker-py's were, and calls sent before they are read each get their own answer."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandboxes.backends.base import BackendConfig, ErrorKind, ExecRequest, NotStarted, RemoteError
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.common import _engine_call
from sandboxes.backends.docker.engine import DockerEngine
from sandboxes.backends.docker.wire import KEPT, UnixWire, _UnixConnection
from tests.sandboxes.backends.docker.test_snapshots import backend, make  # noqa: F401 - fixtures
from tests.support.backend_conformance import SandboxFactory

pytestmark = [pytest.mark.docker]


def test_an_exec_and_a_look_on_a_local_engine_do_not_go_through_docker_py(
    backend: DockerBackend,  # noqa: F811 - the fixture
    make: SandboxFactory,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    info = make()
    sent: list[str] = []
    request = backend.api.request

    def recorded(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(f"{method} {url}")
        return request(method, url, *args, **kwargs)

    monkeypatch.setattr(backend.api, "request", recorded)
    result = backend.exec(info.sandbox_id, ExecRequest(shell="head -c 3000000 /dev/zero | tr '\\0' x; echo; exit 3"))
    assert (result.exit_code, len(result.stdout), result.truncated) == (3, 1024 * 1024, True)
    assert backend.get(info.sandbox_id).sandbox_id == info.sandbox_id
    assert backend.connect(info.sandbox_id).state == "running"
    assert sent == []


def test_kept_connections_the_engine_closed_are_replaced(
    backend: DockerBackend,  # noqa: F811 - the fixture
    make: SandboxFactory,  # noqa: F811
) -> None:
    """An engine restarted after a busy moment: every kept connection is dead, not just one,
    and no call fails for it."""
    info = make()
    assert backend.exec(info.sandbox_id, ExecRequest(argv=("true",))).exit_code == 0
    wire = backend.engine.wire
    assert wire is not None
    while len(wire._idle) < KEPT:  # as many kept as concurrent calls leave
        connection = _UnixConnection(wire.path, wire.timeout)
        connection.connect()
        wire._idle.append(connection)
    for connection in wire._idle:
        assert connection.sock is not None
        connection.sock.shutdown(socket.SHUT_RDWR)  # as when the engine restarts meanwhile
    for _ in range(KEPT):
        result = backend.exec(info.sandbox_id, ExecRequest(shell="echo again"))
        assert (result.exit_code, result.stdout) == (0, b"again\n")


def test_the_engines_refusals_are_said_as_before(
    backend: DockerBackend,  # noqa: F811 - the fixture
    make: SandboxFactory,  # noqa: F811
) -> None:
    info = make()
    backend.pause(info.sandbox_id)
    with pytest.raises(NotStarted) as paused:
        backend.exec(info.sandbox_id, ExecRequest(argv=("true",)))
    assert paused.value.kind == ErrorKind.CONFLICT
    assert "is paused" in paused.value.message
    assert paused.value.message.startswith("exec in sandbox")
    wire = backend.engine.wire
    assert wire is not None
    for ask, said in ((wire.exec_inspect, "No such exec instance"), (wire.container_inspect, "No such container")):
        with pytest.raises(RemoteError) as missing, _engine_call("looking"):
            ask("0" * 64)
        assert missing.value.kind == ErrorKind.NOT_FOUND
        assert missing.value.message == f"looking: {said}: {'0' * 64}"


def test_calls_sent_before_either_is_read_each_get_their_own_answer(
    backend: DockerBackend,  # noqa: F811 - the fixture
    make: SandboxFactory,  # noqa: F811
) -> None:
    first, second = make(), make()
    wire = backend.engine.wire
    assert wire is not None
    one = wire.begin_container_inspect(first.sandbox_id)
    two = wire.begin_container_inspect(second.sandbox_id)
    dropped = wire.begin_container_inspect(first.sandbox_id)
    dropped.drop()  # given up unread: its answer must reach no later call
    assert two.answer()["Id"] == second.sandbox_id
    assert one.answer()["Id"] == first.sandbox_id
    for _ in range(KEPT + 1):
        assert wire.container_inspect(second.sandbox_id)["Id"] == second.sandbox_id


def test_an_error_answer_to_a_start_is_read_as_its_head_frames_it(tmp_path: Path) -> None:
    """A refusal whose body comes in chunks (no Content-Length) still says the engine's message."""
    message = "container 1234 is paused, unpause the container before exec"
    body = json.dumps({"message": message}).encode()
    head = b"HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    path = str(tmp_path / "engine.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(head)
            connection.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            connection.recv(1)  # until the client closes

    engine = threading.Thread(target=answer)
    engine.start()
    try:
        with pytest.raises(RemoteError) as refused, _engine_call("starting"):
            UnixWire(path, "1.43", 10).exec_start("1234")
    finally:
        engine.join()
        listener.close()
    assert (refused.value.kind, refused.value.message) == (ErrorKind.CONFLICT, f"starting: {message}")


def test_threads_racing_on_a_fresh_engine_share_one_wire() -> None:
    """The first execs of a new engine object, at once on several request threads: one wire is
    built and all use it (each other one would keep connections nobody closes)."""
    for _ in range(5):
        engine = DockerEngine(BackendConfig(kind="docker"), api_timeout=60)
        try:
            wires = wires_asked_at_once(engine, threads=8)
            assert wires[0] is not None
            assert all(wire is wires[0] for wire in wires)
        finally:
            engine.close()


def test_threads_racing_on_a_fresh_engine_share_one_client() -> None:
    """The first engine calls of a new engine object, at once on several request threads: one
    docker-py client is built and all use it (each other one would keep its connections open,
    and close() would close only the one kept)."""
    for _ in range(5):
        engine = DockerEngine(BackendConfig(kind="docker"), api_timeout=60)
        try:
            clients = asked_at_once(engine, "client", threads=8)
            assert all(client is clients[0] for client in clients)
        finally:
            engine.close()


def test_a_close_while_the_client_connects_closes_the_client_it_builds(tmp_path: Path) -> None:
    """close() called while a first call is still connecting (the engine slow to tell its
    version) waits for that client and closes it: the engine sees its connection end, rather
    than a client kept open by an engine object already closed."""
    path = str(tmp_path / "engine.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    asked = threading.Event()
    ended: list[bool] = []

    def slow_engine() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)  # GET /version
            asked.set()
            time.sleep(0.5)  # the engine object is closed meanwhile
            body = json.dumps({"ApiVersion": "1.43", "Version": "24.0.0"}).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            connection.sendall(head + body)
            connection.settimeout(5)
            try:
                ended.append(connection.recv(1) == b"")
            except TimeoutError:
                ended.append(False)

    server = threading.Thread(target=slow_engine)
    server.start()
    engine = DockerEngine(BackendConfig(kind="docker", endpoint=f"unix://{path}"), api_timeout=10)
    first = threading.Thread(target=lambda: engine.client)
    try:
        first.start()
        assert asked.wait(5)
        engine.close()
    finally:
        first.join()
        server.join()
        listener.close()
        engine.close()
    assert ended == [True]


def wires_asked_at_once(engine: DockerEngine, threads: int) -> list[UnixWire | None]:
    """`engine.wire` as each of `threads` threads, released together by a barrier, got it."""
    return asked_at_once(engine, "wire", threads)


def asked_at_once(engine: DockerEngine, member: str, threads: int) -> list[Any]:
    """`engine.<member>` as each of `threads` threads, released together by a barrier, got it."""
    barrier = threading.Barrier(threads)
    answers: list[Any] = []

    def first_call() -> None:
        barrier.wait()
        answers.append(getattr(engine, member))

    started = [threading.Thread(target=first_call) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    assert len(answers) == threads
    return answers
