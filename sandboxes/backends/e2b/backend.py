"""E2B backend: sandboxes on E2B cloud or any E2B-compatible control plane.

Both planes are spoken over httpx through the guarded transport (`guard.GuardedTransport`),
so every request to the tenant-controlled control plane *and* to each sandbox's envd is
re-checked and pinned at dial time. The `e2b` SDK (pinned `>=2.63,<3`) is the protocol
reference and what the fake server is tested against, but its REST calls and its envd
client (Connect over `pyqwest`, a Rust HTTP stack) accept no httpx transport, so they could
not be guarded; the wire format used here is the one SDK 2.63 speaks (docs/backends.md, "E2B").

Mapping of the contract:

- control plane `<endpoint>` (default `https://api.<domain>`, domain default `e2b.app`):
  create `POST /v2/sandboxes` (the SDK's, with `Idempotency-Key`, so it may be retried) where
  the server has it, else the published spec's `POST /sandboxes` (never retried); which one
  is learnt from the server's answer (a missing route) and reported as the config's
  protocol (`e2b-v2` / `e2b-v1`, `options["protocol"]` pins it). Connect is the spec's
  `POST /sandboxes/{id}/connect` (it suffices: the SDK's /v2 adds only `memory`) and its
  answer is the SandboxInfo (no second call). Get `GET /sandboxes/{id}`, list
  `GET /v2/sandboxes` (cursor in `X-Next-Token`), delete, pause, snapshots, templates;
- data plane: envd on port 49983, at `options["sandbox_url"]` (one URL for every sandbox,
  routed by the `E2b-Sandbox-Id` header) or `https://49983-<id>.<domain>`;
- snapshot ids are presented as `snap-<E2B snapshot id>` (E2B's own look like
  `team/name:tag`), so `is_snapshot_id` works; the prefix is stripped again on use;
- a persistent workspace (`SandboxSpec.workspace_volume`) is an E2B team volume, created by
  name if missing (`POST /volumes`) and mounted at /workspace (`volumeMounts`); a fresh
  volume is empty and root's, so the adapter lays /workspace out after create.

Parts: `control` (the control plane's HTTP client), `envd` (the data plane), and one module a
capability (files, pty, snapshots and templates, inbound, volumes).

Imports nothing of the project but `base` and `guard`.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import httpx

from ..base import (
    SANDBOX_UID,
    SNAPSHOT_PREFIX,
    WORKSPACE,
    Backend,
    BackendConfig,
    DiskCapabilities,
    ErrorKind,
    ExecRequest,
    HealthInfo,
    ListQuery,
    NetworkCapabilities,
    NetworkSpec,
    Page,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
    SnapshotInfo,
    is_snapshot_id,
)
from ..capabilities import (
    FilesCapability,
    InboundCapability,
    PtyCapability,
    SnapshotsCapability,
    StatsCapability,
    TemplatesCapability,
    VolumesCapability,
)
from ..guard import Resolver, system_resolver
from .common import (
    _STATES,
    _WORKSPACE_LAYOUT,
    DEFAULT_DOMAIN,
    DEFAULT_REQUEST_TIMEOUT_S,
    DEFAULT_RETRIES,
    DEFAULT_SANDBOX_TTL_S,
    PROTOCOL_V1,
    PROTOCOL_V2,
    NoRoute,
    _Envd,
    _q,
    check_volume_name,
    egress_lists,
    encode_metadata_filter,
    network_problems,
    parse_time,
    parse_version,
    translating,
)
from .envd import E2BEnvd
from .files import E2BFiles
from .inbound import E2BInbound
from .pty import E2BPtys
from .settings import E2BOptions
from .snapshots import E2BSnapshots, E2BTemplates
from .volumes import E2BVolumes

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# The backend


class E2BBackend(E2BEnvd, Backend):
    """Sandboxes on an E2B control plane.

    BackendConfig: `endpoint` = control-plane URL (empty: `https://api.<domain>`), `domain` =
    sandbox domain (default `e2b.app`), `api_key`, `allow_private_endpoints`. Options:
    `sandbox_url` (one envd URL for every sandbox, routed by header: E2B_SANDBOX_URL's
    meaning; used for the fake server and for a Cube reverse proxy), `request_timeout`
    (seconds, default 60), `retries` (attempts after the first for retryable failures,
    default 4), `sandbox_timeout` (TTL set on connect, default 300), `protocol` (`e2b-v2` or
    `e2b-v1`: recorded or pinned create flavour) with `protocol_pinned`.
    """

    kind = "e2b"
    label = "E2B"

    def idles_itself(self) -> bool:
        return True  # create sets the TTL with autoPause; connect resumes

    default_domain = DEFAULT_DOMAIN
    options_class: ClassVar[type[E2BOptions]] = E2BOptions

    def __init__(self, config: BackendConfig, *, resolver: Resolver | None = None) -> None:
        super().__init__(config)
        self.domain = (config.domain or self.default_domain).strip().strip(".")
        self.api_url = (config.endpoint or f"https://api.{self.domain}").rstrip("/")
        self.options = self.options_class.parse(config.options)
        self.sandbox_url = self.options.sandbox_url.rstrip("/")
        self.request_timeout = self._number_option("request_timeout", DEFAULT_REQUEST_TIMEOUT_S)
        self.retries = int(self._number_option("retries", DEFAULT_RETRIES))
        self.sandbox_ttl = int(self._number_option("sandbox_timeout", DEFAULT_SANDBOX_TTL_S))
        self.resolver = resolver or system_resolver
        self._http: httpx.Client | None = None
        self._lock = threading.Lock()
        self._envd: dict[str, _Envd] = {}
        self._traffic_tokens: dict[str, str] = {}
        # Metadata learnt at create/get/list, so a connect answer (which carries none) still
        # makes a full SandboxInfo.
        self._metadata: dict[str, dict[str, str]] = {}
        self.protocol_pinned = self.options.protocol_pinned
        self.protocol = self._initial_protocol(self.options.protocol)
        # Waits between retries go through here so tests can observe the backoff.
        self.sleep: Callable[[float], None] = time.sleep

    def _initial_protocol(self, value: str) -> str:
        """The recorded or pinned protocol ("" = learn it from the server)."""
        if value in ("", PROTOCOL_V1, PROTOCOL_V2):
            return value
        raise RemoteError(ErrorKind.INVALID, f"option 'protocol' must be {PROTOCOL_V1!r} or {PROTOCOL_V2!r}")

    def _number_option(self, name: str, default: float) -> float:
        value = getattr(self.options, name)
        if value is None:
            return default
        if value < 0:
            raise RemoteError(ErrorKind.INVALID, f"option {name!r} must not be negative")
        return value

    # Health ----------------------------------------------------------------------------

    def health(self) -> HealthInfo:
        try:
            self._api("GET", "/health", "health check", idempotent=True)
            # /health needs no key: list one sandbox to prove the key works too.
            self.check_listing()
            protocol = self.protocol if self.protocol_pinned else self.probe_protocol()
        except RemoteError as exc:
            return HealthInfo(ok=False, detail=exc.message)
        flavour = "SDK /v2 create" if protocol == PROTOCOL_V2 else "published-spec create (POST /sandboxes)"
        return HealthInfo(
            ok=True,
            version=f"E2B API at {self.api_url} ({flavour})",
            detail=f"sandbox domain {self.domain}",
            protocol=protocol,
        )

    def check_listing(self) -> None:
        """List one sandbox: proves the key works, and that the endpoint is the API at all (a
        dashboard or portal answers 200 to every path, but no JSON list)."""
        response = self._api("GET", "/v2/sandboxes", "checking the API key", idempotent=True, params={"limit": 1})
        try:
            rows = response.json()
        except (ValueError, UnicodeDecodeError):
            rows = None
        if not isinstance(rows, builtins.list):
            raise RemoteError(
                ErrorKind.INVALID,
                f"listing sandboxes at {self.api_url} did not answer a JSON list: is this the API endpoint?",
                retryable=False,
            )

    def probe_protocol(self) -> str:
        """Which create operation the control plane serves, confirmed before it is recorded.

        Both probes send a create without the required templateID, so a server that has the
        route refuses the body (400) and creates nothing: that refusal is the confirmation
        that the route exists and validates create bodies. A missing route is recognised in
        every form a control plane answers it (`common.is_missing_route`: infra's validator
        404 `validation error: method not allowed`, gin's plain text, axum's empty body, a
        proxy's page). Anything else (a handler's 404, a dashboard's 200) confirms nothing."""
        if self._create_route_answers("/v2/sandboxes"):
            self.protocol = PROTOCOL_V2
        elif self._create_route_answers("/sandboxes"):
            self.protocol = PROTOCOL_V1  # a control plane built from the published spec
        else:
            raise RemoteError(
                ErrorKind.INVALID,
                f"{self.api_url} serves neither POST /v2/sandboxes nor POST /sandboxes: it is not an E2B API",
                retryable=False,
            )
        return self.protocol

    def _create_route_answers(self, path: str) -> bool:
        """True when `path` refuses a create without a template (the route exists); False when
        the server has no such route or answers something that proves nothing."""
        try:
            self._api("POST", path, f"probing POST {path}", idempotent=True, json={})
        except NoRoute:
            return False
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.INVALID, ErrorKind.NOT_FOUND, ErrorKind.UNSUPPORTED, ErrorKind.CONFLICT):
                raise  # a key, quota or availability problem: say that, not a protocol
            return exc.kind == ErrorKind.INVALID
        # No E2B API accepts a create without templateID (spec/openapi.yml NewSandbox
        # requires it): this is something else answering every path.
        raise RemoteError(
            ErrorKind.INVALID,
            f"{self.api_url} accepted a create without a template: it is not an E2B API",
            retryable=False,
        )

    # Whether an allowOut entry reaches a private address (E2B's own firewall refuses them).
    opens_private = False

    def disk_capabilities(self) -> DiskCapabilities:
        return DiskCapabilities(
            summary="E2B takes no disk size at create: each sandbox has its template's disk (diskSizeMB, "
            "set by the provider per template and plan); the console's limit is not sent."
        )

    def network_capabilities(self) -> NetworkCapabilities:
        # E2B: allowOut takes CIDRs, IPs and domains; denyOut CIDRs and IPs only (no domain
        # deny list); `network.rules` are header transforms, not allow/deny rules. An allowOut
        # entry beats denyOut (so a deny entry inside an allowed range is not honoured). No
        # private address is ever reached, so neither private exceptions nor allow entries
        # inside a private range can be honoured. Fixed at create as far as the console goes.
        return NetworkCapabilities(
            outbound_toggle=True,
            allow_out_cidr=True,
            allow_out_domain=True,
            deny_out_cidr=True,
            deny_out_domain=False,
            l7_rules=False,
            inbound_toggle=True,
            deny_wins=False,
            allow_private=self.opens_private,
        )

    # Lifecycle -------------------------------------------------------------------------

    def _template_for_api(self, template_id: str) -> str:
        """A console template id (possibly a presented snapshot id) as the API knows it."""
        if is_snapshot_id(template_id):
            return self._raw_snapshot_id(template_id)
        return template_id

    @staticmethod
    def _raw_snapshot_id(snapshot_id: str) -> str:
        return snapshot_id.removeprefix(SNAPSHOT_PREFIX)

    @staticmethod
    def _presented_snapshot_id(raw: str) -> str:
        return SNAPSHOT_PREFIX + raw

    def _check_network(self, network: NetworkSpec) -> None:
        problems = network_problems(network, open_private=self.opens_private)
        if problems:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"{self.label} {'; '.join(problems)}")
        if network.l7_rules:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"{self.label} has no L7 allow/deny rules")

    def _network_body(self, network: NetworkSpec) -> dict[str, Any]:
        allow_out, deny_out = egress_lists(network, open_private=self.opens_private)
        return {
            "allowPublicTraffic": network.allow_public_traffic,
            "allowOut": allow_out,
            "denyOut": deny_out,
        }

    def _create_body(self, spec: SandboxSpec) -> dict[str, Any]:
        self._check_network(spec.network)
        body: dict[str, Any] = {
            "templateID": self._template_for_api(spec.template_id),
            "timeout": self._ttl(spec.timeout_s),
            "autoPause": spec.auto_pause,
            # Auto-resume requires pause-on-timeout (spec/openapi.yml NewSandbox).
            "autoResume": {"enabled": bool(spec.auto_pause and spec.auto_resume)},
            # The network switches are always explicit (never a template default);
            # `allow_internet_access` is snake_case in the API.
            "allow_internet_access": spec.network.allow_internet_access,
            "network": self._network_body(spec.network),
            "metadata": dict(spec.metadata),
            "envVars": dict(spec.env),
        }
        if spec.workspace_volume:
            self._mount_workspace(body, spec.workspace_volume)
        return body

    def _mount_workspace(self, body: dict[str, Any], name: str) -> None:
        # spec/openapi.yml NewSandbox.volumeMounts: [{name, path}], the volume by name.
        body["volumeMounts"] = [{"name": name, "path": WORKSPACE}]

    def _check_spec(self, spec: SandboxSpec) -> None:
        if not spec.workspace_volume:
            return
        if self.volumes() is None:
            raise RemoteError(
                ErrorKind.UNSUPPORTED, f"this {self.label} config has no storage for a persistent /workspace"
            )
        check_volume_name(spec.workspace_volume)

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        self._check_spec(spec)
        body = self._create_body(spec)
        if spec.workspace_volume:
            self._provide_workspace(spec.workspace_volume)
        info = self._submit(body, spec)
        if spec.workspace_volume:
            self._lay_out_workspace(info.sandbox_id)
        logger.info(
            "created sandbox %s",
            info.sandbox_id,
            extra={"sandbox_id": info.sandbox_id, "template": spec.template_id, "protocol": self.protocol},
        )
        return info

    def _provide_workspace(self, name: str) -> None:
        """Make the workspace's storage exist before a sandbox mounts it."""
        E2BVolumes(self).ensure(name)

    def _submit(self, body: Mapping[str, Any], spec: SandboxSpec) -> SandboxInfo:
        what = f"creating a sandbox from {spec.template_id!r}"
        if self.protocol != PROTOCOL_V1:
            try:
                # The Idempotency-Key makes a retried create return the same sandbox.
                response = self._api(
                    "POST",
                    "/v2/sandboxes",
                    what,
                    idempotent=True,
                    headers={"Idempotency-Key": str(uuid.uuid4())},
                    json=body,
                )
                self.protocol = PROTOCOL_V2
                return self._created(response.json(), spec)
            except NoRoute:
                if self.protocol_pinned:
                    raise
                self.protocol = PROTOCOL_V1  # a control plane built from the published spec
        # spec/openapi.yml POST /sandboxes: no Idempotency-Key, so never retried; `secure`
        # asks for the envd access token that NewSandboxV2 always gives.
        response = self._api("POST", "/sandboxes", what, idempotent=False, json={**body, "secure": True})
        return self._created(response.json(), spec)

    def _lay_out_workspace(self, sandbox_id: str) -> None:
        """Give a mounted workspace the layout sessions expect (a fresh volume is empty and
        root's); a sandbox whose workspace cannot be laid out is deleted again."""
        request = ExecRequest(
            argv=("/bin/sh", "-c", _WORKSPACE_LAYOUT, WORKSPACE, str(SANDBOX_UID)), user="root", timeout_s=60
        )
        try:
            result = self.exec(sandbox_id, request)
            if result.exit_code != 0:
                problem = result.stderr.decode(errors="replace").strip() or f"exit {result.exit_code}"
                raise RemoteError(ErrorKind.INTERNAL, f"laying out {WORKSPACE} in sandbox {sandbox_id}: {problem}")
        except RemoteError:
            with suppress(RemoteError):
                self.delete(sandbox_id)
            raise

    def _created(self, data: Mapping[str, Any], spec: SandboxSpec) -> SandboxInfo:
        sandbox_id = str(data["sandboxID"])
        self._remember(sandbox_id, data)
        token = self._keep_token(sandbox_id, data)
        with self._lock:
            self._metadata[sandbox_id] = dict(spec.metadata)
        return SandboxInfo(
            sandbox_id=sandbox_id,
            state=SandboxState.RUNNING,
            template_id=spec.template_id,
            metadata=dict(spec.metadata),
            started_at=None,
            traffic_token=token,
        )

    def _keep_token(self, sandbox_id: str, data: Mapping[str, Any]) -> str | None:
        """The traffic token of a create/connect answer, else the one kept from before (Cube
        sends it at create only; spec/openapi.yml Sandbox.trafficAccessToken is nullable)."""
        token = data.get("trafficAccessToken") or None
        with self._lock:
            if token:
                self._traffic_tokens[sandbox_id] = str(token)
                return str(token)
            return self._traffic_tokens.get(sandbox_id)

    def _remember(self, sandbox_id: str, data: Mapping[str, Any]) -> None:
        if "envdVersion" not in data:
            return
        with self._lock:
            self._envd[sandbox_id] = _Envd(
                version=parse_version(data.get("envdVersion")), access_token=data.get("envdAccessToken") or None
            )

    def connect(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        """One call: the connect answer (spec/openapi.yml Sandbox) says what a warm resolve
        needs; state is running (connect resumes), the TTL runs from now."""
        ttl = self._ttl(self.sandbox_ttl)
        response = self._api(
            "POST",
            f"/sandboxes/{_q(sandbox_id)}/connect",
            f"connecting to sandbox {sandbox_id}",
            idempotent=True,
            json={"timeout": ttl},
            timeout=timeout_s or max(self.request_timeout, 130.0),
        )
        data = response.json()
        # Keep the id the control plane answers with (E2B #884: it changed after a resume).
        new_id = str(data.get("sandboxID") or sandbox_id)
        self._remember(new_id, data)
        token = self._keep_token(new_id, data)
        with self._lock:
            metadata = dict(self._metadata.get(new_id) or self._metadata.get(sandbox_id) or {})
        return SandboxInfo(
            sandbox_id=new_id,
            state=SandboxState.RUNNING,
            template_id=self._presented_template(str(data.get("templateID") or "")),
            metadata=metadata,
            end_at=datetime.now(UTC) + timedelta(seconds=ttl),
            traffic_token=token,
        )

    def _ttl(self, seconds: int) -> int:
        """The TTL sent at create and connect (Cube before v0.5 adds a margin)."""
        return seconds

    def get(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        response = self._api(
            "GET", f"/sandboxes/{_q(sandbox_id)}", f"sandbox {sandbox_id}", idempotent=True, timeout=timeout_s
        )
        data = response.json()
        self._remember(sandbox_id, data)
        info = self._info(data)
        with self._lock:
            self._metadata[info.sandbox_id] = dict(info.metadata)
        return info

    def _info(self, data: Mapping[str, Any]) -> SandboxInfo:
        # Only sandboxID is relied on: Cube leaves out endAt (never-timeout sandboxes) and
        # diskSizeMB, and metadata when empty (CubeAPI models ListedSandbox/SandboxDetail).
        template = str(data.get("templateID") or "")
        return SandboxInfo(
            sandbox_id=str(data["sandboxID"]),
            state=_STATES.get(str(data.get("state") or ""), SandboxState.STARTING),
            template_id=self._presented_template(template),
            metadata=dict(data.get("metadata") or {}),
            started_at=parse_time(data.get("startedAt")),
            end_at=parse_time(data.get("endAt")),
        )

    def _presented_template(self, template: str) -> str:
        return template

    def list(self, query: ListQuery) -> Page:
        params: dict[str, Any] = {"limit": max(1, min(query.limit, 100))}
        if query.metadata:
            params["metadata"] = encode_metadata_filter(query.metadata)
        states = self._api_states(query.states)
        if states:
            params["state"] = ",".join(states)
        if query.page_token:
            params["nextToken"] = query.page_token
        response = self._api("GET", "/v2/sandboxes", "listing sandboxes", idempotent=True, params=params)
        items = tuple(self._info(row) for row in response.json())
        return Page(items=items, next_token=response.headers.get("x-next-token") or None)

    @staticmethod
    def _api_states(states: frozenset[SandboxState]) -> builtins.list[str]:
        wanted = []
        if SandboxState.RUNNING in states:
            wanted.append("running")
        if states & {SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.STOPPED}:
            wanted.append("paused")
        if not wanted and states:
            # Only states E2B never reports (starting, gone): ask for both and filter to none.
            wanted = ["running", "paused"]
        return wanted

    def delete(self, sandbox_id: str) -> None:
        try:
            self._api("DELETE", f"/sandboxes/{_q(sandbox_id)}", f"deleting sandbox {sandbox_id}", idempotent=True)
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise
        with self._lock:
            self._envd.pop(sandbox_id, None)
            self._traffic_tokens.pop(sandbox_id, None)
            self._metadata.pop(sandbox_id, None)
        logger.info("deleted sandbox %s", sandbox_id, extra={"sandbox_id": sandbox_id})

    def pause(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        try:
            self._api(
                "POST",
                f"/sandboxes/{_q(sandbox_id)}/pause",
                f"pausing sandbox {sandbox_id}",
                idempotent=True,
                json={},
                timeout=timeout_s or max(self.request_timeout, 130.0),
            )
        except RemoteError as exc:
            if exc.kind != ErrorKind.CONFLICT:  # 409: already paused
                raise
        return self.get(sandbox_id, timeout_s=timeout_s)

    # Capabilities ----------------------------------------------------------------------

    def files(self) -> FilesCapability:
        return E2BFiles(self)

    def snapshots(self) -> SnapshotsCapability | None:
        return E2BSnapshots(self)

    def templates(self) -> TemplatesCapability | None:
        return E2BTemplates(self)

    def inbound(self) -> InboundCapability | None:
        return E2BInbound(self)

    def pty(self) -> PtyCapability:
        return E2BPtys(self)

    def volumes(self) -> VolumesCapability | None:
        return E2BVolumes(self)

    def stats(self) -> StatsCapability | None:
        from .stats import E2BStats

        return E2BStats(self)

    # Snapshot helpers shared by the capabilities ------------------------------------------

    def _verify_snapshot(self, info: SnapshotInfo) -> None:
        """Hook for control planes whose snapshot answer cannot be trusted (Cube)."""
        return None

    def snapshot_infos(self) -> builtins.list[SnapshotInfo]:
        rows = self.paged_rows("/snapshots", "listing snapshots")
        return [self._snapshot_info(row) for row in rows]

    def _snapshot_info(self, row: Mapping[str, Any], *, source: str | None = None, name: str = "") -> SnapshotInfo:
        names = row.get("names") or []
        return SnapshotInfo(
            snapshot_id=self._presented_snapshot_id(str(row["snapshotID"])),
            source_sandbox_id=row.get("originSandboxID") or source,
            name=name or (str(names[0]) if names else ""),
            created_at=parse_time(row.get("createdAt")),
        )


_BACKEND_METHODS = ("create", "connect", "get", "list", "delete", "pause", "exec")
translating(E2BBackend, *_BACKEND_METHODS)
