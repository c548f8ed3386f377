"""Cube Sandbox backend: the E2B adapter plus Cube's differences.

CubeAPI is an E2B-compatible gateway, but releases differ and several E2B behaviours are
missing or changed (protocol reference §6, docs/backends.md "Cube"). What this module does
about each:

- **Releases** (releases.py: v0.2.2, v0.3.0, v0.4.0, v0.5.x, v0.6.0 or later, recorded as
  `cube-0.2` .. `cube-0.6`): no release serves the SDK's /v2 create/connect, so create is
  `POST /sandboxes` and connect `POST /sandboxes/{id}/connect`. The release is told by the
  routes each one introduced (releases.py), probed by `health()` (recorded on the config)
  and, unless pinned, again before every create (a cluster may be upgraded or rolled back in
  place while an adapter lives); `options["protocol"]` with `protocol_pinned` pins it. Every behaviour below
  that differs is a field of the release.
- **Idle behaviour**: from v0.5.0 only `lifecycle.onTimeout`/`autoResume` is read (absent
  lifecycle = killed at the TTL). Before v0.5.0 `autoPause` is parsed and not forwarded, so the
  console idles those sandboxes itself (`idles_itself()` False) and the TTL sent carries a
  margin so it pauses them first.
- **List**: no cursor, and filters applied within one CubeMaster page (and without per-pair
  URL decoding). The adapter sends no filter, fetches one page large enough for the whole
  cluster (grown while full), filters metadata and states itself and pages client-side
  (keyset over start time and id).
- **`pausing` state** is parsed (`SandboxState.PAUSING`); a `DELETE` answered with
  503 + `Retry-After` while pausing is retried.
- **Data plane**: 410 means the sandbox was killed (`gone`: rebuild); 503 + `Retry-After`
  (resume failed) is retried for stream starts and reads.
- **envd 0.2.0** (CubeAPI constants.rs, every release) has no default user: the adapter always names the user (basic
  auth and `username=`), and omits the Start `stdin` flag below 0.3.0.
- **Network**: Cube's own shape (top-level `allow_internet_access`, `allowOut`, `denyOut`,
  L7 `rules` as a list, which every release takes, translated in rules.py so that Cube's
  first-match, default-deny, exact-host proxy means the console's rules); a domain in
  `allowOut` needs outbound off or `denyOut` 0.0.0.0/0 (checked before sending). Before
  v0.5.0 `allowPublicTraffic` is the egress master switch (build_cubevs_context), so it is sent
  with the egress meaning there, and every sandbox's ports are public (no inbound toggle:
  `inbound_always_public`, so the console refuses a space policy keeping them private). L7
  rules only from v0.4.0 (v0.3.0 drops them).
- **Traffic token**: only in the create answer; returned in `SandboxInfo.traffic_token`
  (the runtime stores it) and cached for `inbound().traffic_token()`.
- **Snapshots**: ids are Cube's own `snap-…` (usable as template ids); v0.2.2 cannot list
  them (it invents ids), so `snapshots()` is None there.
- **Stats**: no release routes `GET /sandboxes/{id}/metrics`: `stats()` is None ("does not
  report") unless the probe finds the route.
- **Templates**: Cube's template API (`POST /templates` from an image, polled until READY;
  `DELETE /templates/{id}`), never E2B's build API.
- **`host-mount`** metadata is reserved by Cube (lifted into an annotation, a bind mount from
  the node's host): refused in user metadata, never echoed. The adapter sets it itself for a
  persistent workspace: with `options["workspace_host_root"]` (shared storage on every Cube
  node) a workspace is the directory `<root>/<name>` mounted at /workspace. Cube has no API to
  make or remove host directories, so a short-lived housekeeping sandbox that mounts the
  root does both (made when a create fails for the missing directory, removed by
  `volumes().delete`).
"""

from __future__ import annotations

import base64
import builtins
import json
import time
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from ..base import (
    META_PURPOSE,
    SNAPSHOT_PREFIX,
    WORKSPACE,
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
    SnapshotInfo,
)
from ..capabilities import SnapshotsCapability, StatsCapability, TemplatesCapability, VolumesCapability
from ..e2b.backend import E2BBackend
from ..e2b.common import ENVD_PORT, NoRoute, check_volume_name, egress_lists, network_problems, translating
from ..e2b.settings import E2BOptions
from ..guard import Resolver
from .common import (
    ALL_TRAFFIC,
    DEFAULT_LIST_LIMIT,
    HOUSEKEEPING_MOUNT,
    HOUSEKEEPING_PURPOSE,
    HOUSEKEEPING_TTL_S,
    LIST_GROWTH,
    LIST_HEADROOM,
    LIST_SNAPSHOT_TTL_S,
    MAX_LIST_LIMIT,
    NO_IDLE_TTL_MARGIN_S,
    RESERVED_METADATA,
    host_root_problem,
)
from .releases import RELEASES, V022, V030, V040, V05, V06, CubeRelease, release_for, with_probed
from .rules import MAX_CONSOLE_RULES, cube_rules, rules_problem
from .settings import CubeOptions
from .templates import CubeSnapshots, CubeTemplates
from .workspaces import CubeWorkspaceDirs

CUBE_DEFAULT_DOMAIN = "cube.app"


@dataclass(frozen=True)
class HostMount:
    """One entry of Cube's `host-mount` annotation (CubeMaster hostdir_mount.go)."""

    host_path: str
    mount_path: str
    read_only: bool = False


def host_mount_json(mounts: Sequence[HostMount]) -> str:
    return json.dumps([{"hostPath": m.host_path, "mountPath": m.mount_path, "readOnly": m.read_only} for m in mounts])


def _metadata_option(value: dict[str, str]) -> dict[str, str]:
    """`CubeOptions.housekeeping_metadata`: the console's metadata, minus what Cube reserves."""
    if RESERVED_METADATA in value:
        raise RemoteError(ErrorKind.INVALID, f"option 'housekeeping_metadata' may not set {RESERVED_METADATA!r}")
    return value


def _encode_token(started: str, sandbox_id: str) -> str:
    return base64.urlsafe_b64encode(f"{started}|{sandbox_id}".encode()).decode()


def _decode_token(token: str) -> tuple[str, str]:
    try:
        started, sep, sandbox_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
    except (ValueError, UnicodeDecodeError):
        raise RemoteError(ErrorKind.INVALID, "malformed page token") from None
    if not sep:
        raise RemoteError(ErrorKind.INVALID, "malformed page token")
    return started, sandbox_id


class CubeBackend(E2BBackend):
    """Sandboxes on a Cube Sandbox cluster (CubeAPI).

    BackendConfig as for E2B; `endpoint` (the CubeAPI URL) is required. Extra options:
    `protocol` (a release's `cube-0.x`, recorded or pinned; `cube_version` `may`/`later` pins
    too), `list_limit` (page size asked of CubeAPI, default 1000), and for persistent
    workspaces `workspace_host_root` (an absolute directory on the Cube nodes' shared
    storage; empty: no workspaces), `workspace_template` (what housekeeping sandboxes start
    from) and `housekeeping_metadata` (JSON object stamped on them, so the reaper knows them).
    """

    kind = "cube"
    label = "Cube Sandbox"
    # Cube's allowOut reaches private addresses (self-hosted: the cluster's own network).
    opens_private = True
    default_domain = CUBE_DEFAULT_DOMAIN
    options_class: ClassVar[type[E2BOptions]] = CubeOptions
    options: CubeOptions

    def __init__(self, config: BackendConfig, *, resolver: Resolver | None = None) -> None:
        super().__init__(config, resolver=resolver)
        self.list_limit = int(self._number_option("list_limit", DEFAULT_LIST_LIMIT)) or DEFAULT_LIST_LIMIT
        known = self.options.protocol or self.options.cube_version or ""
        try:
            # None: not known yet (probed before it matters). A bare `cube_version` pins.
            self.release: CubeRelease | None = release_for(known)
        except ValueError:
            names = sorted(r.protocol for r in RELEASES)
            raise RemoteError(ErrorKind.INVALID, f"option 'protocol' must be one of {names}") from None
        self.protocol_pinned = self.protocol_pinned or bool(self.options.cube_version)
        self._list_snapshot: tuple[str, float, builtins.list[Any]] | None = None
        self.host_root = self.options.workspace_host_root
        problem = host_root_problem(self.host_root) if self.host_root else None
        if problem:
            raise RemoteError(ErrorKind.INVALID, f"option 'workspace_host_root' must be {problem}")
        self.housekeeping_template = self.options.workspace_template
        self.housekeeping_metadata = _metadata_option(self.options.housekeeping_metadata)

    def _api(
        self,
        method: str,
        path: str,
        what: str,
        *,
        idempotent: bool,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        if not self.config.endpoint:
            raise RemoteError(ErrorKind.INVALID, "a Cube config needs the CubeAPI endpoint URL")
        return super()._api(method, path, what, idempotent=idempotent, timeout=timeout, headers=headers, **kwargs)

    def _initial_protocol(self, value: str) -> str:
        return ""  # Cube's protocol is its release (self.release)

    # Health and the release ----------------------------------------------------------------

    def _route_answers(self, method: str, path: str, **kwargs: Any) -> bool:
        """Whether CubeAPI routes `method path`: anything but axum's empty 404/405 says so (a
        401 or a handler's 404 come from a matched route). Only reads, or a PUT on a sandbox
        id that cannot exist."""
        try:
            self._api(method, path, f"probing {method} {path}", idempotent=True, **kwargs)
        except NoRoute:
            return False
        except RemoteError as exc:
            if exc.kind in (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT):
                raise
        return True

    def probe_release(self) -> CubeRelease:
        """The release, told by the routes each release introduced (releases.py), with the
        features a later release may add probed on the server."""
        if not self._route_answers("GET", "/snapshots", params={"limit": 1}):
            release = V022
        elif self._route_answers("GET", "/templates/aliases/console-release-probe"):
            release = V06
        elif self._route_answers("GET", "/cubeapi/v1/auth/session"):
            release = V05
        elif self._route_answers("GET", "/cubeapi/v1/cluster/versions"):
            release = V040
        else:
            release = V030
        probe_id = "console-release-probe-0"
        self.release = with_probed(
            release,
            network_update=self._route_answers("PUT", f"/sandboxes/{probe_id}/network", json={}),
            stats=self._route_answers("GET", f"/sandboxes/{probe_id}/metrics"),
        )
        return self.release

    def known_release(self) -> CubeRelease:
        """The release, probed once when neither recorded nor pinned."""
        if self.release is None:
            return self.probe_release()
        return self.release

    def idles_itself(self) -> bool:
        # Before v0.5.0 Cube forwards no idle behaviour: sandboxes die at the TTL, never pause.
        return self.known_release().idle_pause

    def health(self) -> HealthInfo:
        try:
            response = self._api("GET", "/health", "health check", idempotent=True)
            body = response.json() if response.content else {}
            if not isinstance(body, dict):
                return HealthInfo(ok=False, detail="CubeAPI /health did not answer a JSON object")
            self.check_listing()
            release = self.known_release() if self.protocol_pinned else self.probe_release()
        except RemoteError as exc:
            return HealthInfo(ok=False, detail=exc.message)
        except ValueError:
            return HealthInfo(ok=False, detail="CubeAPI /health did not answer JSON")
        version = f"CubeSandbox {release.name}: {', '.join(release.capabilities())}"
        detail = f"status {body.get('status', '?')}; domain {self.domain}"
        return HealthInfo(ok=True, version=version, detail=detail, protocol=release.protocol)

    def disk_capabilities(self) -> DiskCapabilities:
        return DiskCapabilities(
            writable_layer=True,
            summary="Cube bounds a sandbox's disk by its template's writable layer (writableLayerSize): "
            "templates this console builds get the config's disk limit; a sandbox from another template "
            "has the size that template was built with.",
        )

    def network_capabilities(self) -> NetworkCapabilities:
        # Per release (releases.py): L7 rules from v0.4.0, the inbound toggle from v0.5.0
        # (before, every sandbox's ports are public). Unknown and not reachable: the smallest set.
        try:
            release = self.known_release()
        except RemoteError:
            release = V022
        return NetworkCapabilities(
            outbound_toggle=True,
            allow_out_cidr=True,
            allow_out_domain=True,
            deny_out_cidr=True,
            deny_out_domain=False,
            l7_rules=release.l7_rules,
            max_l7_rules=MAX_CONSOLE_RULES if release.l7_rules else None,
            l7_within_deny=False,
            inbound_toggle=release.inbound_toggle,
            inbound_always_public=not release.inbound_toggle,
            # As on E2B: an allowOut entry beats denyOut; private exceptions are allowOut entries.
            deny_wins=False,
            allow_private=self.opens_private,
        )

    # Lifecycle ---------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        # The network switches mean different things per release (allowPublicTraffic: egress
        # before v0.5, inbound from v0.5), so a release that went stale (the cluster was
        # upgraded or rolled back in place since the connection test, or since this adapter's
        # last create: an adapter lives as long as its config row) would open what the policy
        # closes. Unless pinned, the release is probed before every create (a few GETs).
        if not self.protocol_pinned:
            self.probe_release()
        return super().create(spec)

    def _check_network(self, network: NetworkSpec) -> None:
        problems = network_problems(network, open_private=self.opens_private)
        if problems:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"Cube {'; '.join(problems)}")
        release = self.known_release()
        if network.l7_rules and not release.l7_rules:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"CubeSandbox {release.name} has no L7 rules (it drops them)")
        if network.allow_internet_access:
            allowed = network.domains("allow_out") if network.allow_only else None
            beyond = rules_problem(network.l7_rules, allowed=allowed, deny_cidrs=network.cidrs("deny_out"))
            if beyond:
                raise RemoteError(ErrorKind.UNSUPPORTED, f"Cube cannot take {beyond}")
        _, deny_out = egress_lists(network, open_private=self.opens_private)
        allowed_domains = [str(d) for d in network.domains("allow_out")]
        if allowed_domains and network.allow_internet_access and ALL_TRAFFIC not in deny_out:
            # CubeAPI answers 400 for this; say why before sending.
            raise RemoteError(
                ErrorKind.INVALID,
                f"Cube accepts domains in the allow list ({allowed_domains}) only when outbound "
                f"traffic is off or {ALL_TRAFFIC} is denied (the allow list then opens holes)",
            )

    def _network_body(self, network: NetworkSpec) -> dict[str, Any]:
        # Egress is the top-level `allow_internet_access` (sent by _create_body) on every
        # release; v0.5+ reads it there (build_cube_network_config).
        allow_out, deny_out = egress_lists(network, open_private=self.opens_private)
        body: dict[str, Any] = {"allowOut": allow_out, "denyOut": deny_out}
        release = self.known_release()
        if release.public_traffic_is_egress:
            # Before v0.5.0 allowPublicTraffic, when sent, overrides allow_internet_access as
            # the egress master switch (build_cubevs_context): send it with the egress meaning.
            body["allowPublicTraffic"] = network.allow_internet_access
        else:
            body["allowPublicTraffic"] = network.allow_public_traffic
        if network.l7_rules and network.allow_internet_access and release.l7_rules:
            # Cube's L7 rules are a list, first match wins, default deny, host matched exactly
            # or as `*.x`; E2B's object keyed by domain does not deserialize on Cube. The
            # translation (rules.py) sends the console's meaning in that shape. Outbound off:
            # none, since a name a rule carries is let through to the proxy whatever the lists.
            allowed = network.domains("allow_out") if network.allow_only else None
            rules = cube_rules(network.l7_rules, allowed)
            if rules:
                body["rules"] = rules
        return body

    def _create_body(self, spec: SandboxSpec) -> dict[str, Any]:
        if RESERVED_METADATA in spec.metadata:
            raise RemoteError(ErrorKind.INVALID, f"metadata key {RESERVED_METADATA!r} is reserved by Cube")
        body = super()._create_body(spec)
        # From v0.5.0 the idle behaviour is read only from `lifecycle` (models
        # SandboxLifecycleConfig; absent = kill at the TTL). Older releases read neither.
        body["lifecycle"] = {
            "onTimeout": "pause" if spec.auto_pause else "kill",
            "autoResume": bool(spec.auto_pause and spec.auto_resume),
        }
        return body

    def _ttl(self, seconds: int) -> int:
        if seconds and not self.known_release().idle_pause:
            return seconds + NO_IDLE_TTL_MARGIN_S
        return seconds

    def _route_headers(self, sandbox_id: str) -> dict[str, str]:
        # CubeProxy routes on Host `<port>-<sandboxID>.<domain>` only (it ignores
        # E2b-Sandbox-Id): with `sandbox_url` naming a CubeProxy address, say it in Host. A
        # header-mapping sidecar in front of it still gets E2b-Sandbox-Id as well.
        if not self.sandbox_url:
            return {}
        return {"Host": f"{ENVD_PORT}-{sandbox_id}.{self.domain}"}

    def _mount_workspace(self, body: dict[str, Any], name: str) -> None:
        # CubeAPI lifts `host-mount` out of the labels into an annotation (services/sandboxes.rs).
        body["metadata"][RESERVED_METADATA] = host_mount_json([HostMount(self.host_dir(name), WORKSPACE)])

    def host_dir(self, name: str) -> str:
        return f"{self.host_root}/{check_volume_name(name)}"

    def _provide_workspace(self, name: str) -> None:
        # Nothing up front: the directory is made when a create says it is missing (_submit),
        # so a rebuild onto an existing workspace costs no housekeeping sandbox.
        return None

    def _submit(self, body: Mapping[str, Any], spec: SandboxSpec) -> SandboxInfo:
        try:
            return self._post_sandbox(body, spec)
        except RemoteError as exc:
            if not spec.workspace_volume or exc.kind not in (ErrorKind.INTERNAL, ErrorKind.INVALID):
                raise
            failure = exc
        # Cubelet bind-mounts hostPath and fails when it does not exist (Cubelet
        # storage/hostdir.go; CubeAPI answers 500): make the directory, then try once more.
        try:
            CubeWorkspaceDirs(self).make(spec.workspace_volume)
        except RemoteError as exc:
            raise RemoteError(
                failure.kind, f"{failure.message}; making the workspace directory failed too: {exc.message}"
            ) from exc
        return self._post_sandbox(body, spec)

    def _post_sandbox(self, body: Mapping[str, Any], spec: SandboxSpec) -> SandboxInfo:
        # POST /sandboxes: served by every Cube release (the /v2 path is not). It takes no
        # Idempotency-Key, so a create is never retried.
        response = self._api(
            "POST", "/sandboxes", f"creating a sandbox from {spec.template_id!r}", idempotent=False, json=body
        )
        # The traffic token is only in this answer: _created puts it in SandboxInfo.
        return self._created(response.json(), spec)

    def run_housekeeping(self, argv: tuple[str, ...], what: str) -> None:
        """Run `argv` as root in a short-lived sandbox that mounts the workspace host root at
        HOUSEKEEPING_MOUNT; the sandbox is deleted afterwards whatever happened."""
        if not self.housekeeping_template:
            raise RemoteError(
                ErrorKind.INVALID, "option 'workspace_template' is needed to manage workspace directories"
            )
        spec = SandboxSpec(
            template_id=self.housekeeping_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={**self.housekeeping_metadata, META_PURPOSE: HOUSEKEEPING_PURPOSE},
            timeout_s=HOUSEKEEPING_TTL_S,
            auto_pause=False,  # killed at its TTL if this process dies before deleting it
            auto_resume=False,
        )
        body = self._create_body(spec)
        body["metadata"][RESERVED_METADATA] = host_mount_json([HostMount(self.host_root, HOUSEKEEPING_MOUNT)])
        info = self._post_sandbox(body, spec)
        try:
            result = self.exec(info.sandbox_id, ExecRequest(argv=argv, user="root", timeout_s=120))
        finally:
            with suppress(RemoteError):
                self.delete(info.sandbox_id)
        if result.exit_code != 0:
            problem = result.stderr.decode(errors="replace").strip() or f"exit {result.exit_code}"
            raise RemoteError(ErrorKind.INTERNAL, f"{what}: {problem}")

    def _info(self, data: Mapping[str, Any]) -> SandboxInfo:
        info = super()._info(data)
        if RESERVED_METADATA not in info.metadata:
            return info
        metadata = {k: v for k, v in info.metadata.items() if k != RESERVED_METADATA}
        return SandboxInfo(
            sandbox_id=info.sandbox_id,
            state=info.state,
            template_id=info.template_id,
            metadata=metadata,
            started_at=info.started_at,
            end_at=info.end_at,
        )

    def list(self, query: ListQuery) -> Page:
        # No filter is sent: CubeAPI filters metadata and state *within* the one CubeMaster
        # page of `limit` rows it takes, so a filtered answer shorter than `limit` does not
        # say that nothing matches past the page (and the page is sized from /health's count,
        # which is the server's word). Unfiltered, a short page is the whole cluster; the
        # metadata and states are checked here.
        params: dict[str, Any] = {}
        rows = self._listing(params, continuing=bool(query.page_token))
        items = [self._info(row) for row in rows]
        items = [
            info
            for info in items
            if all(info.metadata.get(k) == v for k, v in query.metadata.items())
            and (not query.states or info.state in query.states)
        ]
        # No cursor from Cube: page here, keyset over (start time, id) so deletions between
        # pages skip nothing.
        items.sort(key=lambda info: (_sort_time(info), info.sandbox_id))
        if query.page_token:
            after = _decode_token(query.page_token)
            items = [info for info in items if (_sort_time(info), info.sandbox_id) > after]
        limit = max(1, query.limit)
        page, rest = items[:limit], items[limit:]
        next_token = _encode_token(_sort_time(page[-1]), page[-1].sandbox_id) if rest and page else None
        return Page(items=tuple(page), next_token=next_token)

    def _listing(self, params: Mapping[str, Any], *, continuing: bool) -> builtins.list[Any]:
        """The rows a listing pages through. The first page fetches them all (Cube has no
        cursor); a following page of the same filter reuses that fetch for a short while, so
        a full walk costs one fetch, not one per page (keyset order keeps it consistent)."""
        key = json.dumps(params, sort_keys=True)
        now = time.monotonic()
        with self._lock:
            cached = self._list_snapshot
        if continuing and cached is not None and cached[0] == key and now - cached[1] < LIST_SNAPSHOT_TTL_S:
            return cached[2]
        rows = self._all_rows(params)
        with self._lock:
            self._list_snapshot = (key, now, rows)
        return rows

    def _all_rows(self, params: Mapping[str, Any]) -> builtins.list[Any]:
        """Every row the filter matches. CubeAPI has no cursor: it takes one page of `limit`
        sandboxes from CubeMaster (start 0) and filters that page, so a match beyond it never
        shows. The page is therefore sized to the cluster's sandbox count (`GET /health`
        `sandboxes`), and a full page is asked again, larger."""
        # Capped: /health's count is the server's word, and a page past the cap is never asked.
        limit = min(max(self.list_limit, self._sandbox_count() + LIST_HEADROOM), MAX_LIST_LIMIT)
        while True:
            response = self._api(
                "GET", "/v2/sandboxes", "listing sandboxes", idempotent=True, params={**params, "limit": limit}
            )
            rows = response.json()
            if not isinstance(rows, builtins.list):
                raise RemoteError(ErrorKind.INTERNAL, "listing sandboxes: CubeAPI did not answer a list")
            if len(rows) < limit:
                return rows
            if limit >= MAX_LIST_LIMIT:
                raise RemoteError(
                    ErrorKind.INTERNAL, f"listing sandboxes: more than {MAX_LIST_LIMIT} match", retryable=False
                )
            limit = min(limit * LIST_GROWTH, MAX_LIST_LIMIT)

    def _sandbox_count(self) -> int:
        """How many sandboxes the cluster holds (CubeAPI /health), 0 when it does not say."""
        response = self._api("GET", "/health", "counting sandboxes", idempotent=True)
        try:
            body = response.json()
        except ValueError:
            return 0
        count = body.get("sandboxes") if isinstance(body, dict) else None
        return count if isinstance(count, int) and count >= 0 else 0

    # Capabilities ------------------------------------------------------------------------

    def snapshots(self) -> SnapshotsCapability | None:
        try:
            release = self.known_release()
        except RemoteError:
            return None
        if not release.snapshots:
            return None  # v0.2.2 invents snapshot ids and cannot list them
        return CubeSnapshots(self)

    def stats(self) -> StatsCapability | None:
        # CubeAPI routes no metrics on any release through v0.6.0: "does not report" rather
        # than a 404 on every reading. A later release with the route is probed.
        try:
            release = self.known_release()
        except RemoteError:
            return None
        return super().stats() if release.stats else None

    def templates(self) -> TemplatesCapability | None:
        return CubeTemplates(self)

    def volumes(self) -> VolumesCapability | None:
        # Workspaces live on the nodes' host storage: only with a root to keep them under.
        return CubeWorkspaceDirs(self) if self.host_root else None

    # Snapshot ids are Cube's own `snap-…`: no presentation prefix.
    @staticmethod
    def _raw_snapshot_id(snapshot_id: str) -> str:
        return snapshot_id

    @staticmethod
    def _presented_snapshot_id(raw: str) -> str:
        return raw

    def _verify_snapshot(self, info: SnapshotInfo) -> None:
        if not info.snapshot_id.startswith(SNAPSHOT_PREFIX):
            raise RemoteError(ErrorKind.INTERNAL, f"Cube answered snapshot id {info.snapshot_id!r}, not a snap- id")
        rows = self.paged_rows("/snapshots", "checking the snapshot", {"sandboxID": info.source_sandbox_id or ""})
        if not any(row.get("snapshotID") == info.snapshot_id for row in rows):
            raise RemoteError(ErrorKind.INTERNAL, f"Cube reported snapshot {info.snapshot_id} but does not list it")


def _sort_time(info: SandboxInfo) -> str:
    return info.started_at.isoformat() if info.started_at else ""


translating(CubeBackend, "create", "list", "probe_release", "run_housekeeping")
