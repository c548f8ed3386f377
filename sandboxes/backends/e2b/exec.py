"""Reading an envd `process.Start` stream into an `ExecResult` (output capped per stream)."""

from __future__ import annotations

import base64

import httpx

from ..base import (
    ExecResult,
    RemoteError,
)
from .common import _FLAG_END_STREAM, _SIGNAL_NUMBERS, connect_error, iter_envelopes

# ---------------------------------------------------------------------------------------
# Exec stream reader


class _ExecReader:
    """Reads a process.Start stream: output (capped per stream), exit, stream errors."""

    def __init__(self, response: httpx.Response, cap: int) -> None:
        self.response = response
        self.cap = cap
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False
        self.ended = False
        self.exit_code = -1
        self.signalled = False
        self.status = ""
        self.error: RemoteError | None = None

    def run(self) -> None:
        try:
            for flags, message in iter_envelopes(self.response.iter_raw()):
                if flags & _FLAG_END_STREAM:
                    if message.get("error"):
                        self.error = connect_error(message["error"], "running the command")
                    return
                event = message.get("event") or {}
                if "data" in event:
                    for stream, value in event["data"].items():
                        if stream in self.out:
                            self._keep(self.out[stream], base64.b64decode(value))
                elif "end" in event:
                    # proto3 JSON omits defaults: no exitCode is 0, no `exited` is false.
                    end = event["end"]
                    self.ended = True
                    self.exit_code = int(end.get("exitCode", 0) or 0)
                    self.signalled = not end.get("exited", False)
                    self.status = str(end.get("status") or "")
        except RemoteError as exc:
            self.error = exc  # an envelope refused at its header
        except (httpx.HTTPError, OSError, ValueError, RuntimeError):
            return  # closed by the caller, or cut: `ended` tells which

    def _keep(self, target: bytearray, data: bytes) -> None:
        room = self.cap - len(target)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            target += data[:room]

    def result(self, duration: float, *, timed_out: bool) -> ExecResult:
        exit_code = self.exit_code
        if timed_out:
            exit_code = 137  # killed, as a shell reports SIGKILL
        elif self.signalled and exit_code <= 0:
            # Ended by a signal (envd: exitCode -1 or omitted): 128 + the signal, as a shell does.
            name = self.status.removeprefix("signal: ").removesuffix(" (core dumped)").strip().lower()
            exit_code = 128 + _SIGNAL_NUMBERS.get(name, 9)
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(self.out["stdout"]),
            stderr=bytes(self.out["stderr"]),
            duration_s=duration,
            truncated=self.truncated,
            timed_out=timed_out,
        )
