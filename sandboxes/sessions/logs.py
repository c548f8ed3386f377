"""The session page's Logs card: the end of what its sandbox itself printed, where the backend
offers it (`Backend.logs()`), read once and bounded (`capabilities.MAX_LOG_LINES`,
`MAX_LOG_BYTES`).

Reads only, like the stats panel: the binding from the store and one call of the capability,
never `connect` (which resumes a paused sandbox). A backend without the capability, a session
without a sandbox and a sandbox that is gone are said in words.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.base import RemoteError
from ..backends.capabilities import MAX_LOG_LINES
from ..catalog.bridge import get_backend
from ..catalog.lookups import failure_message
from ..models import Session
from .runtime import GONE_KINDS, Runtime

DEFAULT_TAIL = 200
TAILS = (50, 200, 1000, MAX_LOG_LINES)


@dataclass(frozen=True)
class LogsReading:
    # shown (text set, maybe empty), unsupported, none (no sandbox), error
    status: str
    message: str = ""
    text: str = ""
    truncated: bool = False
    tail: int = DEFAULT_TAIL


def tail_of(value: str | None) -> int:
    """The lines asked for, one of `TAILS` (anything else: the default)."""
    try:
        tail = int(value or DEFAULT_TAIL)
    except ValueError:
        return DEFAULT_TAIL
    return tail if tail in TAILS else DEFAULT_TAIL


def read_session_logs(session: Session, tail: int = DEFAULT_TAIL, runtime: Runtime | None = None) -> LogsReading:
    runtime = runtime or Runtime()
    try:
        capability = get_backend(session.config).logs()
    except RemoteError as exc:
        return LogsReading("error", f"The backend could not be reached: {failure_message(exc)}", tail=tail)
    if capability is None:
        kind = session.config.get_kind_display()
        return LogsReading("unsupported", f"This session's backend ({kind}) does not offer the sandbox's output.")
    try:
        binding = runtime.store.get_binding(runtime.keys(session)[0])
    except RemoteError as exc:
        return LogsReading("error", f"The session store did not answer: {exc.message}", tail=tail)
    if binding is None:
        return LogsReading("none", "No sandbox is bound: one starts with the session's next turn.", tail=tail)
    try:
        logs = capability.read(binding.sandbox_id, tail=tail)
    except RemoteError as exc:
        if exc.kind in GONE_KINDS:
            return LogsReading("none", "The sandbox is gone: a new one starts with the next turn.", tail=tail)
        return LogsReading("error", failure_message(exc), tail=tail)
    return LogsReading("shown", text=logs.data.decode(errors="replace"), truncated=logs.truncated, tail=tail)
