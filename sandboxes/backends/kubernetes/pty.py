"""Interactive shells in a sandbox's pod: `pods/exec` with a TTY (`KubernetesPtys`).

The shell starts through the same launcher as `exec` (user, working directory, environment),
records its pid in a file first, then becomes the command. The size goes on the resize
channel (4) right after the stream opens and at every `resize`. The stream carries no kill, so
`kill` signals the recorded pid from a second exec (HUP, then KILL), as the Docker adapter
does, then closes the stream. Output is read from the websocket frames by `read` (no
descriptor is offered: TLS may hold decrypted frames a poll on the socket would not see).

May import: the contract, `.stream` and `.exec`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from contextlib import suppress

from ..base import ErrorKind, PtySize, RemoteError
from ..capabilities import PtyCapability, PtyHandle
from .exec import PID_DIRS, PodExec, PodRef, check_user, launched, with_env
from .stream import STATUS, STDIN, STDOUT, ChannelStream

# argv: PIDFILE DIR COMMAND...
SHELL_RUN = (
    'f=$1; dir=$2; shift 2; if [ -n "$dir" ]; then cd -- "$dir" 2>/dev/null || cd; fi; '
    'echo $$ > "$f" 2>/dev/null; exec "$@"'
)
# argv: PIDFILE. Only a pid above 1 (the file is the shell user's to rewrite).
SHELL_KILL = (
    'pid=$(cat "$1" 2>/dev/null) || exit 0; '
    'case "$pid" in ""|*[!0-9]*|0|1) rm -f "$1"; exit 0;; esac; kill -HUP "$pid" 2>/dev/null; '
    "for i in 1 2 3 4 5 6 7 8 9 10; do "
    'kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; '
    'kill -KILL "$pid" 2>/dev/null; rm -f "$1"; true'
)


class KubernetesPtys(PtyCapability):
    def __init__(self, pods: PodExec) -> None:
        self.pods = pods

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
        if not command:
            raise RemoteError(ErrorKind.INVALID, "empty terminal command")
        pod = self.pods.locate(sandbox_id)
        pty_id = secrets.token_hex(8)
        pid_file = f"{PID_DIRS[check_user(user)]}/.console-pty-{pty_id}.pid"
        envs = {"TERM": "xterm-256color", **(env or {})}
        argv = launched(user, SHELL_RUN, pid_file, cwd or "", *with_env(user, envs, command))
        stream = self.pods.open(pod, argv, stdin=True, tty=True, what=f"opening a terminal in sandbox {sandbox_id}")
        handle = KubernetesPty(self.pods, pod, stream, pty_id, pid_file, user)
        try:
            handle.resize(size)
        except RemoteError:
            handle.kill()
            raise
        return handle


class KubernetesPty(PtyHandle):
    """One TTY exec; `read` from one thread, `write` and `resize` from any."""

    def __init__(
        self, pods: PodExec, pod: PodRef, stream: ChannelStream, pty_id: str, pid_file: str, user: str
    ) -> None:
        self.pods = pods
        self.pod = pod
        self.stream = stream
        self.pty_id = pty_id
        self.pid_file = pid_file
        self.user = user
        self.status: bytes | None = None
        self._pending = b""

    def read(self, max_bytes: int = 65536, timeout: float | None = None) -> bytes:
        while not self._pending:
            try:
                message = self.stream.recv(timeout)
            except TimeoutError:
                raise RemoteError(ErrorKind.TIMEOUT, "no terminal output in time") from None
            if message is None:
                return b""
            channel, data = message
            if channel == STATUS:
                self.status = (self.status or b"") + data
            elif channel == STDOUT:
                self._pending = data
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    def write(self, data: bytes) -> None:
        if self.stream.ended:
            raise RemoteError(ErrorKind.GONE, f"terminal {self.pty_id} is closed")
        self.stream.send(STDIN, data)

    def resize(self, size: PtySize) -> None:
        size = size.clamped()
        self.stream.resize(size.cols, size.rows)

    def kill(self) -> None:
        if self.is_running():
            with suppress(RemoteError):
                kill = ("/bin/sh", "-c", SHELL_KILL, "sh", self.pid_file)
                self.pods.run(self.pod, kill, user=self.user, timeout_s=10, what="ending a terminal")
        self.stream.close()

    def is_running(self) -> bool:
        return not self.stream.ended and self.status is None
