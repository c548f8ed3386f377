"""Live resource use of a session's sandbox (CPU, memory, network) for the session page.

Reads only: the binding from the store, the sandbox's state with the backend's `get` (never
`connect`, which resumes a paused sandbox) and, when it runs, one reading of the backend's
optional stats capability. A paused, stopped or missing sandbox is reported as such, and a
backend without the capability says so; nothing is created, resumed or rebuilt.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from ..backends.base import RemoteError, SandboxState
from ..backends.capabilities import SandboxStats, StatsCapability
from ..catalog.bridge import get_backend
from ..models import Session
from .runtime import GONE_KINDS, Runtime


@dataclass(frozen=True)
class StatsReading:
    # running (stats set), paused, stopped, none (no sandbox), unsupported, error
    status: str
    message: str = ""
    stats: SandboxStats | None = None
    sandbox_id: str = ""

    @property
    def memory_percent(self) -> float | None:
        s = self.stats
        if s is None or s.memory_bytes is None or not s.memory_limit_bytes:
            return None
        return round(s.memory_bytes / s.memory_limit_bytes * 100, 1)


def read_session_stats(session: Session, runtime: Runtime | None = None) -> StatsReading:
    runtime = runtime or Runtime()
    try:
        binding = runtime.store.get_binding(runtime.keys(session)[0])
    except RemoteError as exc:
        return StatsReading("error", f"The session store did not answer: {exc.message}")
    if binding is None:
        return StatsReading("none", "No sandbox is bound: one starts with the session's next turn.")
    backend = get_backend(session.config)
    capability = backend.stats()
    if capability is None:
        return StatsReading("unsupported", "This backend does not report resource use.", sandbox_id=binding.sandbox_id)
    try:
        info = backend.get(binding.sandbox_id)
        if info.state != SandboxState.RUNNING:
            return StatsReading(
                str(info.state),
                f"The sandbox is {info.state}: no live figures (resume the session to see them).",
                sandbox_id=binding.sandbox_id,
            )
        return StatsReading("running", stats=capability.read(binding.sandbox_id), sandbox_id=binding.sandbox_id)
    except RemoteError as exc:
        if exc.kind in GONE_KINDS:
            return StatsReading("none", "The sandbox is gone: a new one starts with the next turn.")
        return StatsReading("error", f"The backend said {exc.kind}: {exc.message}", sandbox_id=binding.sandbox_id)


USAGE_WORKERS = 8
USAGE_TIMEOUT_S = 5.0


def read_usage(sessions: list[Session]) -> dict[str, SandboxStats]:
    """One stats reading per running session of a list page, read side by side (a Docker
    reading takes the engine about a second), given up after `USAGE_TIMEOUT_S`. Reads the
    sandbox id the row last saw: a page's figures, never a decision. Sessions whose backend
    has no stats, or whose reading failed or came late, are left out."""
    readers: dict[str, tuple[StatsCapability, str]] = {}
    for session in sessions:
        if session.state != SandboxState.RUNNING or not session.sandbox_id:
            continue
        try:
            capability = get_backend(session.config).stats()
        except RemoteError:  # a backend that cannot be reached or built: no figures, no error page
            continue
        if capability is not None:
            readers[str(session.id)] = (capability, session.sandbox_id)
    if not readers:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(USAGE_WORKERS, len(readers)), thread_name_prefix="usage")
    futures = {key: pool.submit(capability.read, sandbox_id) for key, (capability, sandbox_id) in readers.items()}
    done, _ = wait(futures.values(), timeout=USAGE_TIMEOUT_S)
    pool.shutdown(wait=False, cancel_futures=True)
    figures: dict[str, SandboxStats] = {}
    for key, future in futures.items():
        if future in done and future.exception() is None:
            figures[key] = future.result()
    return figures
