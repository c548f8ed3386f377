"""The neutral sandbox contract every backend implements: the errors, states, DTOs and the
`Backend` ABC; the optional capabilities its accessors return are in `.capabilities`.

This module is a leaf: it imports nothing of the project (no ORM, no settings, no tenancy),
so adapters run the same in web workers, Celery tasks and async consumers. Everything that
crosses the boundary is a frozen dataclass; every failure is a `RemoteError` with a stable
`kind`. Callers decide which features to offer from the capability accessors (`files()`,
`snapshots()`, `templates()`, `inbound()`, `pty()`, `network_capabilities()`), never from
the backend's name.

May import: the standard library and `netpolicy` (the policy's meaning; `.capabilities` and
`.settings` for annotations, under TYPE_CHECKING: they import this module).
"""

from __future__ import annotations

import abc
import builtins
import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from netpolicy import Policy

if TYPE_CHECKING:
    from .capabilities import (
        EgressCapability,
        FilesCapability,
        InboundCapability,
        LogsCapability,
        PtyCapability,
        SnapshotsCapability,
        StatsCapability,
        TemplatesCapability,
        VolumesCapability,
        WarmPoolCapability,
    )
    from .settings import Options

# Metadata keys the console stamps on every sandbox it creates. Listing by them is how the
# console claims, reconciles and reaps; a sandbox without META_INSTALLATION is never touched.
META_INSTALLATION = "console-installation"
META_SPACE = "console-space"
META_SESSION = "console-session"
META_CONFIG = "console-config"
META_BINDING_VERSION = "console-binding-version"
# Set on sandboxes that serve a job rather than a session (connection test, skill build, ...).
META_PURPOSE = "console-purpose"
# The console job (AdminJob id) a job's own sandbox serves: once that job has ended, the
# sandbox gets the session grace, not the longer job grace.
META_JOB = "console-job"
# Set on a warm pool's sandbox: the id of its pool member row (sandboxes/pools/). Labels are
# fixed at create on Docker, so a claimed one keeps it; its member row names its session.
META_POOL = "console-pool-member"

SNAPSHOT_PREFIX = "snap-"

# Every sandbox's working tree, owned by the unprivileged user commands run as by default.
WORKSPACE = "/workspace"
SANDBOX_UID = 1000


class ErrorKind(enum.StrEnum):
    NOT_FOUND = "not_found"
    GONE = "gone"
    CONFLICT = "conflict"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    TIMEOUT = "timeout"
    INVALID = "invalid"
    QUOTA = "quota"
    UNSUPPORTED = "unsupported"
    INTERNAL = "internal"


# Kinds a caller may retry with backoff without changing anything.
RETRYABLE_KINDS = frozenset({ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT})


class RemoteError(Exception):
    """A backend failure, translated. Vendor exceptions and HTTP codes never leak upward."""

    def __init__(
        self,
        kind: ErrorKind | str,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.kind = ErrorKind(kind)
        self.message = message
        self.retryable = self.kind in RETRYABLE_KINDS if retryable is None else retryable
        self.retry_after = retry_after
        super().__init__(f"{self.kind}: {message}")


class NotStarted(RemoteError):
    """`exec` refused before anything ran: the sandbox is gone (`not_found`) or not running
    (`conflict`: paused, stopped). An adapter that raises it for every such call declares
    `Backend.exec_refuses_when_idle`; the runtime then runs a session's command in the
    sandbox it knows to be running without asking the backend first, and on this error
    resolves the session (resume, or rebuild) and runs the command there."""


class SandboxState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"  # frozen, memory kept
    STOPPED = "stopped"  # memory freed, files kept, processes lost
    GONE = "gone"


class IdleMode(enum.StrEnum):
    PAUSE = "pause"
    STOP = "stop"


# ---------------------------------------------------------------------------------------
# Configuration of one backend instance (built from a SandboxConfig row by the sandboxes app)


@dataclass(frozen=True)
class BackendConfig:
    kind: str
    endpoint: str = ""  # control-plane URL (E2B/Cube) or Docker engine URL ("" = local socket)
    domain: str = ""  # data-plane domain (E2B/Cube)
    api_key: str = ""
    allow_private_endpoints: bool = False
    idle_mode: IdleMode = IdleMode.PAUSE
    # The kind's typed options (its package's `Options` subclass, `sandboxes.backends.settings`);
    # a mapping of strings by the same keys is read by the adapter through `Options.parse`.
    options: Options | Mapping[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# DTOs


@dataclass(frozen=True, kw_only=True)
class NetworkSpec(Policy):
    """Network switches, always sent explicitly at create (never a backend default): the
    outbound policy (`netpolicy.Policy`: every entry parsed, its meaning in `netpolicy`) and
    the inbound switch. Built from text with `NetworkSpec.parse(...)`."""

    allow_public_traffic: bool


@dataclass(frozen=True)
class NetworkCapabilities:
    """Which network switches a backend can honour. The UI greys out the rest."""

    outbound_toggle: bool = True
    allow_out_cidr: bool = False
    allow_out_domain: bool = False
    deny_out_cidr: bool = False
    deny_out_domain: bool = False
    l7_rules: bool = False
    # At most this many HTTP (L7) rules are taken (None: as many as a policy holds).
    max_l7_rules: int | None = None
    # HTTP (L7) rules hold within the deny CIDRs. False: a host a rule names is reached
    # whatever a deny CIDR says (Cube), so deny CIDRs beside rules are not honoured.
    l7_within_deny: bool = True
    inbound_toggle: bool = False
    # Without a toggle, every sandbox's ports are served publicly (Cube before v0.5.0): then a
    # policy keeping them private is what cannot be honoured, and public inbound is.
    inbound_always_public: bool = False
    # A changed NetworkSpec reaches running sandboxes (Backend.egress().update) without a rebuild.
    live_update: bool = False
    # deny_out entries win over allow_out entries (the console's meaning). False: an allow
    # entry beats a deny entry inside it (E2B, Cube), so such a deny entry is not honoured.
    deny_wins: bool = True
    # NetworkSpec.allow_private (private CIDRs also allowed) is honoured.
    allow_private: bool = False


@dataclass(frozen=True)
class DiskCapabilities:
    """Where a sandbox's disk limit (Resources.disk_mb) holds on this backend, and in words
    what is and is not bounded. The config page shows `summary`; the rest is for tests and
    decisions (e.g. refusing nothing, but saying exactly what is enforced)."""

    workspace: bool = False  # /workspace (persistent or not) is bounded
    tmp: bool = False  # /tmp is bounded
    writable_layer: bool = False  # everything else the sandbox writes (its root filesystem)
    template_builds: bool = False  # template builds run in bounded space
    summary: str = "This backend takes no disk limit: a sandbox's disk is whatever the backend gives it."

    @property
    def any(self) -> bool:
        return self.workspace or self.tmp or self.writable_layer


@dataclass(frozen=True)
class Resources:
    cpus: float | None = None
    memory_mb: int | None = None
    pids: int | None = None
    # Disk per sandbox, in MiB: what it may write (see DiskCapabilities for where it holds).
    disk_mb: int | None = None


@dataclass(frozen=True)
class WorkspaceFolder:
    name: str  # directly under /workspace
    owner_uid: int  # owner and group
    mode: int | None = None  # None: a folder there keeps its mode; one made gets 0755


@dataclass(frozen=True)
class WorkspaceLayout:
    """/workspace as a new sandbox should start: the folder the session user's (its mode kept),
    with these folders in it. A backend that can lay it out at create does and says so
    (`SandboxInfo.workspace_ready`); otherwise the caller lays it out in the running sandbox."""

    owner_uid: int
    folders: tuple[WorkspaceFolder, ...]


@dataclass(frozen=True)
class SandboxSpec:
    template_id: str
    network: NetworkSpec
    metadata: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    timeout_s: int = 300  # backend TTL (E2B/Cube); Docker sandboxes live until deleted
    auto_pause: bool = True
    auto_resume: bool = True
    # Name of persistent storage mounted at /workspace (Docker: a named volume); None = none.
    workspace_volume: str | None = None
    workspace_layout: WorkspaceLayout | None = None


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    state: SandboxState
    template_id: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    started_at: datetime | None = None
    end_at: datetime | None = None
    # Cube returns the inbound traffic token only at create; callers store it with the session.
    traffic_token: str | None = None
    # Answered by create: /workspace already has the spec's `workspace_layout`.
    workspace_ready: bool = False


@dataclass(frozen=True)
class ListQuery:
    metadata: Mapping[str, str] = field(default_factory=dict)
    states: frozenset[SandboxState] = frozenset()  # empty = every state
    limit: int = 100
    page_token: str | None = None


@dataclass(frozen=True)
class Page:
    items: tuple[SandboxInfo, ...]
    next_token: str | None = None


@dataclass(frozen=True)
class ExecRequest:
    """One command. Exactly one of `argv` or `shell` is set."""

    argv: tuple[str, ...] | None = None
    shell: str | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    user: str = "user"  # uid 1000; "root" only through the explicit install path
    stdin: bytes | None = None
    timeout_s: float = 60.0
    max_output_bytes: int = 1024 * 1024  # per stream; the rest is dropped and flagged

    def __post_init__(self) -> None:
        if (self.argv is None) == (self.shell is None):
            raise RemoteError(ErrorKind.INVALID, "give exactly one of argv or shell")
        if self.argv is not None and not self.argv:
            raise RemoteError(ErrorKind.INVALID, "argv is empty")
        if self.timeout_s <= 0:
            raise RemoteError(ErrorKind.INVALID, "timeout must be positive")
        if self.max_output_bytes <= 0:
            raise RemoteError(ErrorKind.INVALID, "output cap must be positive")


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False
    timed_out: bool = False


@dataclass(frozen=True)
class FileInfo:
    path: str
    name: str
    is_dir: bool
    size: int
    mode: int  # permission bits, e.g. 0o755
    is_symlink: bool = False
    modified: datetime | None = None

    @classmethod
    def from_stat_row(cls, row: Mapping[str, Any]) -> FileInfo:
        """From the JSON row the scripts run inside a sandbox print for one `lstat`: `path`,
        `name`, `dir`, `size`, `mode`, `link`, `mtime` (the Docker adapter's file probe and the
        session workspace helper)."""
        return cls(
            path=row["path"],
            name=row["name"],
            is_dir=bool(row["dir"]),
            size=int(row["size"]),
            mode=int(row["mode"]),
            is_symlink=bool(row["link"]),
            modified=datetime.fromtimestamp(float(row["mtime"]), UTC),
        )


@dataclass(frozen=True)
class SnapshotInfo:
    snapshot_id: str  # always "snap-..."; usable as a template id at create
    source_sandbox_id: str | None = None
    name: str = ""
    created_at: datetime | None = None
    size_bytes: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VolumeInfo:
    """A persistent workspace volume and the console metadata it carries."""

    name: str
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None


@dataclass(frozen=True)
class TemplateInfo:
    template_id: str
    name: str
    description: str = ""
    created_at: datetime | None = None
    size_bytes: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TemplateBuildSpec:
    """Build a template from Debian packages, or from an existing template plus a script."""

    name: str
    base_template_id: str | None = None
    debian_packages: tuple[str, ...] = ()
    script: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    # Disk of sandboxes made from the template (MiB), where the backend sets it per template
    # (Cube's writableLayerSize); None = the backend's default.
    disk_mb: int | None = None


@dataclass(frozen=True)
class PtySize:
    cols: int = 80
    rows: int = 24

    def clamped(self) -> PtySize:
        return PtySize(cols=min(max(self.cols, 1), 1000), rows=min(max(self.rows, 1), 1000))


@dataclass(frozen=True)
class HealthInfo:
    ok: bool
    version: str = ""
    detail: str = ""
    # The wire protocol the backend found the server to speak (e.g. "cube-0.4", "e2b-v1"),
    # recorded on the config and handed back as `options["protocol"]`; "" = nothing to record.
    protocol: str = ""


@dataclass(frozen=True)
class Finding:
    """One thing a backend found of its account beyond health (`Backend.preflight`): parts
    installed, permissions granted. `blocking`: without it sessions fail (else only a
    capability is lost, said in `detail`)."""

    name: str
    ok: bool
    detail: str
    blocking: bool = True


# ---------------------------------------------------------------------------------------
# The backend


class Lookahead(abc.ABC):
    """A look at a sandbox begun early (`Backend.look_ahead`): the backend answers while its
    caller does other work. Read by `running()` at most once, or given up by `drop()`; a
    caller drops it in every case (a look already read drops nothing)."""

    @abc.abstractmethod
    def running(self) -> SandboxInfo | None:
        """The sandbox as `connect` would answer it when it is running and `connect` would do
        nothing more; None otherwise (paused, stopped, gone, or the look failed): the caller
        then connects as usual, and every failure is said there. The one RemoteError raised:
        `timeout`, the backend not answering the look in its bound, which is `connect`'s own
        failure (its first look would wait as long again)."""

    @abc.abstractmethod
    def drop(self) -> None: ...


class Backend(abc.ABC):
    kind: ClassVar[str]
    label: ClassVar[str]
    # True: `exec` on a sandbox that is gone or idle raises `NotStarted`, never runs it late
    # (an adapter whose engine would resume it on its own, or cannot tell, leaves it False).
    exec_refuses_when_idle: ClassVar[bool] = False

    def __init__(self, config: BackendConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def health(self) -> HealthInfo: ...

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> SandboxInfo: ...

    @abc.abstractmethod
    def connect(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        """Return a running sandbox, resuming it if paused or stopped.

        `timeout_s` (here, on `get` and on `pause`): the longest the caller waits for the
        backend's answer (a `timeout` RemoteError past it); None: the adapter's own bound."""

    def look_ahead(self, sandbox_id: str) -> Lookahead | None:
        """Begin `connect`'s first look at `sandbox_id` without waiting for it, for a caller
        with other work meanwhile (the warm resolve reads its session row). None: this
        backend has no such look; the caller connects as usual."""
        return None

    @abc.abstractmethod
    def get(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo: ...

    @abc.abstractmethod
    def list(self, query: ListQuery) -> Page: ...

    @abc.abstractmethod
    def delete(self, sandbox_id: str) -> None:
        """Idempotent: deleting a missing sandbox succeeds."""

    @abc.abstractmethod
    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        """Run a command; a timeout kills its process group inside the sandbox too."""

    @abc.abstractmethod
    def pause(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        """Idle the sandbox (pause or stop, per the config's idle mode). Idempotent."""

    def repair(self, sandbox_id: str) -> str | None:
        """Find and mend a sandbox whose engine and runtime disagree on its state (Docker:
        the engine says paused while the freezer says running, or the reverse). Returns what
        was done in words, or None when nothing needed it (or the backend cannot tell).
        Leaves the sandbox running when anything was mended."""
        return None

    @abc.abstractmethod
    def network_capabilities(self) -> NetworkCapabilities: ...

    def files(self) -> FilesCapability | None:
        return None

    def snapshots(self) -> SnapshotsCapability | None:
        return None

    def templates(self) -> TemplatesCapability | None:
        return None

    def inbound(self) -> InboundCapability | None:
        return None

    def pty(self) -> PtyCapability | None:
        return None

    def egress(self) -> EgressCapability | None:
        return None

    def volumes(self) -> VolumesCapability | None:
        return None

    def stats(self) -> StatsCapability | None:
        return None

    def logs(self) -> LogsCapability | None:
        """The sandbox's own output (`capabilities.LogsCapability`); None: not offered."""
        return None

    def warm_pools(self) -> WarmPoolCapability | None:
        """A pool the backend keeps natively; None: the console keeps it (sandboxes/pools/)."""
        return None

    def disk_capabilities(self) -> DiskCapabilities:
        """Where Resources.disk_mb holds; may ask the engine once (cached by the adapter)."""
        return DiskCapabilities()

    def release_space(self, space: str) -> builtins.list[str]:
        """Free what the backend keeps for one space beside its sandboxes and volumes (Docker:
        the space's networks and their host state), once none of the space's sandboxes is
        left; returns what it removed. Idempotent; raises RemoteError (`conflict`) naming
        what stays because a sandbox still uses it. Default: nothing kept per space."""
        return []

    def preflight(self) -> builtins.list[Finding]:
        """What the backend checks of its account beyond `health()`: the parts it needs
        installed and the permissions it needs granted, each a `Finding` (Test connection and
        registering a backend report them). Default: nothing beyond health."""
        return []

    def idles_itself(self) -> bool:
        """True when the backend pauses an idle sandbox on its own (a TTL with auto-pause set
        at create from SandboxSpec.timeout_s); the console then only reads the state back."""
        return False

    def close(self) -> None:
        """Release pooled connections."""
        return None

    # Shared behaviour built on the abstract methods ------------------------------------

    def iter_sandboxes(self, query: ListQuery, *, max_pages: int = 10_000) -> Iterator[SandboxInfo]:
        """Every sandbox matching `query`, following pages.

        A page token seen twice stops the listing with an error instead of looping forever
        (some control planes have handed out the same cursor again).
        """
        seen: set[str] = set()
        token = query.page_token
        for _ in range(max_pages):
            page = self.list(
                ListQuery(metadata=query.metadata, states=query.states, limit=query.limit, page_token=token)
            )
            yield from page.items
            token = page.next_token
            if not token:
                return
            if token in seen:
                raise RemoteError(
                    ErrorKind.INTERNAL,
                    f"the backend repeated page token {token[:32]!r}; listing stopped",
                    retryable=False,
                )
            seen.add(token)
        raise RemoteError(ErrorKind.INTERNAL, f"listing stopped after {max_pages} pages", retryable=False)

    def check_state(self, info: SandboxInfo) -> SandboxInfo:
        if info.state == SandboxState.GONE:
            raise RemoteError(ErrorKind.GONE, f"sandbox {info.sandbox_id} is gone")
        return info


def is_snapshot_id(template_id: str) -> bool:
    return template_id.startswith(SNAPSHOT_PREFIX)
