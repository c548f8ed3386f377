"""Commands in Docker sandboxes: exec on the hijacked socket, stdin, the demultiplexed output,
deadlines and the process-group kill that backs them up.

`_ExecStream` and `_Demuxer` are used by `pty` (interactive shells) too.
"""

from __future__ import annotations

import secrets
import select
import socket
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from ..base import (
    ErrorKind,
    ExecRequest,
    ExecResult,
    NotStarted,
    RemoteError,
)
from .common import (
    _KILL_GROUP,
    _USERS,
    EXEC_BACKSTOP_GRACE_S,
    EXEC_MARK_DIGITS,
    _engine_call,
    _raise_for_command,
)

if TYPE_CHECKING:
    from .engine import DockerEngine

# ---------------------------------------------------------------------------------------
# The hijacked exec socket


# How the container runtime answers an exec it could not start (written to the exec's stdout).
_RUNTIME_REFUSED = b"OCI runtime exec failed"


class _ExecStream:
    """The raw socket of an upgraded exec connection, with read-ahead recovered.

    docker-py hands back the socket after http.client has parsed the response headers; its
    buffered reader may already hold the first bytes of output, so they are taken first.
    """

    def __init__(self, sock: Any, pending: bytes | None = None) -> None:
        # Holding docker-py's wrapper keeps its HTTP response (and so the connection) alive.
        # `pending`: what came before the stream, for a socket read without docker-py.
        self.holder = sock
        self.raw: socket.socket = getattr(sock, "_sock", sock)
        self.pending = self._buffered_bytes(sock) if pending is None else pending
        self.raw.settimeout(None)

    def _buffered_bytes(self, sock: Any) -> bytes:
        response = getattr(sock, "_response", None)
        reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
        if reader is None:
            return b""
        self.raw.setblocking(False)
        try:
            data = reader.peek(1) or b""
            return reader.read1(len(data)) if data else b""
        except (OSError, ValueError):
            return b""
        finally:
            self.raw.setblocking(True)

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        """Up to max_bytes; b"" at end of stream; TimeoutError when nothing came in time.

        Waits with poll() instead of a socket timeout: the socket stays blocking, so another
        thread can keep sending stdin on it meanwhile.
        """
        if self.pending:
            data, self.pending = self.pending[:max_bytes], self.pending[max_bytes:]
            return data
        poller = select.poll()
        poller.register(self.raw, select.POLLIN | select.POLLHUP | select.POLLERR)
        if not poller.poll(None if timeout is None else max(int(timeout * 1000), 1)):
            raise TimeoutError("no data in time")
        return self.raw.recv(max_bytes)

    def send_all(self, data: bytes) -> None:
        self.raw.sendall(data)

    def close_input(self) -> None:
        with suppress(OSError):
            self.raw.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        # shutdown() first: it wakes a stdin thread blocked in sendall, close() alone does not.
        with suppress(OSError):
            self.raw.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            self.raw.close()


class _Demuxer:
    """Splits Docker's multiplexed stream (8-byte header per frame) into stdout and stderr,
    keeping at most `cap` bytes of each; the rest is read and dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buffer = b""
        self.out = {1: bytearray(), 2: bytearray()}
        self.truncated = False

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 8:
            stream, length = self.buffer[0], int.from_bytes(self.buffer[4:8], "big")
            if len(self.buffer) < 8 + length:
                return
            payload, self.buffer = self.buffer[8 : 8 + length], self.buffer[8 + length :]
            self._keep(stream, payload)

    def _keep(self, stream: int, payload: bytes) -> None:
        target = self.out.get(stream)
        if target is None:
            return
        room = self.cap - len(target)
        if len(payload) > room:
            self.truncated = True
        if room > 0:
            target += payload[:room]


class DockerExec:
    """Commands in containers: `exec` of the contract and the runs the other parts use (held
    by the engine, which it receives: it uses the engine's client only)."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def exec(self, container_id: str, request: ExecRequest) -> ExecResult:
        command = list(request.argv) if request.argv is not None else ["/bin/bash", "-c", request.shell or ""]
        return self.run(
            container_id,
            tuple(command),
            user=request.user,
            cwd=request.cwd,
            env=request.env,
            stdin=request.stdin,
            timeout_s=request.timeout_s,
            max_output_bytes=request.max_output_bytes,
        )

    def run(
        self,
        container_id: str,
        command: tuple[str, ...],
        *,
        user: str = "user",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float = 60.0,
        max_output_bytes: int = 1024 * 1024,
    ) -> ExecResult:
        uid, home = self._exec_user(user)
        # The backstop deadline, marked with digits of this exec's own (common.py).
        mark = f"{timeout_s + EXEC_BACKSTOP_GRACE_S:.3f}{secrets.randbelow(10**EXEC_MARK_DIGITS):0{EXEC_MARK_DIGITS}d}"
        wrapped = ["timeout", "-s", "KILL", mark, *command]
        what = f"exec in sandbox {container_id[:12]}"
        started = time.monotonic()
        try:
            with _engine_call(what):
                exec_id = self._create(
                    container_id, wrapped, stdin is not None, uid, cwd, {"HOME": home, **(env or {})}
                )
        except RemoteError as exc:
            if exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.CONFLICT):
                # The engine refuses an exec in a container removed (404), paused or stopped (409).
                if exc.kind == ErrorKind.NOT_FOUND:
                    self.engine.forget(container_id)
                raise NotStarted(exc.kind, exc.message) from exc
            raise
        with _engine_call(what):
            stream = self._start(exec_id)
        try:
            if stdin is not None:
                # Fed from a thread: a command that writes while it reads would otherwise
                # block on its full stdout while we block on its full stdin.
                threading.Thread(target=self._feed_stdin, args=(stream, stdin), daemon=True).start()
            demux = _Demuxer(max_output_bytes)
            timed_out = not self._pump(stream, demux, started + timeout_s)
        finally:
            stream.close()
        if timed_out:
            self._kill_group(container_id, mark, user)
        exit_code = self._exit_code(exec_id, what, wait_s=2.0 if timed_out else 5.0)
        if exit_code is None and not timed_out:
            # The engine ends the stream only once the command has exited, so a stream that
            # ended while the command still runs was cut on the way. Nobody would read the
            # rest: stop the command rather than leave it running unobserved.
            self._kill_group(container_id, mark, user)
            raise RemoteError(
                ErrorKind.UNAVAILABLE,
                f"{what}: the connection to the Docker engine was cut while the command ran; it was stopped",
            )
        if timed_out or exit_code is None:
            exit_code = 137  # killed by SIGKILL, as a shell would report it
        if exit_code == 126 and bytes(demux.out[1]).startswith(_RUNTIME_REFUSED):
            # The runtime refused to start the command (its message on our stdout, exit 126):
            # e.g. a frozen container the engine calls running (docker/for-linux#891).
            reason = bytes(demux.out[1]).decode(errors="replace").strip()[:300]
            kind = ErrorKind.CONFLICT if b"paused" in demux.out[1] else ErrorKind.INTERNAL
            raise NotStarted(kind, f"{what}: the container runtime did not start the command ({reason})")
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(demux.out[1]),
            stderr=bytes(demux.out[2]),
            duration_s=time.monotonic() - started,
            truncated=demux.truncated,
            timed_out=timed_out,
        )

    # The engine's calls, on its unix socket directly when it is local (wire.py), else docker-py.

    def _create(
        self, container_id: str, argv: list[str], stdin: bool, uid: int, cwd: str | None, env: dict[str, str]
    ) -> str:
        wire = self.engine.wire
        if wire is None:
            kwargs = {"stdin": stdin, "user": f"{uid}:{uid}", "workdir": cwd, "environment": env}
            return str(self.engine.api.exec_create(container_id, argv, **kwargs)["Id"])
        body = {
            "User": f"{uid}:{uid}",
            "Privileged": False,
            "Tty": False,
            "AttachStdin": stdin,
            "AttachStdout": True,
            "AttachStderr": True,
            "Cmd": argv,
            "Env": [f"{name}={value}" for name, value in env.items()],
            "WorkingDir": cwd,
        }
        return wire.exec_create(container_id, body)

    def _start(self, exec_id: str) -> _ExecStream:
        wire = self.engine.wire
        if wire is None:
            return _ExecStream(self.engine.api.exec_start(exec_id, socket=True))
        sock, pending = wire.exec_start(exec_id)
        return _ExecStream(sock, pending)

    @staticmethod
    def _exec_user(user: str) -> tuple[int, str]:
        """(uid, home) of a contract user name; anything but "user" and "root" is invalid."""
        try:
            return _USERS[user]
        except KeyError:
            raise RemoteError(ErrorKind.INVALID, f"unknown user {user!r} (use 'user' or 'root')") from None

    @staticmethod
    def _feed_stdin(stream: _ExecStream, data: bytes) -> None:
        # A command that exits without reading its input closes the pipe, and a timeout closes
        # the socket under us: neither is a failure of the exec.
        with suppress(OSError):
            stream.send_all(data)
            stream.close_input()

    @staticmethod
    def _pump(stream: _ExecStream, demux: _Demuxer, deadline: float) -> bool:
        """Read until end of stream; False when the deadline passed first."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                chunk = stream.recv(65536, remaining)
            except TimeoutError:
                return False
            except OSError:
                return True
            if not chunk:
                return True
            demux.feed(chunk)

    def _kill_group(self, container_id: str, mark: str, user: str) -> None:
        """Kill a timed-out command's whole process group inside the sandbox, found by the
        exec's mark. As the command's own user: its processes are that user's, and a mark a
        session user copies into a process of theirs then names nothing root's to kill."""
        with suppress(RemoteError):
            self.run(container_id, ("/bin/sh", "-c", _KILL_GROUP, mark), user=user, timeout_s=10)

    def _exit_code(self, exec_id: str, what: str, wait_s: float) -> int | None:
        """The exec's exit code, or None while it still runs after wait_s."""
        deadline = time.monotonic() + wait_s
        pause = 0.002  # the engine records the exit a moment after the stream ends: ask again soon
        while True:
            with _engine_call(what):
                wire = self.engine.wire
                state = wire.exec_inspect(exec_id) if wire is not None else self.engine.api.exec_inspect(exec_id)
            if not state.get("Running"):
                code = state.get("ExitCode")
                return int(code) if code is not None else None
            if time.monotonic() > deadline:
                return None
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def run_checked(self, container_id: str, command: tuple[str, ...], what: str, user: str = "root") -> bytes:
        result = self.run(container_id, command, user=user, cwd="/", timeout_s=60)
        if result.exit_code == 0:
            return result.stdout
        _raise_for_command(result, what)
