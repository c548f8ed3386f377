"""The fake cluster's `pods/exec`: the websocket channel protocol as the API server serves it,
the command run in the pod's Docker container (docker-py directly, never our adapter).

`install(cluster)` adds `GET|POST /api/v1/namespaces/{namespace}/pods/{name}/exec`.

What it follows, from kubernetes/kubernetes (staging `k8s.io/apimachinery/pkg/util/httpstream/
wsstream/conn.go`, `k8s.io/apiserver/pkg/util/proxy/websocket.go` and `streamtranslator.go`,
`pkg/kubelet/cri/streaming/remotecommand/websocket.go`; `k8s.io/apimachinery/pkg/util/
remotecommand/constants.go`):

- query: `command` (repeated, required), `container` (defaults to the pod's only container),
  `stdin`, `stdout`, `stderr`, `tty` (booleans as Go's `strconv.ParseBool` reads them; at least
  one stream; `tty` drops `stderr`, as the kubelet does). A request without a websocket
  upgrade gets 400 "Upgrade request required" (the SPDY path is not served).
- subprotocols, the first the client lists that the server knows: `v5.channel.k8s.io`,
  `v4.channel.k8s.io`, `channel.k8s.io` (no header: the unnamed binary protocol, as the
  kubelet's ""). Anything else is refused as golang.org/x/net/websocket refuses a failed
  handshake: `403 Forbidden` with an empty body. Not served (refused so): the kubelet's
  base64 variants (`base64.channel.k8s.io`, `v4.base64.channel.k8s.io`), which no client of
  ours asks for.
- frames: one byte of channel, then data. 0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize
  (JSON `{"Width": w, "Height": h}`, a stream of objects that frames may split); client text
  frames are read like binary ones. On v5, `[255, c]` closes channel `c` (stdin: EOF to the
  command). An empty message on the lowest writable channel tells the client the stream is
  open.
- status on channel 3 when the command ends, then a normal close: on v4 and v5 a
  `metav1.Status` as JSON, `{"metadata":{},"status":"Success"}`, or `Failure` with reason
  `NonZeroExitCode` and `details.causes[0]` `{"reason":"ExitCode","message":"<code>"}`; a
  command the runtime cannot start is an `InternalError` (code 500). The older protocols send
  only a failure's message as text, nothing on success.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import socket
import threading
import weakref
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
from aiohttp import WSMsgType, web

from tests.fakes.kube.errors import bad_request, not_found
from tests.fakes.kube.resources import PODS

logger = logging.getLogger(__name__)

EXEC_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/exec"

STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
V5, V4, V1 = "v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"
# Protocol -> (status as JSON, honours the close channel).
PROTOCOLS = {V5: (True, True), V4: (True, False), V1: (False, False), "": (False, False)}
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
# How the container runtime answers an exec it could not start (on the exec's output).
_RUNTIME_REFUSED = b"OCI runtime exec failed"


_ENDPOINTS: weakref.WeakKeyDictionary[Any, ExecEndpoint] = weakref.WeakKeyDictionary()


def install(cluster: Any) -> None:
    endpoint = _ENDPOINTS[cluster] = ExecEndpoint(cluster)
    for method in ("GET", "POST"):
        cluster.route(method, EXEC_PATH, endpoint.handle)


def endpoint_of(cluster: Any) -> ExecEndpoint:
    """The cluster's exec endpoint (tests set `protocols` on it: an older API server)."""
    return _ENDPOINTS[cluster]


def exit_status(exit_code: int, command: list[str]) -> dict[str, Any]:
    """What the kubelet writes on channel 3 for a command that ended (v4 and v5)."""
    if exit_code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(command)}], exit code {exit_code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
    }


def internal_status(message: str) -> dict[str, Any]:
    text = f"Internal error occurred: error executing command in container: {message}"
    return {
        "metadata": {},
        "status": "Failure",
        "message": text,
        "reason": "InternalError",
        "details": {"causes": [{"message": f"error executing command in container: {message}"}]},
        "code": 500,
    }


@dataclass(frozen=True)
class ExecOptions:
    command: list[str]
    container: str
    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name)
    if value is None or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise bad_request(f'{name}: Invalid value: "{value}": strconv.ParseBool: parsing "{value}": invalid syntax')


def chosen_protocol(request: web.Request, served: tuple[str, ...]) -> str | None:
    """The first protocol the client lists that is served; "" without the header; None: none."""
    header = ",".join(request.headers.getall("Sec-WebSocket-Protocol", []))
    offered = [item.strip() for item in header.split(",") if item.strip()]
    if not offered:
        return "" if "" in served else None
    return next((name for name in offered if name in served), None)


class ExecEndpoint:
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.docker = docker.from_env()
        # What the server speaks; an API server before 1.30 has no v5.
        self.protocols: tuple[str, ...] = tuple(PROTOCOLS)

    def _containers_of(self, namespace: str, name: str) -> list[str]:
        pod = self.cluster.store.find(PODS, namespace, name)
        if pod is None:
            raise not_found("pods", "", name)
        return [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]

    def options(self, request: web.Request, containers: list[str], pod: str) -> ExecOptions:
        command = request.query.getall("command", [])
        stdin, stdout, stderr, tty = (_flag(request, name) for name in ("stdin", "stdout", "stderr", "tty"))
        container = request.query.get("container", "")
        if not container:
            if len(containers) != 1:
                raise bad_request(
                    f"a container name must be specified for pod {pod}, choose one of: [{' '.join(containers)}]"
                )
            container = containers[0]
        elif container not in containers:
            raise bad_request(f"container {container} is not valid for pod {pod}")
        if not command:
            raise bad_request("you must specify at least one command for the container")
        if tty and stderr:
            stderr = False  # the kubelet: "Access to exec with tty and stderr is not supported"
        if not (stdin or stdout or stderr):
            raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        return ExecOptions(command, container, stdin, stdout, stderr, tty)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        loop = asyncio.get_running_loop()
        options = self.options(request, self._containers_of(namespace, name), name)
        try:
            container_id = await loop.run_in_executor(None, self.cluster.pod_container, namespace, name)
        except LookupError:
            raise bad_request(f"pod {name} does not have a host assigned") from None
        if request.headers.get("Upgrade", "").lower() != "websocket":
            raise bad_request("Upgrade request required")
        protocol = chosen_protocol(request, self.protocols)
        if protocol is None:
            logger.info(
                "exec %s/%s: requested protocol(s) are not supported: %s",
                namespace,
                name,
                request.headers.get("Sec-WebSocket-Protocol"),
            )
            return web.Response(status=403, body=b"")
        ws = web.WebSocketResponse(protocols=(protocol,) if protocol else (), max_msg_size=0, autoping=True)
        await ws.prepare(request)
        run = ExecRun(self.docker.api, container_id, options, ws, protocol, loop)
        await run.serve()
        return ws


class ExecRun:
    """One exec: Docker's hijacked socket on one side, the websocket channels on the other."""

    def __init__(
        self, api: Any, container_id: str, options: ExecOptions, ws: web.WebSocketResponse, protocol: str, loop: Any
    ) -> None:
        self.api = api
        self.container_id = container_id
        self.options = options
        self.ws = ws
        self.json_status, self.closes = PROTOCOLS[protocol]
        self.loop = loop
        self.exec_id = ""
        self.raw: Any = None
        self.reader: Any = None
        self.holder: Any = None
        self.stdin: queue.Queue[bytes | None] = queue.Queue()
        self.resize_buffer = ""

    async def send(self, channel: int, data: bytes) -> None:
        with suppress(ConnectionError, RuntimeError):
            await self.ws.send_bytes(bytes([channel]) + data)

    async def serve(self) -> None:
        options = self.options
        try:
            await self.loop.run_in_executor(None, self._start)
        except docker.errors.APIError as exc:
            await self._finish(internal_status(str(exc.explanation or exc)))
            return
        first = STDOUT if options.stdout else STDERR if options.stderr else STATUS
        await self.send(first, b"")
        receiving = asyncio.ensure_future(self._receive())
        if options.stdin:
            threading.Thread(target=self._feed_stdin, daemon=True).start()
        try:
            status = await self._in_thread(self._pump)
            await self._finish(status)
        finally:
            receiving.cancel()
            self.stdin.put(None)
            self._close_socket()

    async def _in_thread(self, work: Any) -> Any:
        """`work()` in a thread of its own: a shell's output lasts as long as the shell, and the
        loop's default executor has a few threads only."""
        done = self.loop.create_future()

        def run() -> None:
            try:
                result = work()
            except BaseException as exc:  # handed to the awaiting coroutine
                self.loop.call_soon_threadsafe(done.set_exception, exc)
            else:
                self.loop.call_soon_threadsafe(done.set_result, result)

        threading.Thread(target=run, name="fake-kube-exec", daemon=True).start()
        return await done

    def _start(self) -> None:
        options = self.options
        self.exec_id = self.api.exec_create(
            self.container_id,
            options.command,
            stdin=options.stdin,
            stdout=options.stdout,
            stderr=options.stderr,
            tty=options.tty,
        )["Id"]
        holder = self.api.exec_start(self.exec_id, tty=options.tty, socket=True)
        self.holder = holder  # keeps docker-py's response, and so the connection, alive
        self.raw = getattr(holder, "_sock", holder)
        # Reads go through http.client's buffered reader: it may hold the first output already.
        self.reader = holder._response.raw._fp.fp
        self.raw.settimeout(None)

    async def _finish(self, status: dict[str, Any] | None) -> None:
        if status is not None:
            if self.json_status:
                await self.send(STATUS, json.dumps(status, separators=(",", ":")).encode())
            elif status.get("status") != "Success":
                await self.send(STATUS, str(status.get("message", "")).encode())
        await self.ws.close()

    # Docker -> client -------------------------------------------------------------------

    def _forward(self, channel: int, data: bytes) -> None:
        asyncio.run_coroutine_threadsafe(self.send(channel, data), self.loop).result()

    def _pump(self) -> dict[str, Any] | None:
        """Forward the command's output until it ends; its status (None: the client left)."""
        held: bytearray | None = bytearray()  # the first bytes, while they may be the runtime's refusal
        demux = bytearray()
        while True:
            try:
                chunk = self.reader.read1(65536)
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                break
            if self.options.tty:
                frames = [(STDOUT, chunk)]
            else:
                demux += chunk
                frames = []
                while len(demux) >= 8:
                    length = int.from_bytes(demux[4:8], "big")
                    if len(demux) < 8 + length:
                        break
                    frames.append((demux[0], bytes(demux[8 : 8 + length])))
                    del demux[: 8 + length]
            for channel, data in frames:
                if held is not None and channel == STDOUT:
                    held += data
                    if _RUNTIME_REFUSED.startswith(bytes(held[: len(_RUNTIME_REFUSED)])):
                        continue
                    data, held = bytes(held), None
                if data:
                    self._forward(channel, data)
        if self.ws.closed:
            return None
        exit_code = self._exit_code()
        if held is not None and held.startswith(_RUNTIME_REFUSED) and exit_code in (126, 127):
            return internal_status(bytes(held).decode(errors="replace").strip())
        if held:
            self._forward(STDOUT, bytes(held))
        return exit_status(exit_code, self.options.command)

    def _exit_code(self) -> int:
        # The engine records the exit a moment after the stream ends.
        for _ in range(250):
            state = self.api.exec_inspect(self.exec_id)
            if not state.get("Running"):
                break
            threading.Event().wait(0.02)
        return int(state.get("ExitCode") or 0)

    # Client -> Docker -------------------------------------------------------------------

    async def _receive(self) -> None:
        async for message in self.ws:
            if message.type == WSMsgType.BINARY:
                data = bytes(message.data)
            elif message.type == WSMsgType.TEXT:
                data = message.data.encode()
            else:
                continue
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == CLOSE and self.closes:
                if len(payload) != 1:
                    break  # the server ends a stream with a malformed close signal
                if payload[0] == STDIN:
                    self.stdin.put(None)
            elif channel == STDIN and self.options.stdin:
                self.stdin.put(payload)
            elif channel == RESIZE and self.options.tty:
                await self._resize(payload)
        self.stdin.put(None)
        self._close_socket()

    async def _resize(self, payload: bytes) -> None:
        self.resize_buffer += payload.decode(errors="replace")
        decoder = json.JSONDecoder()
        while self.resize_buffer.strip():
            text = self.resize_buffer.lstrip()
            try:
                size, end = decoder.raw_decode(text)
            except ValueError:
                return  # the rest of the object is in a later frame
            self.resize_buffer = text[end:]
            if isinstance(size, dict):
                width, height = int(size.get("Width") or 0), int(size.get("Height") or 0)
                if width > 0 and height > 0:
                    await self.loop.run_in_executor(None, self._apply_size, width, height)

    def _apply_size(self, width: int, height: int) -> None:
        for _ in range(40):
            try:
                self.api.exec_resize(self.exec_id, height=height, width=width)
                return
            except docker.errors.APIError:
                # Docker refuses a resize until the exec runs; an ended one for good.
                threading.Event().wait(0.05)

    def _feed_stdin(self) -> None:
        while True:
            data = self.stdin.get()
            if data is None:
                if self.raw is not None:
                    with suppress(OSError):
                        self.raw.shutdown(socket.SHUT_WR)
                return
            try:
                self.raw.sendall(data)
            except OSError:
                return

    def _close_socket(self) -> None:
        if self.raw is not None:
            with suppress(OSError):
                self.raw.shutdown(socket.SHUT_RDWR)
