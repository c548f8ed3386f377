"""Interactive shells in E2B sandboxes: envd PTY processes over a Connect stream."""

from __future__ import annotations

import base64
import threading
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING

import httpx

from ..base import ErrorKind, PtySize, RemoteError
from ..capabilities import PtyCapability, PtyHandle
from .common import _FLAG_END_STREAM, connect_error, iter_envelopes, translating

if TYPE_CHECKING:
    from .backend import E2BBackend


# ---------------------------------------------------------------------------------------
# PTY


class E2BPtys(PtyCapability):
    """Terminals as envd PTY processes (`process.Process/Start` with `pty`). The stream has no
    deadline (the SDK's `timeout=0`), and asks for keepalive events."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

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
        envs = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **(env or {})}
        body = self.backend._start_body(sandbox_id, command, cwd=cwd, env=envs, pty=size.clamped())
        response = self.backend.open_stream(
            sandbox_id, "process.Process/Start", body, f"opening a terminal in sandbox {sandbox_id}", user=user
        )
        handle = E2BPty(self.backend, sandbox_id, response)
        handle.wait_started()
        return handle


class E2BPty(PtyHandle):
    """One PTY process; a reader thread moves its output into a buffer."""

    def __init__(self, backend: E2BBackend, sandbox_id: str, response: httpx.Response) -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        self.response = response
        self.pid: int | None = None
        self.pty_id = ""
        self._buffer = bytearray()
        self._cond = threading.Condition()
        self._ended = False
        self._dropped = False
        self._error: RemoteError | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._pump, name=f"e2b-pty-{sandbox_id[:12]}", daemon=True)
        self._thread.start()

    def wait_started(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.pid is not None or self._ended or self._dropped, timeout)
        if self.pid is None:
            self.response.close()
            raise self._error or RemoteError(ErrorKind.UNAVAILABLE, "the terminal did not start")

    def _pump(self) -> None:
        clean = False
        try:
            for flags, message in iter_envelopes(self.response.iter_raw()):
                if flags & _FLAG_END_STREAM:
                    if message.get("error"):
                        self._error = connect_error(message["error"], "terminal")
                    clean = True
                    break
                event = message.get("event") or {}
                with self._cond:
                    if "start" in event:
                        self.pid = int(event["start"]["pid"])
                        self.pty_id = str(self.pid)
                    elif "data" in event and "pty" in event["data"]:
                        self._buffer += base64.b64decode(event["data"]["pty"])
                    elif "end" in event:
                        clean = True
                    self._cond.notify_all()
        except RemoteError as exc:
            self._error = exc  # an envelope refused at its header
        except (httpx.HTTPError, OSError, ValueError, RuntimeError):
            pass
        with self._cond:
            self._ended = True
            # A stream that stops without the end event or end envelope was cut.
            self._dropped = not clean and not self._closing
            self._cond.notify_all()

    def read(self, max_bytes: int = 65536, timeout: float | None = None) -> bytes:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._buffer) or self._ended, timeout):
                raise RemoteError(ErrorKind.TIMEOUT, "no terminal output in time")
            if self._buffer:
                data = bytes(self._buffer[:max_bytes])
                del self._buffer[:max_bytes]
                return data
            if self._dropped:
                raise self._cut()
            return b""

    def _cut(self) -> RemoteError:
        return RemoteError(ErrorKind.UNAVAILABLE, f"the terminal stream of sandbox {self.sandbox_id} was cut")

    def _require_pid(self) -> int:
        """The shell's pid, while it runs: input or a resize after a cut stream reports the cut,
        as the next read does, not a terminal that ended."""
        if self._dropped:
            raise self._cut()
        if self.pid is None or self._ended:
            raise RemoteError(ErrorKind.GONE, "the terminal has ended")
        return self.pid

    def write(self, data: bytes) -> None:
        pid = self._require_pid()
        self.backend.rpc(
            self.sandbox_id,
            "process.Process/SendInput",
            {"process": {"pid": pid}, "input": {"pty": base64.b64encode(data).decode()}},
            "terminal input",
        )

    def resize(self, size: PtySize) -> None:
        pid = self._require_pid()
        size = size.clamped()
        self.backend.rpc(
            self.sandbox_id,
            "process.Process/Update",
            {"process": {"pid": pid}, "pty": {"size": {"cols": size.cols, "rows": size.rows}}},
            "terminal resize",
        )

    def kill(self) -> None:
        if self.pid is not None and not self._ended:
            with suppress(RemoteError):
                self.backend.rpc(
                    self.sandbox_id,
                    "process.Process/SendSignal",
                    {"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"},
                    "terminal kill",
                )
            with self._cond:
                self._cond.wait_for(lambda: self._ended, 5)
        with self._cond:
            self._closing = True
        self.response.close()
        self._thread.join(5)

    def is_running(self) -> bool:
        return self.pid is not None and not self._ended


translating(E2BPtys, "open")
translating(E2BPty, "read", "write", "resize", "kill")
