"""In-memory state of the fake E2B/Cube server: sandboxes, processes, templates, snapshots,
faults, and the TTL reaper.
"""

from __future__ import annotations

import datetime as dt
import queue
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.fakes.fake_runtime import DockerRuntime, ExecHandle, MountSpec

Personality = Literal["e2b", "cube"]


@dataclass(frozen=True)
class CubeRelease:
    """What one CubeSandbox release's CubeAPI does, read from TencentCloud/CubeSandbox at its
    release-note commit (CubeAPI/src/routes.rs, models/mod.rs, services/sandboxes.rs; CubeMaster
    pkg/base/types/id2ip.go for the inbound gate). Each field is one behaviour the fake follows."""

    version: str
    commit: str
    # GET /snapshots and POST /sandboxes/{id}/rollback (routes.rs build_sandbox_routes).
    snapshot_list: bool
    # GET /cubeapi/v1/cluster/versions (routes.rs build_cluster_routes, v0.4.0-v0.5.1).
    cluster_versions: bool
    # GET /cubeapi/v1/auth/session (routes.rs build_auth_routes, v0.5.x only).
    auth_session: bool
    # GET /templates/aliases/{alias} and TemplateSummary.aliases (v0.6.0).
    aliases: bool
    # network.allowPublicTraffic, when sent, overrides allow_internet_access as the egress switch
    # (services/sandboxes.rs build_cubevs_context / build_cube_network_config before v0.5.0).
    public_traffic_is_egress: bool
    # allowPublicTraffic gates the public URL with a traffic token (CubeMaster id2ip.go, v0.5.0);
    # before, CubeProxy serves every sandbox's ports to anyone.
    inbound_gate: bool
    # Idle pause reaches CubeMaster only from `lifecycle` (v0.5.0); before, autoPause is parsed
    # (models NewSandbox) and never forwarded (CreateSandboxRequest has no such field).
    idle_from_lifecycle: bool
    # SandboxNetworkConfig.rules exists (v0.4.0); before, serde drops the field silently.
    l7_rules: bool
    # CreateTemplateRequest.templateID has no default (v0.2.2).
    template_id_required: bool
    # FORBIDDEN_ENV_NAMES checked (services/sandboxes.rs, v0.5.0).
    env_names_checked: bool


def _release(version: str, commit: str, **facts: bool) -> CubeRelease:
    return CubeRelease(version=version, commit=commit, **facts)


_BEFORE_05 = {
    "public_traffic_is_egress": True,
    "inbound_gate": False,
    "idle_from_lifecycle": False,
    "env_names_checked": False,
    "auth_session": False,
    "aliases": False,
}
_FROM_05 = {
    "public_traffic_is_egress": False,
    "inbound_gate": True,
    "idle_from_lifecycle": True,
    "env_names_checked": True,
    "snapshot_list": True,
    "l7_rules": True,
    "template_id_required": False,
}
CUBE_RELEASES = {
    r.version: r
    for r in (
        _release(
            "0.2.2", "b1b7ec65", snapshot_list=False, cluster_versions=False, l7_rules=False,
            template_id_required=True, **_BEFORE_05,
        ),
        _release(
            "0.3.0", "6e482266", snapshot_list=True, cluster_versions=False, l7_rules=False,
            template_id_required=False, **_BEFORE_05,
        ),
        _release(
            "0.4.0", "870a2463", snapshot_list=True, cluster_versions=True, l7_rules=True,
            template_id_required=False, **_BEFORE_05,
        ),
        _release("0.5.0", "30b4e25a", cluster_versions=True, auth_session=True, aliases=False, **_FROM_05),
        _release("0.5.1", "a164417f", cluster_versions=True, auth_session=True, aliases=False, **_FROM_05),
        _release("0.6.0", "08f2f5d7", cluster_versions=False, auth_session=False, aliases=True, **_FROM_05),
    )
}  # fmt: skip
CUBE_VERSIONS = tuple(CUBE_RELEASES)
# Older spellings the tests and the command line still use.
CUBE_VERSION_ALIASES = {"may": "0.2.2", "later": "0.6.0", "0.4": "0.4.0", "0.5": "0.5.1", "0.6": "0.6.0"}
LATEST_CUBE = "0.6.0"
# Whether a missing route is answered as e2b-dev/infra's validator does (JSON {code, message}),
# as gin alone does (plain text), or as a reverse proxy in front of it does (an HTML page).
MISSING_ROUTE_STYLES = ("validator", "gin", "proxy")

# E2B control planes: "cloud" serves what SDK 2.63 calls (POST /v2/sandboxes and
# /v2/sandboxes/{id}/connect); "spec" is a self-hosted control plane built from e2b-dev/infra
# spec/openapi.yml (2026-08), which has neither.
E2B_APIS = ("cloud", "spec")
E2B_API_ALIASES = {"infra": "spec"}

# envd versions the fake reports. PEP 440 local versions ("+fake") parse in the SDK; a
# "-fake" suffix would crash packaging.Version (protocol reference §3.5).
E2B_ENVD_VERSION = "0.5.7+fake"
# Cube reports the constant 0.2.0 (CubeAPI/src/constants.rs; ENVD_VERSION_FALLBACK from
# v0.5.0), below 0.4.0: the SDK then forces the basic-auth user "user" and `username=user`,
# and omits the Start stdin flag.
CUBE_ENVD_VERSION = "0.2.0"


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def rfc3339(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def new_id(prefix: str = "", n: int = 20) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return prefix + "".join(secrets.choice(alphabet) for _ in range(n))


@dataclass
class Event:
    """One process event queued for the streams attached to the process."""

    kind: Literal["data", "end"]
    stream: str = ""
    data: bytes = b""
    exit_code: int = 0
    exited: bool = True
    status: str = ""


@dataclass
class FakeProcess:
    pid: int
    config: dict[str, Any]
    handle: ExecHandle
    tag: str | None = None
    pty: bool = False
    stdin_open: bool = False
    subscribers: list[queue.Queue[Event]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    finished: bool = False
    # The Start stream's queue, subscribed before the output pump starts (no lost bytes).
    initial: queue.Queue[Event] | None = None

    def subscribe(self) -> queue.Queue[Event]:
        q: queue.Queue[Event] = queue.Queue()
        with self.lock:
            self.subscribers.append(q)
            if self.finished:
                q.put(Event("end", status="exited"))
        return q

    def unsubscribe(self, q: queue.Queue[Event]) -> None:
        with self.lock:
            if q in self.subscribers:
                self.subscribers.remove(q)

    def publish(self, event: Event) -> None:
        with self.lock:
            if event.kind == "end":
                self.finished = True
            for q in self.subscribers:
                q.put(event)

    def info(self) -> dict[str, Any]:
        # spec/envd/process/process.proto: ProcessInfo {config, pid, tag?}
        # Printed by protojson: an empty args list, envs map or cwd is omitted.
        config = {k: v for k, v in self.config.items() if v not in ("", [], {}, None)}
        out: dict[str, Any] = {"config": config, "pid": self.pid}
        if self.tag:
            out["tag"] = self.tag
        return out


@dataclass
class FakeSandbox:
    sandbox_id: str
    template_id: str
    image: str
    container_id: str
    envd_version: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    timeout: int
    started_at: dt.datetime
    end_at: dt.datetime
    alias: str | None = None
    state: str = "running"  # running | paused | pausing (Cube only)
    auto_pause: bool = False
    auto_resume: bool = False
    auto_pause_memory: bool = True
    envd_access_token: str | None = None
    traffic_access_token: str | None = None
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    # What the server made of the network switches: may the sandbox reach the internet? Are
    # its ports served to anyone without a traffic token? Which L7 rules reach its proxy?
    egress: bool = True
    inbound: bool = True
    l7_rules: list[Any] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    # What the container mounts, and (E2B) the volumeMounts as asked, echoed in listings.
    mounts: list[MountSpec] = field(default_factory=list)
    volume_mounts: list[dict[str, str]] = field(default_factory=list)
    processes: dict[int, FakeProcess] = field(default_factory=dict)
    homes: dict[str, str] = field(default_factory=dict)
    watchers: dict[str, Any] = field(default_factory=dict)  # fake_envd.Watcher by id
    lock: threading.RLock = field(default_factory=threading.RLock)
    cpu_count: int = 2
    memory_mb: int = 512
    disk_size_mb: int = 1024

    def set_ttl(self, seconds: int) -> None:
        self.timeout = seconds
        self.end_at = now() + dt.timedelta(seconds=seconds)


@dataclass
class FakeVolume:
    """An E2B team volume (spec/openapi.yml Volume / VolumeAndToken), kept in a Docker volume."""

    volume_id: str
    name: str
    docker_name: str
    token: str
    created_at: dt.datetime


@dataclass
class Template:
    template_id: str
    image: str
    names: list[str]
    created_at: dt.datetime
    build_id: str = ""
    kind: Literal["template", "snapshot"] = "template"
    status: str = "ready"
    origin_sandbox_id: str | None = None
    spawn_count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def answers_to(self, ref: str) -> bool:
        """E2B accepts a template/snapshot by id or name, with or without the team namespace
        and the tag (spec/openapi.yml GET /snapshots `name`: "my-snapshot",
        "my-team/my-snapshot", "my-snapshot:v1")."""
        return any(ref in _name_forms(ident) for ident in (self.template_id, *self.names))


def _name_forms(ident: str) -> set[str]:
    base, _, tag = ident.partition(":")
    short = base.rsplit("/", 1)[-1]
    forms = {ident, base, short}
    if tag:
        forms.add(f"{short}:{tag}")
    return forms


@dataclass
class Fault:
    """A fault injected on matching requests.

    kind: "status" (answer ``status``, with ``retry_after`` when set), "latency" (sleep
    ``delay`` seconds, then serve), "repeat_token" (list endpoints repeat the request's page
    token), "drop_stream" (server streams are cut after ``after_events`` messages).
    ``path`` is a regular expression searched in the request path; ``plane`` is "api",
    "envd" or "any"; ``times`` limits how often it fires (None: until cleared).
    """

    kind: str
    status: int = 500
    retry_after: int | None = None
    delay: float = 0.0
    path: str | None = None
    method: str | None = None
    plane: str = "any"
    times: int | None = None
    after_events: int = 1
    message: str = "fault injected by the fake server"
    fired: int = 0

    def matches(self, plane: str, method: str, path: str) -> bool:
        if self.times is not None and self.fired >= self.times:
            return False
        if self.plane not in ("any", plane):
            return False
        if self.method and self.method.upper() != method.upper():
            return False
        return not (self.path and not re.search(self.path, path))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__.items())


class Store:
    """Everything the fake knows, behind one lock."""

    def __init__(
        self,
        personality: Personality,
        runtime: DockerRuntime,
        api_key: str,
        cube_version: str = LATEST_CUBE,
        e2b_api: str = "cloud",
    ) -> None:
        self.personality = personality
        self.cube_version = CUBE_VERSION_ALIASES.get(cube_version, cube_version)
        self.release = CUBE_RELEASES[self.cube_version]
        self.missing_route = "validator"
        self.e2b_api = e2b_api
        self.runtime = runtime
        self.api_key = api_key
        self.lock = threading.RLock()
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.killed: set[str] = set()  # for Cube's 410 Gone on the data plane
        self.templates: dict[str, Template] = {}
        self.volumes: dict[str, FakeVolume] = {}  # by volume id
        # Docker volumes of deleted E2B volumes still mounted somewhere: removed once free.
        self.doomed_volumes: set[str] = set()
        self.faults: list[Fault] = []
        self.next_pid = 1000
        self.cube_pause_seconds = 0.0
        self.resume_failures = 0  # Cube: the next N data-plane resumes fail with 503
        self.new_id_on_resume = 0  # the next N resumes through connect answer a new sandbox id (E2B #884)
        # (plane, method, path) of the last requests, for tests counting calls.
        self.requests: list[tuple[str, str, str]] = []
        # Cube with PR #1800 applied (serves the SDK's /v2 create/connect): for SDK tests only.
        self.cube_pr1800 = False
        self._add_builtin_templates()

    @property
    def is_cube(self) -> bool:
        return self.personality == "cube"

    @property
    def cube_may(self) -> bool:
        """v0.2.2: no snapshot list, template ids required, ids invented for snapshots."""
        return self.is_cube and self.cube_version == "0.2.2"

    def cube_has(self, behaviour: str) -> bool:
        """Whether this Cube release has `behaviour` (a CubeRelease field); False off Cube."""
        return self.is_cube and bool(getattr(self.release, behaviour))

    @property
    def envd_version(self) -> str:
        return CUBE_ENVD_VERSION if self.is_cube else E2B_ENVD_VERSION

    def _add_builtin_templates(self) -> None:
        image = self.runtime.default_image
        self.templates["base"] = Template(
            template_id="base",
            image=image,
            names=["base"],
            created_at=now(),
            build_id=str(uuid.uuid4()),  # infra build ids are UUIDs (SDK TemplateBuild.build_id)
        )

    def resolve_template(self, ref: str) -> Template | None:
        """Template by id, or (E2B only) by name/alias. Cube resolves snapshots by ID only."""
        with self.lock:
            tpl = self.templates.get(ref)
            if tpl or self.is_cube:
                return tpl
            for t in self.templates.values():
                if t.answers_to(ref):
                    return t
        return None

    def get(self, sandbox_id: str) -> FakeSandbox | None:
        with self.lock:
            return self.sandboxes.get(sandbox_id)

    def rename(self, sbx: FakeSandbox, new: str) -> None:
        """The sandbox answers to a new id from now on (the old one is unknown)."""
        with self.lock:
            self.sandboxes.pop(sbx.sandbox_id, None)
            sbx.sandbox_id = new
            self.sandboxes[new] = sbx

    def allocate_pid(self) -> int:
        with self.lock:
            self.next_pid += 1
            return self.next_pid

    # -- faults -----------------------------------------------------------------------------

    def take_fault(self, plane: str, method: str, path: str, kinds: tuple[str, ...]) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.kind in kinds and f.matches(plane, method, path):
                    f.fired += 1
                    return f
        return None

    # -- introspection ----------------------------------------------------------------------

    def snapshot_state(self) -> dict[str, Any]:
        with self.lock:
            return {
                "personality": self.personality,
                "release": self.cube_version if self.is_cube else self.e2b_api,
                "sandboxes": [
                    {
                        "sandboxID": s.sandbox_id,
                        "state": s.state,
                        "templateID": s.template_id,
                        "containerID": s.container_id,
                        "metadata": s.metadata,
                        "endAt": rfc3339(s.end_at),
                        "autoPause": s.auto_pause,
                        "autoResume": s.auto_resume,
                        "network": s.network,
                        "allow_internet_access": s.allow_internet_access,
                        "egress": s.egress,
                        "inbound": s.inbound,
                        "l7Rules": s.l7_rules,
                        "processes": [p.info() for p in s.processes.values()],
                        "annotations": s.annotations,
                        "mounts": [
                            {"kind": m.kind, "source": m.source, "target": m.target, "readOnly": m.read_only}
                            for m in s.mounts
                        ],
                    }
                    for s in self.sandboxes.values()
                ],
                "killed": sorted(self.killed),
                "templates": [
                    {
                        "templateID": t.template_id,
                        "kind": t.kind,
                        "names": t.names,
                        "image": t.image,
                    }
                    for t in self.templates.values()
                ],
                "volumes": [
                    {"volumeID": v.volume_id, "name": v.name, "dockerName": v.docker_name}
                    for v in self.volumes.values()
                ],
                "faults": [f.as_dict() for f in self.faults],
            }


class Reaper(threading.Thread):
    """Enforces TTLs: at ``endAt`` a sandbox is paused (autoPause) or killed."""

    def __init__(self, lifecycle: Any, interval: float = 0.2) -> None:
        super().__init__(name="fake-e2b-reaper", daemon=True)
        self.lifecycle = lifecycle
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.lifecycle.reap_expired()
            except Exception:
                time.sleep(self.interval)
