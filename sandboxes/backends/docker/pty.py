"""Interactive shells in Docker sandboxes: TTY execs on the hijacked socket."""

from __future__ import annotations

import secrets
import select
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING

from ..base import ErrorKind, PtySize, RemoteError
from ..capabilities import PtyCapability, PtyHandle
from .common import PTY_PID_DIRS, _engine_call
from .exec import DockerExec, _ExecStream

if TYPE_CHECKING:
    from .engine import DockerEngine


# ---------------------------------------------------------------------------------------
# PTY


class DockerPtys(PtyCapability):
    """Interactive shells as TTY execs on the hijacked socket."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def open(
        self,
        sandbox_id: str,
        size: PtySize,
        *,
        command: tuple[str, ...] = ("bash", "-l"),
        user: str = "user",
        cwd: str = "/workspace",
        env: Mapping[str, str] | None = None,
    ) -> PtyHandle:
        container_id = self.engine.container_id(sandbox_id)
        uid, home = DockerExec._exec_user(user)
        pty_id = secrets.token_hex(8)
        folder, mode = PTY_PID_DIRS[user]
        # Record the in-container pid (exec_inspect's Pid is the host's) before becoming the shell.
        launcher = f'mkdir -p -m {mode} {folder} 2>/dev/null; echo $$ > {_pid_file(user, pty_id)}; exec "$@"'
        api = self.engine.api
        with _engine_call(f"opening a terminal in sandbox {sandbox_id}"):
            exec_id = api.exec_create(
                container_id,
                ["/bin/sh", "-c", launcher, "sh", *command],
                stdin=True,
                tty=True,
                user=f"{uid}:{uid}",
                workdir=cwd,
                environment={"TERM": "xterm-256color", "HOME": home, **(env or {})},
            )["Id"]
            stream = _ExecStream(api.exec_start(exec_id, tty=True, socket=True))
        handle = DockerPty(self.engine, container_id, exec_id, pty_id, stream, user=user)
        try:
            handle.resize(size)
        except RemoteError:
            # A command that ended at once cannot be resized ("no such exec"); its output is
            # still in the stream, so only a running one that refuses the size is an error.
            if handle.is_running():
                handle.kill()
                raise
        return handle


class DockerPty(PtyHandle):
    """One TTY exec. The first resize waits until the engine reports the exec as started."""

    def __init__(
        self,
        engine: DockerEngine,
        container_id: str,
        exec_id: str,
        pty_id: str,
        stream: _ExecStream,
        user: str = "user",
    ):
        self.engine = engine
        self.user = user  # the kill runs as the shell's own user (its pid file is theirs)
        self.container_id = container_id
        self.exec_id = exec_id
        self.pty_id = pty_id
        self.stream = stream
        self.pid_file = _pid_file(user, pty_id)
        self._started = False

    def read(self, max_bytes: int = 65536, timeout: float | None = None) -> bytes:
        try:
            return self.stream.recv(max_bytes, timeout)
        except TimeoutError:
            raise RemoteError(ErrorKind.TIMEOUT, "no terminal output in time") from None
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        try:
            self.stream.send_all(data)
        except OSError as exc:
            raise RemoteError(ErrorKind.GONE, f"terminal {self.pty_id} is closed") from exc

    def resize(self, size: PtySize) -> None:
        size = size.clamped()
        deadline = time.monotonic() + (0 if self._started else 2.0)
        while True:
            try:
                with _engine_call("resizing the terminal"):
                    self.engine.api.exec_resize(self.exec_id, height=size.rows, width=size.cols)
                self._started = True
                return
            except RemoteError:
                # Docker refuses a resize before the exec runs (500); retry briefly once.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.is_running():
            script = (
                # A session user's file is theirs to rewrite: only a process id above 1 is
                # signalled (not -1, every process, nor tini, whose end stops the sandbox).
                'pid=$(cat "$0" 2>/dev/null) || exit 0; '
                'case "$pid" in ""|*[!0-9]*|0|1) rm -f "$0"; exit 0;; esac; kill -HUP "$pid" 2>/dev/null; '
                "for i in 1 2 3 4 5 6 7 8 9 10; do "
                'kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; '
                'kill -KILL "$pid" 2>/dev/null; rm -f "$0"; true'
            )
            with suppress(RemoteError):
                self.engine.run(self.container_id, ("/bin/sh", "-c", script, self.pid_file), user=self.user)
        self.stream.close()

    def is_running(self) -> bool:
        try:
            with _engine_call("terminal status"):
                return bool(self.engine.api.exec_inspect(self.exec_id).get("Running"))
        except RemoteError:
            return False

    def fileno(self) -> int | None:
        # Bytes already read ahead are served by read(); event loops should call it once
        # before waiting on the descriptor.
        return self.stream.raw.fileno()

    def has_pending(self) -> bool:
        """True when read() can answer without waiting on the socket."""
        if self.stream.pending:
            return True
        poller = select.poll()
        poller.register(self.stream.raw, select.POLLIN | select.POLLHUP)
        return bool(poller.poll(0))


def _pid_file(user: str, pty_id: str) -> str:
    """Where the terminal `pty_id` of `user` records its shell's pid (common.PTY_PID_DIRS)."""
    return f"{PTY_PID_DIRS[user][0]}/{pty_id}.pid"
