"""Control plane of the fake: the E2B REST API (spec/openapi.yml of e2b-dev/E2B) and the
Cube differences (TencentCloud/CubeSandbox CubeAPI/src/routes.rs, CubeAPI/src/models/mod.rs).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import secrets
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any

from tests.fakes.cube_egress import rules_error
from tests.fakes.fake_builds import Builds
from tests.fakes.fake_http import HttpError, NoRoute, Reply, Request
from tests.fakes.fake_lifecycle import Lifecycle
from tests.fakes.fake_state import FakeSandbox, Store, Template, new_id, now, rfc3339

Handler = Callable[[Request, Reply], None]
Served = Callable[[], bool]

# CubeAPI services/sandboxes.rs FORBIDDEN_ENV_NAMES (from v0.5.0; earlier releases check no names).
CUBE_FORBIDDEN_ENVS = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "LD_PRELOAD",
        "LD_AUDIT",
        "LD_LIBRARY_PATH",
        "LD_ORIGIN_PATH",
        "DYLD_INSERT_LIBRARIES",
        "DYLD_LIBRARY_PATH",
        "GCONV_PATH",
        "PATH",
        "PYTHONPATH",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "GEM_PATH",
        "RUBYOPT",
        "RUBYLIB",
        "PERL5LIB",
        "PERLLIB",
        "CLASSPATH",
        "IFS",
    }
)
ALL_TRAFFIC = "0.0.0.0/0"
_IP_OR_CIDR = re.compile(r"^[0-9a-fA-F:.]+(/\d+)?$")


def encode_token(offset: int) -> str:
    """Opaque page token (the SDK must not interpret it)."""
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode().rstrip("=")


def decode_token(token: str) -> int:
    try:
        padded = token + "=" * (-len(token) % 4)
        return int(json.loads(base64.urlsafe_b64decode(padded))["o"])
    except (ValueError, KeyError, TypeError) as e:
        raise HttpError(400, f"invalid nextToken: {token!r}") from e


class ControlPlane:
    def __init__(self, store: Store, lifecycle: Lifecycle) -> None:
        self.store = store
        self.life = lifecycle
        self.routes: list[tuple[str, re.Pattern[str], Handler, Served]] = []
        self.idempotency: dict[str, str] = {}
        self.builds = Builds(store)
        self._register()

    # -- routing ------------------------------------------------------------------------------

    def _route(self, method: str, pattern: str, handler: Handler, served: Served | None = None) -> None:
        """`served` says whether this personality has the route at all (else its router
        answers 404, or 405 when the path has other methods)."""
        regex = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern)
        self.routes.append((method, re.compile(f"^{regex}$"), handler, served or (lambda: True)))

    def _sdk_v2(self) -> bool:
        # SDK >= 2.51 create/connect: E2B cloud only. Absent from e2b-dev/infra
        # spec/openapi.yml (2026-08) and from every Cube release (PR #1800 unmerged).
        if self.store.is_cube:
            return self.store.cube_pr1800  # a Cube built with PR #1800, for SDK 2.63 tests
        return self.store.e2b_api == "cloud"

    def _snapshot_list(self) -> bool:
        # GET /snapshots and rollback: E2B, and Cube from v0.3.0 (CubeAPI routes.rs @6e482266).
        return not self.store.is_cube or self.store.cube_has("snapshot_list")

    def _register(self) -> None:
        r = self._route
        e2b_only = lambda: not self.store.is_cube  # noqa: E731
        r("GET", "/health", self.health)
        r("POST", "/sandboxes", self.create_v1)
        r("POST", "/v2/sandboxes", self.create_v2, self._sdk_v2)
        r("GET", "/sandboxes", self.list_v1)
        r("GET", "/v2/sandboxes", self.list_v2)
        r("GET", "/sandboxes/{sid}", self.get_sandbox)
        r("DELETE", "/sandboxes/{sid}", self.delete_sandbox)
        r("POST", "/sandboxes/{sid}/pause", self.pause)
        r("POST", "/sandboxes/{sid}/resume", self.resume_v1)
        r("POST", "/sandboxes/{sid}/connect", self.connect_v1)
        r("POST", "/v2/sandboxes/{sid}/connect", self.connect_v2, self._sdk_v2)
        r("POST", "/sandboxes/{sid}/timeout", self.set_timeout)
        r("POST", "/sandboxes/{sid}/refreshes", self.refresh)
        # No Cube release routes a network update or metrics (CubeAPI routes.rs @b1b7ec65..08f2f5d7).
        r("PUT", "/sandboxes/{sid}/network", self.update_network, e2b_only)
        r("POST", "/sandboxes/{sid}/snapshots", self.create_snapshot)
        r("POST", "/sandboxes/{sid}/fork", self.fork, e2b_only)
        r("POST", "/sandboxes/{sid}/rollback", self.cube_rollback, lambda: self.store.cube_has("snapshot_list"))
        r("GET", "/snapshots", self.list_snapshots, self._snapshot_list)
        r("GET", "/sandboxes/{sid}/metrics", self.metrics, e2b_only)
        r("GET", "/v2/sandboxes/{sid}/logs", self.logs)
        r("GET", "/templates", self.list_templates_v1)
        r("GET", "/v2/templates", self.list_templates_v2)
        r("POST", "/templates", self.cube_create_template)
        r(
            "GET",
            "/templates/aliases/{alias}",
            self.template_alias,
            lambda: not self.store.is_cube or self.store.cube_has("aliases"),
        )
        r("GET", "/templates/{tid}", self.get_template)
        r("PATCH", "/templates/{tid}", self.cube_patch_template)
        r("DELETE", "/templates/{tid}", self.delete_template)
        r("GET", "/templates/{tid}/builds/{bid}/status", self.build_status)
        r("POST", "/v3/templates", self.request_build, e2b_only)
        r("GET", "/templates/{tid}/files/{hash}", self.build_file_link)
        r("POST", "/v2/templates/{tid}/builds/{bid}", self.start_build)
        volumes = self.life.volumes
        r("POST", "/volumes", volumes.post)
        r("GET", "/volumes", volumes.list)
        r("GET", "/volumes/{vid}", volumes.get_one)
        r("DELETE", "/volumes/{vid}", volumes.delete_one)

    def handle(self, req: Request, reply: Reply) -> None:
        path = req.path
        if self.store.is_cube and path.startswith("/cubeapi/v1/"):
            # Cube serves everything under /cubeapi/v1 as well (CubeAPI/src/routes.rs), and a
            # few routes only there (build_cubeapi_router).
            path = path[len("/cubeapi/v1") :]
            if self._cubeapi_only(path, req, reply):
                return
        allowed: list[str] = []
        for method, regex, handler, served in self.routes:
            m = regex.match(path)
            if not m or not served():
                continue
            if method != req.method:
                allowed.append(method)
                continue
            req.params = {k: urllib.parse.unquote(v) for k, v in m.groupdict().items()}
            if path != "/health":
                self._authenticate(req)
            handler(req, reply)
            return
        raise NoRoute(405 if allowed else 404)

    def _cubeapi_only(self, path: str, req: Request, reply: Reply) -> bool:
        """The /cubeapi/v1-only routes a release has; False when `path` is none of them."""
        if path == "/cluster/versions" and self.store.cube_has("cluster_versions"):
            if req.method != "GET":
                raise NoRoute(405)
            self._authenticate(req)
            # handlers/cluster.rs cluster_versions -> VersionMatrixView (CubeMaster's build).
            reply.json(200, {"controlPlane": {"version": "dev"}, "components": [], "nodes": []})
            return True
        if path == "/auth/session" and self.store.cube_has("auth_session"):
            if req.method != "GET":
                raise NoRoute(405)
            # handlers/auth.rs session: unauthenticated; no database -> login not enforced.
            reply.json(200, {"authRequired": False, "authenticated": False})
            return True
        return False

    def _authenticate(self, req: Request) -> None:
        # spec/openapi.yml securitySchemes ApiKeyAuth: the key in header X-API-Key only (the
        # Bearer scheme is the dashboard's access token, not an API key).
        key = req.header("x-api-key")
        if key != self.store.api_key:
            raise HttpError(401, "Invalid API key")

    def _sandbox(self, req: Request) -> FakeSandbox:
        sbx = self.store.get(req.params["sid"])
        if sbx is None:
            raise HttpError(404, f"sandbox \"{req.params['sid']}\" doesn't exist or you don't have access to it")
        return sbx

    # -- shapes -------------------------------------------------------------------------------

    def sandbox_json(self, sbx: FakeSandbox, *, created: bool) -> dict[str, Any]:
        # spec/openapi.yml: components/schemas/Sandbox
        out: dict[str, Any] = {
            "templateID": sbx.template_id,
            "sandboxID": sbx.sandbox_id,
            "clientID": "fake-client",
            "envdVersion": sbx.envd_version,
            "alias": sbx.alias,
            "domain": "cube.app" if self.store.is_cube else None,
        }
        if self.store.is_cube:
            # Cube: envdAccessToken is null; the traffic token only in the create response.
            out["envdAccessToken"] = None
            out["trafficAccessToken"] = sbx.traffic_access_token if created else None
        else:
            if sbx.envd_access_token:
                out["envdAccessToken"] = sbx.envd_access_token
            out["trafficAccessToken"] = sbx.traffic_access_token
        return out

    def listed_json(self, sbx: FakeSandbox) -> dict[str, Any]:
        # spec/openapi.yml: components/schemas/ListedSandbox (every required field, and the
        # optional volumeMounts when the sandbox has some).
        out: dict[str, Any] = {
            "templateID": sbx.template_id,
            "alias": sbx.alias,
            "sandboxID": sbx.sandbox_id,
            "clientID": "fake-client",
            "startedAt": rfc3339(sbx.started_at),
            "endAt": rfc3339(sbx.end_at),
            "cpuCount": sbx.cpu_count,
            "memoryMB": sbx.memory_mb,
            # Cube reports diskSizeMB 0 (CubeAPI list handler).
            "diskSizeMB": 0 if self.store.is_cube else sbx.disk_size_mb,
            "state": sbx.state,
            "envdVersion": sbx.envd_version,
            "metadata": sbx.metadata,
        }
        if self.store.is_cube and not sbx.metadata:
            del out["metadata"]  # CubeAPI optional_metadata: no labels, no field
        if sbx.volume_mounts:
            out["volumeMounts"] = sbx.volume_mounts
        return out

    def detail_json(self, sbx: FakeSandbox) -> dict[str, Any]:
        # spec/openapi.yml: components/schemas/SandboxDetail
        out = self.listed_json(sbx)
        out["domain"] = "cube.app" if self.store.is_cube else None
        out["allowInternetAccess"] = sbx.allow_internet_access
        if sbx.network is not None:
            out["network"] = sbx.network
        out["lifecycle"] = {
            "autoResume": sbx.auto_resume,
            "onTimeout": "pause" if sbx.auto_pause else "kill",
        }
        if not self.store.is_cube and sbx.envd_access_token:
            out["envdAccessToken"] = sbx.envd_access_token
        return out

    # -- health -------------------------------------------------------------------------------

    def health(self, req: Request, reply: Reply) -> None:
        if self.store.is_cube:
            # CubeAPI GET /health: 200 {status, sandboxes}
            reply.json(200, {"status": "ok", "sandboxes": len(self.store.sandboxes)})
        else:
            # spec/openapi.yml: GET /health -> 204
            reply.empty(204)

    # -- create -------------------------------------------------------------------------------

    def create_v1(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes (NewSandbox -> 201 Sandbox), spec default timeout 15
        self._create(req, reply, default_timeout=15)

    def create_v2(self, req: Request, reply: Reply) -> None:
        # SDK 2.63 api/client/models/new_sandbox_v2.py (NewSandboxV2 -> 201 Sandbox), default
        # timeout 300. NewSandboxV2 has no `secure`: every sandbox created this way secures
        # envd access and returns an envdAccessToken (its docstring).
        if self.store.is_cube and req.json().get("autoPauseMemory") is False:
            raise HttpError(400, "autoPauseMemory=false is not supported")  # Cube PR #1800
        self._create(req, reply, default_timeout=300, secure=not self.store.is_cube)

    def _create(self, req: Request, reply: Reply, default_timeout: int, secure: bool = False) -> None:
        body = req.json()
        if not isinstance(body, dict):
            raise HttpError(400, "body must be a JSON object")
        if self.store.is_cube:
            self._cube_validate_create(body)
        body["_egress"] = self._egress(body)
        body["_inbound"] = self._inbound(body)
        body["_l7_rules"] = self._l7_rules(body)
        body["_idle"] = self._idle(body)
        if secure:
            body["secure"] = True
        # spec/openapi.yml: POST /v2/sandboxes header Idempotency-Key: a retried create with the
        # same key returns the sandbox the first attempt made.
        key = req.header("idempotency-key")
        previous = self.store.get(self.idempotency.get(key, "")) if key else None
        if previous is not None:
            reply.json(201, self.sandbox_json(previous, created=True))
            return
        sbx = self.life.create(body, default_timeout)
        if key:
            self.idempotency[key] = sbx.sandbox_id
        reply.json(201, self.sandbox_json(sbx, created=True))

    def _egress(self, body: dict[str, Any]) -> bool:
        """Whether the server lets the new sandbox reach the internet."""
        network = body.get("network") or {}
        deny_all = ALL_TRAFFIC in (network.get("denyOut") or network.get("deny_out") or [])
        if self.store.cube_has("public_traffic_is_egress"):
            # Before v0.5.0 (services/sandboxes.rs build_cubevs_context @b1b7ec65, @6e482266;
            # build_cube_network_config @870a2463): allowPublicTraffic, when sent, overrides
            # allow_internet_access as the egress switch.
            allowed = network.get("allowPublicTraffic")
            if allowed is None:
                allowed = body.get("allow_internet_access")
            return allowed is not False and not deny_all
        # spec/openapi.yml NewSandbox.allow_internet_access (default true); Cube from v0.5.0
        # build_cube_network_config reads the same flag (allowPublicTraffic is inbound).
        return body.get("allow_internet_access") is not False and not deny_all

    def _inbound(self, body: dict[str, Any]) -> bool:
        """Whether anyone may reach the new sandbox's ports without its traffic token."""
        network = body.get("network") or {}
        if self.store.is_cube and not self.store.cube_has("inbound_gate"):
            # Before v0.5.0 nothing gates CubeProxy's per-sandbox URL (no AllowPublicTraffic in
            # CubeMaster or CubeProxy @870a2463): every sandbox's ports are public.
            return True
        # spec/openapi.yml NewSandbox.network.allowPublicTraffic (default true); Cube from
        # v0.5.0 CubeMaster sandbox_run.go (default true, a token only when false).
        return network.get("allowPublicTraffic") is not False

    def _l7_rules(self, body: dict[str, Any]) -> list[Any]:
        """The L7 rules that reach the sandbox's egress proxy."""
        rules = (body.get("network") or {}).get("rules")
        if self.store.is_cube and not self.store.cube_has("l7_rules"):
            return []  # before v0.4.0 SandboxNetworkConfig has no `rules`: serde drops it
        return list(rules) if isinstance(rules, list) else []

    def _idle(self, body: dict[str, Any]) -> tuple[bool, bool]:
        """(pause at the TTL, resume on traffic), as this server reads the create body."""
        top = (bool(body.get("autoPause", False)), bool((body.get("autoResume") or {}).get("enabled", False)))
        if not self.store.is_cube:
            return top  # spec/openapi.yml NewSandbox autoPause / autoResume
        if not self.store.cube_has("idle_from_lifecycle"):
            # Before v0.5.0 models NewSandbox parses autoPause, but CreateSandboxRequest has no
            # field for it (services/sandboxes.rs create_sandbox): idle sandboxes die at the TTL.
            return (False, False)
        # From v0.5.0: models SandboxLifecycleConfig only; absent lifecycle = kill
        # (services/sandboxes.rs create_sandbox @30b4e25a, @08f2f5d7).
        lifecycle = body.get("lifecycle")
        if not isinstance(lifecycle, dict):
            return (False, False)
        on_timeout = lifecycle.get("onTimeout", lifecycle.get("on_timeout", "kill"))
        if on_timeout not in ("kill", "pause"):
            raise HttpError(400, f"lifecycle.onTimeout: unknown variant {on_timeout!r}")
        return (on_timeout == "pause", bool(lifecycle.get("autoResume", lifecycle.get("auto_resume", False))))

    def _cube_validate_create(self, body: dict[str, Any]) -> None:
        if self.store.cube_has("env_names_checked"):
            for name in body.get("envVars") or body.get("envs") or {}:
                if name in CUBE_FORBIDDEN_ENVS:
                    raise HttpError(400, f"environment variable name '{name}' is not allowed")
        if not self.store.cube_has("l7_rules"):
            return  # before v0.4.0 create_sandbox validates nothing of the network
        network = body.get("network") or {}
        allow_internet = body.get("allow_internet_access")
        if self.store.cube_has("public_traffic_is_egress") and network.get("allowPublicTraffic") is not None:
            allow_internet = network.get("allowPublicTraffic")  # v0.4.0: the effective switch
        self._cube_validate_network(network, allow_internet)

    def _cube_validate_network(self, network: dict[str, Any], allow_internet: Any) -> None:
        # SandboxNetworkConfig.rules (CubeAPI models, v0.4.0-v0.6.0): a list; a domain in
        # allowOut needs the egress switch off or denyOut containing 0.0.0.0/0
        # (validate_allow_out_domains_require_deny_all).
        rules = network.get("rules")
        if rules is not None and not isinstance(rules, list):
            raise HttpError(400, "network.rules: invalid type: map, expected a sequence")
        if isinstance(rules, list):
            problem = rules_error(rules)  # cube_egress.py: CubeAPI models, CubeEgress policy.lua
            if problem:
                raise HttpError(400, problem)
        allow_out = network.get("allowOut") or network.get("allow_out") or []
        deny_out = network.get("denyOut") or network.get("deny_out") or []
        has_domain = any(not _IP_OR_CIDR.match(str(a)) for a in allow_out)
        if has_domain and allow_internet is not False and ALL_TRAFFIC not in deny_out:
            raise HttpError(
                400,
                "a domain in allowOut requires allow_internet_access=false or denyOut 0.0.0.0/0",
            )

    # -- list -----------------------------------------------------------------------------------

    def list_v1(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /sandboxes (deprecated) -> [ListedSandbox], running only
        items = self._filtered(req, default_states={"running"})
        reply.json(200, [self.listed_json(s) for s in items])

    def list_v2(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /v2/sandboxes -> [ListedSandbox] + X-Next-Token
        if self.store.is_cube:
            # CubeAPI services/sandboxes.rs list: CubeMaster answers one page of `limit` rows
            # from index 0 (oldest first), then CubeAPI filters metadata and state: no
            # X-Next-Token, nextToken ignored, a match beyond the page never shows.
            limit = max(1, int(req.q("limit") or 100))
            with self.store.lock:
                page = sorted(self.store.sandboxes.values(), key=lambda s: (s.started_at, s.sandbox_id))[:limit]
            allowed = {s.sandbox_id for s in page}
            items = [s for s in self._filtered(req, default_states=None) if s.sandbox_id in allowed]
            reply.json(200, [self.listed_json(s) for s in items])
            return
        items = self._filtered(req, default_states=None)
        page, headers = self._paginate(req, items)
        headers["X-Total-Running"] = str(sum(1 for s in items if s.state == "running"))
        reply.json(200, [self.listed_json(s) for s in page], headers)

    def _filtered(self, req: Request, default_states: set[str] | None) -> list[FakeSandbox]:
        with self.store.lock:
            items = list(self.store.sandboxes.values())
        wanted_meta = self._metadata_filter(req.q("metadata"))
        states = self._state_filter(req.q("state")) or default_states
        template = req.q("template")
        started_after = _parse_time(req.q("startedAfter"))
        out = []
        for s in items:
            if any(s.metadata.get(k) != v for k, v in wanted_meta.items()):
                continue
            if states and s.state not in states:
                continue
            if template and template not in (s.template_id, s.alias):
                continue
            if started_after and s.started_at < started_after:  # "at or after"
                continue
            out.append(s)
        descending = (req.q("order") or "desc") == "desc"
        out.sort(key=lambda s: (s.started_at, s.sandbox_id), reverse=descending)
        return out

    def _metadata_filter(self, raw: str | None) -> dict[str, str]:
        """The `metadata` query value, already decoded once by the query parser.

        E2B (e2b-dev/infra packages/api/internal/utils parseFilters): unescape the whole
        value, split on `&` and `=`, then unescape each key and value. Cube (CubeAPI
        services/sandboxes.rs filter_by_metadata): split on `&` and `=`, nothing more, so a
        pair needing escapes never matches there."""
        if not raw:
            return {}
        if self.store.is_cube:
            return dict(pair.partition("=")[::2] for pair in raw.split("&") if pair)
        try:
            whole = _query_unescape(raw)
            pairs = [pair.partition("=") for pair in whole.split("&") if pair]
            return {_query_unescape(k): _query_unescape(v) for k, _, v in pairs}
        except ValueError as e:
            raise HttpError(400, f"error when parsing metadata: {e}") from e

    def _state_filter(self, raw: str | None) -> set[str] | None:
        if not raw:
            return None
        states = {s for s in raw.split(",") if s}
        if self.store.is_cube and len(states) > 1:
            # Cube's state filter takes one value; `running,paused` means no filter.
            return None
        if not self.store.is_cube and not states <= {"running", "paused"}:
            raise HttpError(400, f"invalid state filter: {raw}")
        return states

    def _paginate(self, req: Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
        limit = int(req.q("limit") or 100)
        if not 1 <= limit <= 100:
            raise HttpError(400, "limit must be between 1 and 100")
        token = req.q("nextToken")
        offset = decode_token(token) if token else 0
        page = items[offset : offset + limit]
        headers: dict[str, str] = {}
        if offset + limit < len(items):
            headers["X-Next-Token"] = encode_token(offset + limit)
        fault = self.store.take_fault("api", req.method, req.path, ("repeat_token",))
        if fault is not None:
            # A broken server that hands the same cursor back forever.
            headers["X-Next-Token"] = token or encode_token(0)
        return page, headers

    # -- single sandbox -------------------------------------------------------------------------

    def get_sandbox(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /sandboxes/{sandboxID} -> SandboxDetail
        reply.json(200, self.detail_json(self._sandbox(req)))

    def delete_sandbox(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: DELETE /sandboxes/{sandboxID} -> 204, 404
        sbx = self._sandbox(req)
        if sbx.state == "pausing":
            # Cube C-later: CubeMaster 130490 (pausing) -> 503 Retry-After: 2
            raise HttpError(503, "sandbox is pausing, retry later", {"Retry-After": "2"})
        self.life.kill(sbx)
        reply.empty(204)

    def pause(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/pause -> 204, 409 already paused, 404.
        # Cube ignores the body (memory flag): it always snapshots memory.
        sbx = self._sandbox(req)
        self.life.pause(sbx)
        reply.empty(204)

    def resume_v1(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/resume (deprecated) -> 201, 409 running
        sbx = self._sandbox(req)
        if sbx.state == "running":
            raise HttpError(409, f"sandbox {sbx.sandbox_id} is already running")
        self.life.resume(sbx, _int_or_none(req.json().get("timeout")))
        reply.json(201, self.sandbox_json(sbx, created=False))

    def connect_v1(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/connect {timeout} -> 200 / 201
        body = req.json()
        if "timeout" not in body:
            raise HttpError(400, "timeout is required")
        self._connect(req, reply, _int_or_none(body.get("timeout")))

    def connect_v2(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /v2/sandboxes/{sandboxID}/connect {timeout?, memory?} -> 200/201
        body = req.json()
        if self.store.is_cube and body.get("memory") is False:
            raise HttpError(400, "memory=false is not supported")  # Cube PR #1800
        # SDK 2.63 sends memory:false for on_resume="reboot": a cold boot from disk.
        self._connect(req, reply, _int_or_none(body.get("timeout")), reboot=body.get("memory") is False)

    def _connect(self, req: Request, reply: Reply, timeout: int | None, reboot: bool = False) -> None:
        sbx = self._sandbox(req)
        resumed = self.life.resume(sbx, timeout, reboot=reboot)
        with self.store.lock:
            renamed = resumed and self.store.new_id_on_resume > 0
            if renamed:
                self.store.new_id_on_resume -= 1
        if renamed:
            self.store.rename(sbx, new_id())
        # Cube answers 200 even after resuming.
        status = 201 if resumed and not self.store.is_cube else 200
        reply.json(status, self.sandbox_json(sbx, created=False))

    def set_timeout(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/timeout {timeout} -> 204; TTL from now
        sbx = self._sandbox(req)
        timeout = _int_or_none(req.json().get("timeout"))
        if timeout is None or timeout < 0:
            raise HttpError(400, "timeout is required")
        sbx.set_ttl(timeout)
        reply.empty(204)

    def refresh(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/refreshes {duration 0..3600} -> 204
        sbx = self._sandbox(req)
        duration = _int_or_none(req.json().get("duration")) or sbx.timeout
        if not 0 <= duration <= 3600:
            raise HttpError(400, "duration must be between 0 and 3600")
        sbx.set_ttl(duration)
        reply.empty(204)

    def update_network(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: PUT /sandboxes/{sandboxID}/network -> 204; replaces every rule.
        sbx = self._sandbox(req)
        body = req.json()
        allow_internet = body.pop("allow_internet_access", None)
        if self.store.is_cube:
            self._cube_validate_network(body, allow_internet)
        elif isinstance(body.get("rules"), list):
            raise HttpError(400, "rules must be an object keyed by domain")
        sbx.network = body
        sbx.allow_internet_access = allow_internet
        reply.empty(204)

    def metrics(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /sandboxes/{sandboxID}/metrics -> [SandboxMetric] (synthetic)
        sbx = self._sandbox(req)
        t = now()
        reply.json(
            200,
            [
                {
                    "timestamp": rfc3339(t),
                    "timestampUnix": int(t.timestamp()),
                    "cpuCount": sbx.cpu_count,
                    "cpuUsedPct": 1.0,
                    "memUsed": 64 * 1024 * 1024,
                    "memTotal": sbx.memory_mb * 1024 * 1024,
                    "memCache": 8 * 1024 * 1024,  # required by SandboxMetric (e2b-dev/infra spec)
                    "diskUsed": 16 * 1024 * 1024,
                    "diskTotal": sbx.disk_size_mb * 1024 * 1024,
                }
            ],
        )

    def logs(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /v2/sandboxes/{sandboxID}/logs -> {"logs": []}
        self._sandbox(req)
        reply.json(200, {"logs": []})

    # -- snapshots ------------------------------------------------------------------------------

    def create_snapshot(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/snapshots {name?} -> 201 SnapshotInfo
        sbx = self._sandbox(req)
        name = req.json().get("name")
        tpl = self.life.snapshot(sbx, name if isinstance(name, str) and name else None)
        reply.json(201, {"snapshotID": tpl.template_id, "names": tpl.names})

    def fork(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /sandboxes/{sandboxID}/fork {timeout, count 1..100}
        # -> 201 [{sandbox?, error?}]
        sbx = self._sandbox(req)
        body = req.json()
        count = _int_or_none(body.get("count")) or 1
        if not 1 <= count <= 100:
            raise HttpError(400, "count must be between 1 and 100")
        timeout = _int_or_none(body.get("timeout"))
        children = self.life.fork(sbx, count, sbx.timeout if timeout is None else timeout)
        reply.json(201, [{"sandbox": self.sandbox_json(c, created=True)} for c in children])

    def cube_rollback(self, req: Request, reply: Reply) -> None:
        # CubeAPI C-later: POST /sandboxes/:id/rollback {snapshotID}
        # -> {sandboxID, snapshotID, operationID, status}
        sbx = self._sandbox(req)
        snapshot_id = req.json().get("snapshotID")
        snapshot = self.store.templates.get(str(snapshot_id))
        if snapshot is None or snapshot.kind != "snapshot":
            raise HttpError(404, f"snapshot '{snapshot_id}' not found")
        self.life.rollback(sbx, snapshot)
        reply.json(
            200,
            {
                "sandboxID": sbx.sandbox_id,
                "snapshotID": snapshot.template_id,
                "operationID": new_id("op-", 12),
                "status": "SUCCESS",
            },
        )

    def list_snapshots(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /snapshots {sandboxID, name, limit, nextToken} -> [SnapshotInfo];
        # Cube adds status/originSandboxID?/createdAt?; v0.2.2 has no such route.
        sandbox_id, name = req.q("sandboxID"), req.q("name")
        with self.store.lock:
            snaps = [t for t in self.store.templates.values() if t.kind == "snapshot"]
        if sandbox_id:
            snaps = [t for t in snaps if t.origin_sandbox_id == sandbox_id]
        if name:
            snaps = [t for t in snaps if t.answers_to(name)]
        snaps.sort(key=lambda t: t.created_at)
        page, headers = self._paginate(req, snaps)
        reply.json(200, [self._snapshot_json(t) for t in page], headers)

    def _snapshot_json(self, tpl: Template) -> dict[str, Any]:
        out: dict[str, Any] = {"snapshotID": tpl.template_id, "names": tpl.names}
        if self.store.is_cube:
            out.update(
                status="READY",
                originSandboxID=tpl.origin_sandbox_id,
                createdAt=rfc3339(tpl.created_at),
                updatedAt=rfc3339(tpl.created_at),
            )
        return out

    # -- templates ------------------------------------------------------------------------------

    def _e2b_template_json(self, tpl: Template) -> dict[str, Any]:
        # spec/openapi.yml: components/schemas/Template
        created = rfc3339(tpl.created_at)
        return {
            "templateID": tpl.template_id,
            "buildID": tpl.build_id or str(uuid.uuid5(uuid.NAMESPACE_URL, tpl.template_id)),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "public": False,
            "aliases": tpl.names,
            "names": tpl.names,
            "createdAt": created,
            "updatedAt": created,
            "createdBy": None,
            "lastSpawnedAt": None,
            "spawnCount": tpl.spawn_count,
            "buildCount": 1,
            "envdVersion": self.store.envd_version,
            "buildStatus": tpl.status.lower(),
        }

    def _cube_template_json(self, tpl: Template) -> dict[str, Any]:
        # CubeAPI models: TemplateSummary; `aliases` from v0.6.0 (models/mod.rs @08f2f5d7).
        out: dict[str, Any] = {
            "templateID": tpl.template_id,
            "instanceType": tpl.extra.get("instanceType", "cubebox"),
            "version": "v1",
            "status": tpl.status,
            "lastError": tpl.extra.get("lastError", ""),
            "createdAt": rfc3339(tpl.created_at),
            "imageInfo": tpl.image,
        }
        if self.store.cube_has("aliases"):
            out["aliases"] = list(tpl.names)
        return out

    def _templates(self) -> list[Template]:
        with self.store.lock:
            # Snapshots are kept out of E2B template lists (they are listed under /snapshots).
            return [t for t in self.store.templates.values() if t.kind == "template"]

    def list_templates_v1(self, req: Request, reply: Reply) -> None:
        if self.store.is_cube:
            # CubeAPI: GET /templates -> [TemplateSummary]
            reply.json(200, [self._cube_template_json(t) for t in self._templates()])
            return
        # spec/openapi.yml: GET /templates -> [Template]
        reply.json(200, [self._e2b_template_json(t) for t in self._templates()])

    def list_templates_v2(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /v2/templates -> [Template] + X-Next-Token
        page, headers = self._paginate(req, self._templates())
        reply.json(200, [self._e2b_template_json(t) for t in page], headers)

    def _template(self, req: Request) -> Template:
        tpl = self.store.templates.get(req.params["tid"])
        if tpl is None:
            raise HttpError(404, f"template '{req.params['tid']}' not found")
        return tpl

    def get_template(self, req: Request, reply: Reply) -> None:
        tpl = self._template(req)
        if self.store.is_cube:
            # CubeAPI: GET /templates/:id -> TemplateDetail {..., replicas[], createRequest}
            detail = self._cube_template_json(tpl)
            detail.update(replicas=[], createRequest=tpl.extra.get("createRequest", {}))
            reply.json(200, detail)
            return
        base = self._e2b_template_json(tpl)
        if self.store.e2b_api == "cloud":
            # SDK 2.63 api/client/models/template_with_builds.py: every Template field + builds.
            out = dict(base)
        else:
            # e2b-dev/infra spec/openapi.yml TemplateWithBuilds: fewer fields (no buildID,
            # cpuCount, memoryMB, diskSizeMB, createdBy, buildCount, envdVersion, buildStatus).
            keys = ("templateID", "public", "aliases", "names", "createdAt", "updatedAt")
            out = {k: base[k] for k in keys}
        out.update(
            lastSpawnedAt=None,
            spawnCount=tpl.spawn_count,
            builds=[
                {
                    "buildID": base["buildID"],
                    "status": "ready",
                    "createdAt": base["createdAt"],
                    "updatedAt": base["updatedAt"],
                    "cpuCount": 2,
                    "memoryMB": 512,
                    "envdVersion": self.store.envd_version,
                }
            ],
        )
        reply.json(200, out)

    def template_alias(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /templates/aliases/{alias} -> {templateID, public}
        alias = req.params["alias"]
        for t in self._templates():
            if alias in t.names:
                reply.json(200, {"templateID": t.template_id, "public": False})
                return
        raise HttpError(404, f"alias '{alias}' not found")

    def delete_template(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: DELETE /templates/{templateID} -> 204 (also deletes snapshots).
        # Cube: -> {templateID, operationID, status}.
        tpl = self.life.delete_template(req.params["tid"])
        if self.store.is_cube:
            reply.json(
                200,
                {
                    "templateID": tpl.template_id,
                    "operationID": new_id("op-", 12),
                    "status": "DELETED",
                },
            )
            return
        reply.empty(204)

    def build_status(self, req: Request, reply: Reply) -> None:
        tpl = self._template(req)
        if self.store.is_cube:
            # CubeAPI: {buildID, templateID, status, progress, message}
            reply.json(
                200,
                {
                    "buildID": req.params["bid"],
                    "templateID": tpl.template_id,
                    "status": tpl.status,
                    "progress": 100,
                    "message": tpl.extra.get("lastError", ""),
                },
            )
            return
        # spec/openapi.yml: GET /templates/{templateID}/builds/{buildID}/status
        # {logsOffset, limit, level} -> TemplateBuildInfo
        if (tpl.template_id, req.params["bid"]) not in self.builds.builds:
            # A template the fake was started with (e.g. "base"): always built.
            reply.json(
                200,
                {
                    "logs": [],
                    "logEntries": [],
                    "templateID": tpl.template_id,
                    "buildID": req.params["bid"],
                    "status": "ready",
                },
            )
            return
        build = self.builds.get(tpl.template_id, req.params["bid"])
        offset = _int_or_none(req.q("logsOffset")) or 0
        limit = _int_or_none(req.q("limit")) or 100
        reply.json(200, self.builds.status(build, offset, limit, req.q("level")))

    def request_build(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /v3/templates {name, tags, cpuCount, memoryMB}
        # -> 202 TemplateRequestResponseV3 {templateID, buildID, public, names, tags, aliases}
        tpl, build = self.builds.request(req.json())
        tags = tpl.extra["tags"]
        reply.json(
            202,
            {
                "templateID": tpl.template_id,
                "buildID": build.build_id,
                "public": False,
                "names": [f"{tpl.names[0]}:{t}" for t in tags],
                "tags": tags,
                "aliases": tpl.names,
            },
        )

    def build_file_link(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: GET /templates/{templateID}/files/{hash} -> 201 {present, url?}.
        # No upload URL: the fake has no file store, so COPY steps fail at build time.
        self._template(req)
        reply.json(201, {"present": True})

    def start_build(self, req: Request, reply: Reply) -> None:
        # spec/openapi.yml: POST /v2/templates/{templateID}/builds/{buildID}
        # {fromImage | fromTemplate, steps[], startCmd, readyCmd, force} -> 202
        self.builds.start(req.params["tid"], req.params["bid"], req.json())
        reply.empty(202)

    def cube_create_template(self, req: Request, reply: Reply) -> None:
        # CubeAPI: POST /templates {image, name|alias, ...} -> 202 {jobID, templateID, status,
        # phase, progress, errorMessage}. The server mints tpl-... (C-later). The image must
        # exist in the local engine: that is the fake's "registry".
        if not self.store.is_cube:
            raise HttpError(405, "POST /templates is the Cube template API; E2B uses /v3/templates")
        body = req.json()
        image = body.get("image")
        if not isinstance(image, str) or not image:
            raise HttpError(400, "image is required")
        if self.store.cube_may:
            # v0.2.2 models CreateTemplateRequest: templateID required (length >= 1), used as is.
            tid = body.get("templateID")
            if not isinstance(tid, str) or not tid:
                raise HttpError(400, "templateID: length must be at least 1")
            if tid in self.store.templates:
                raise HttpError(409, f"template '{tid}' already exists")
        else:
            tid = "tpl-" + secrets.token_hex(8)  # from v0.3.0 the server mints one
        ok = self.store.runtime.image_exists(image)
        names = [n for n in (body.get("name"), body.get("alias")) if isinstance(n, str) and n]
        tpl = Template(
            template_id=tid,
            image=image,
            names=names,
            created_at=now(),
            build_id=new_id("build-", 10),
            status="READY" if ok else "FAILED",
            extra={
                "createRequest": body,
                "instanceType": body.get("instanceType", "cubebox"),
                "lastError": "" if ok else f"image {image} not found",
            },
        )
        with self.store.lock:
            self.store.templates[tid] = tpl
        reply.json(
            202,
            {
                "jobID": tpl.build_id,
                "templateID": tid,
                "status": tpl.status,
                "phase": "DONE" if ok else "FAILED",
                "progress": 100,
                "errorMessage": tpl.extra["lastError"],
            },
        )

    def cube_patch_template(self, req: Request, reply: Reply) -> None:
        # CubeAPI C-May: PATCH /templates/:id -> 501
        raise HttpError(501, "not implemented")


_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _query_unescape(text: str) -> str:
    """Go's url.QueryUnescape: `+` is a space, `%XX` a byte, a bad escape an error."""
    if _ESCAPE.search(text):
        raise ValueError(f"invalid URL escape in {text!r}")
    return urllib.parse.unquote_plus(text, errors="strict")


def _parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as e:
        raise HttpError(400, f"invalid date-time: {value!r}") from e
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise HttpError(400, f"not an integer: {value!r}") from e
