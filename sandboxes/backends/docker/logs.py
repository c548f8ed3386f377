"""A Docker sandbox's own output: the container's logs (its main process's stdout and stderr,
as the engine's log driver keeps them), read once and bounded.

The engine is asked for one line more than wanted (so a longer history is told apart) and its
answer is streamed, keeping only the last bytes: a process printing one endless line costs a
bounded buffer, never the whole log. A paused or stopped container's logs are read as they are
(nothing is resumed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import ErrorKind, RemoteError
from ..capabilities import MAX_LOG_BYTES, MAX_LOG_LINES, LogsCapability, SandboxLogs, bounded_logs
from .common import _engine_call

if TYPE_CHECKING:
    from .engine import DockerEngine

KEEP_BYTES = 2 * MAX_LOG_BYTES  # read past the cap, so `bounded_logs` can cut at a line start


class DockerLogs(LogsCapability):
    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def read(self, sandbox_id: str, *, tail: int = 200) -> SandboxLogs:
        if not 1 <= tail <= MAX_LOG_LINES:
            raise RemoteError(ErrorKind.INVALID, f"tail is 1 to {MAX_LOG_LINES} lines")
        container_id = self.engine.container_id(sandbox_id)
        kept = bytearray()
        cut = False
        with _engine_call("reading the sandbox's logs"):
            # docker-py follows a streamed log unless told not to: it would never end.
            stream = self.engine.api.logs(
                container_id, stdout=True, stderr=True, stream=True, follow=False, tail=tail + 1
            )
            try:
                for chunk in stream:
                    kept += chunk
                    if len(kept) > KEEP_BYTES:
                        del kept[: len(kept) - KEEP_BYTES]
                        cut = True
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
        logs = bounded_logs(bytes(kept), tail)
        return SandboxLogs(logs.data, logs.truncated or cut)
