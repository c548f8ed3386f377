"""The capability half of the sandbox contract: what a backend may offer beyond the core
lifecycle, each an ABC returned by one of `Backend`'s accessors (`files()`, `snapshots()`,
`templates()`, `inbound()`, `egress()`, `stats()`, `logs()`, `volumes()`, `pty()`, `warm_pools()`;
None when the backend has not got it), with the values only these capabilities carry
(`EgressRefusal`, `SandboxStats`, `SandboxLogs`, `PtyHandle`).

May import: the standard library, `netpolicy` and `.base` (errors, DTOs); like `.base` a
leaf, nothing else of the project.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

from netpolicy import AddressClass

from .base import (
    ErrorKind,
    FileInfo,
    NetworkSpec,
    PtySize,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SnapshotInfo,
    TemplateBuildSpec,
    TemplateInfo,
    VolumeInfo,
)


class FilesCapability(abc.ABC):
    @abc.abstractmethod
    def write(
        self, sandbox_id: str, path: str, data: bytes, *, mode: int | None = None, user: str = "user"
    ) -> FileInfo: ...

    @abc.abstractmethod
    def read(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes: ...

    @abc.abstractmethod
    def list(self, sandbox_id: str, path: str) -> list[FileInfo]: ...

    @abc.abstractmethod
    def make_dir(self, sandbox_id: str, path: str, *, user: str = "user") -> None: ...

    @abc.abstractmethod
    def remove(self, sandbox_id: str, path: str) -> None: ...

    @abc.abstractmethod
    def stat(self, sandbox_id: str, path: str) -> FileInfo: ...


class SnapshotsCapability(abc.ABC):
    @abc.abstractmethod
    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        """Snapshot a running sandbox; the sandbox keeps running afterwards."""

    @abc.abstractmethod
    def list(self) -> list[SnapshotInfo]: ...

    @abc.abstractmethod
    def delete(self, snapshot_id: str) -> None:
        """Idempotent: deleting a missing snapshot succeeds."""


class TemplatesCapability(abc.ABC):
    @abc.abstractmethod
    def list(self) -> list[TemplateInfo]:
        """Templates only: snapshots are never in this list."""

    @abc.abstractmethod
    def get(self, template_id: str) -> TemplateInfo: ...

    @abc.abstractmethod
    def create(self, spec: TemplateBuildSpec) -> TemplateInfo: ...

    @abc.abstractmethod
    def delete(self, template_id: str) -> None:
        """Refuses (conflict) a template that live sandboxes use."""


class InboundCapability(abc.ABC):
    # The request header carrying the traffic token to `public_url` ("" = not known).
    token_header: ClassVar[str] = ""
    # True when `public_url` is the console's own inbound route (its proxy then connects to
    # `console_upstream`); False when the backend's own edge serves it.
    served_by_console: ClassVar[bool] = False

    @abc.abstractmethod
    def public_url(self, sandbox_id: str, port: int) -> str: ...

    @abc.abstractmethod
    def traffic_token(self, sandbox_id: str) -> str | None: ...

    def console_upstream(self, sandbox_id: str, port: int) -> tuple[str, int]:
        """Where the console's inbound proxy connects for `port` of a running sandbox: the
        sandbox's own address (never one a caller names). Raises `conflict` when the sandbox
        is not running, `unsupported` when the backend serves its URLs itself."""
        raise RemoteError(ErrorKind.UNSUPPORTED, "this backend serves its public URLs itself")


@dataclass(frozen=True)
class EgressRefusal:
    """One refused outbound attempt, read back from the enforcing components' logs."""

    at: datetime
    sandbox_id: str
    layer: str  # "dns" | "packet" | "http" | "tls"
    destination: str  # a name, or address[:port]; for HTTP the URL without its query
    rule: str  # which rule refused it, in words ("not in the allow list", "deny entry 10.0.0.0/8", ...)
    detail: str = ""


class EgressCapability(abc.ABC):
    """Network policy applied to running sandboxes, and refused attempts read back."""

    @abc.abstractmethod
    def update(self, sandbox_id: str, network: NetworkSpec) -> None:
        """Apply a changed NetworkSpec to a running sandbox now (no recreate)."""

    @abc.abstractmethod
    def refusals(self, cursor: str) -> tuple[list[EgressRefusal], str]:
        """Refusals recorded after `cursor` ("" = from the start of what is kept), and the cursor
        to pass next time. Never raises for an empty log, and changes nothing (a read)."""

    def reserved(self) -> tuple[AddressClass, ...]:
        """The backend's own never-reachable ranges (its host's addresses, other sandboxes'
        networks), which `netpolicy.decide` judges besides the fixed classes. Read-only."""
        return ()

    def housekeeping(self) -> str:
        """Periodic upkeep of the enforcing components (pruning what sandboxes and networks
        left, refreshing, rotating logs), never done as a side effect of a read. Returns one
        line for the log."""
        return "nothing to do"


@dataclass(frozen=True)
class SandboxStats:
    """One reading of a running sandbox's resource use. A field the backend does not report
    is None. CPU as `docker stats` counts it: 100.0 = one CPU busy for the whole interval."""

    cpu_percent: float | None = None
    cpu_count: float | None = None  # CPUs the sandbox may use (None: not limited / unknown)
    memory_bytes: int | None = None  # in use, page cache left out
    memory_limit_bytes: int | None = None
    net_rx_bytes: int | None = None  # received since the sandbox started
    net_tx_bytes: int | None = None
    read_at: float = 0.0  # unix time of the reading


class StatsCapability(abc.ABC):
    """Resource use of a running sandbox, read once (never starts or resumes it)."""

    @abc.abstractmethod
    def read(self, sandbox_id: str) -> SandboxStats:
        """The sandbox's current use; raises RemoteError (NOT_FOUND, CONFLICT when it is not
        running) like the other calls."""

    def memory_bytes(self, sandbox_id: str) -> int | None:
        """Only the memory in use, as `read` gives it; a backend whose `read` waits for a CPU
        interval answers this one at once (the Pools page reads it on every refresh)."""
        return self.read(sandbox_id).memory_bytes


MAX_LOG_LINES = 2000
MAX_LOG_BYTES = 256 * 1024


@dataclass(frozen=True)
class SandboxLogs:
    """The end of a sandbox's own output (its main process's stdout and stderr, interleaved as
    the backend keeps them), at most `MAX_LOG_LINES` lines and `MAX_LOG_BYTES` bytes.
    `truncated`: earlier output exists that is left out."""

    data: bytes
    truncated: bool = False


class LogsCapability(abc.ABC):
    """What the sandbox itself printed, read once: never starts or resumes it."""

    @abc.abstractmethod
    def read(self, sandbox_id: str, *, tail: int = 200) -> SandboxLogs:
        """The last `tail` lines (1 to `MAX_LOG_LINES`), cut to the last `MAX_LOG_BYTES`;
        raises RemoteError (NOT_FOUND for a sandbox that is gone) like the other calls."""


def bounded_logs(data: bytes, tail: int) -> SandboxLogs:
    """`data`'s last `tail` lines within `MAX_LOG_BYTES` (cut at a line start when it can)."""
    lines = data.splitlines(keepends=True)
    truncated = len(lines) > tail
    kept = b"".join(lines[-tail:])
    if len(kept) > MAX_LOG_BYTES:
        kept = kept[-MAX_LOG_BYTES:]
        newline = kept.find(b"\n")
        kept = kept[newline + 1 :] if 0 <= newline < len(kept) - 1 else kept
        truncated = True
    return SandboxLogs(kept, truncated)


class VolumesCapability(abc.ABC):
    """Persistent storage for /workspace that outlives a sandbox (SandboxSpec.workspace_volume).

    A backend without it returns None from `volumes()` and ignores no spec silently: create
    refuses a `workspace_volume` it cannot honour.
    """

    def check(self) -> str:
        """That workspaces can be made on this account now, in one cheap call; raises
        RemoteError (`unsupported` when the account has no volumes) and says what it saw."""
        return "available"

    def list(self, metadata: Mapping[str, str]) -> builtins.list[VolumeInfo]:
        """The workspace volumes carrying every key and value of `metadata` (the console's
        labels), for clean-up. A backend whose volumes keep no labels returns []: its
        workspaces are found by their session's name (`Session.workspace_volume`)."""
        return []

    @abc.abstractmethod
    def delete(self, name: str) -> None:
        """Delete a workspace volume (idempotent). Delete the sandboxes that mount it first:
        Docker refuses while one does (conflict), E2B and Cube delete it under them."""


class PtyHandle(abc.ABC):
    """One interactive shell. Blocking methods; async callers run them in an executor."""

    pty_id: str

    @abc.abstractmethod
    def read(self, max_bytes: int = 65536, timeout: float | None = None) -> bytes:
        """Next bytes of output; b"" at end of stream. Raises RemoteError(timeout) on timeout."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def resize(self, size: PtySize) -> None: ...

    @abc.abstractmethod
    def kill(self) -> None:
        """End the shell process inside the sandbox (idempotent)."""

    @abc.abstractmethod
    def is_running(self) -> bool: ...

    def fileno(self) -> int | None:
        """A readable file descriptor for event-loop integration, when the backend has one."""
        return None


class PtyCapability(abc.ABC):
    @abc.abstractmethod
    def open(
        self,
        sandbox_id: str,
        size: PtySize,
        *,
        command: tuple[str, ...] = ("bash", "-l"),
        user: str = "user",
        cwd: str = "/workspace",
        env: Mapping[str, str] | None = None,
    ) -> PtyHandle: ...


class WarmPoolCapability(abc.ABC):
    """Sandboxes the backend itself keeps ready ahead of demand (a native warm pool, as
    kubernetes-sigs/agent-sandbox's SandboxWarmPool). A backend without it returns None from
    `warm_pools()`, and the console keeps the pool itself from `create`, `pause` and `connect`
    (sandboxes/pools/). `pool` names one pool: a config's, for one template and network spec."""

    @abc.abstractmethod
    def ensure(self, pool: str, spec: SandboxSpec, size: int) -> tuple[int, int]:
        """Keep `size` sandboxes made from `spec` ready under `pool` (0: drain it); returns
        (ready, being made) now. Idempotent."""

    @abc.abstractmethod
    def claim(self, pool: str, spec: SandboxSpec) -> SandboxInfo | None:
        """Take one ready sandbox of `pool` for a session, running, with `spec`'s metadata,
        network and workspace applied; one caller gets each sandbox. None when none is ready."""

    @abc.abstractmethod
    def pools(self) -> dict[str, tuple[int, int]]:
        """Every pool the backend keeps for this console, by the name `ensure` was given (the
        console reads a config's pools from it: their names start with the config's id):
        (ready, being made) of each. One read, changing nothing; the Pools pages, /metrics and
        the refill that drains a config's outdated pools ask it."""

    @abc.abstractmethod
    def drain(self, pool: str) -> None:
        """Stop keeping `pool`: its ready sandboxes go and none is made for it again (a skill
        install or a policy change moved the config to another pool, or the config goes).
        Idempotent: draining a pool that is not kept succeeds."""
