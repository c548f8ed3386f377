"""Kubernetes backend: sandboxes as kubernetes-sigs/agent-sandbox SandboxClaims (v1beta1), read
from the project at commit 2fd412d55ecae90861a101a5424a75473de97c36.

The contract, operation by operation (`claims`, `templates`, `network` say the details):

- `health`: `GET /version`; `GET /apis/extensions.agents.x-k8s.io/v1beta1` (the CRDs are
  served); a list of one claim (the account may read them).
- `create`: per-space mode `POST /api/v1/namespaces` (409: there); the derived
  `SandboxTemplate` and its empty `SandboxWarmPool` (`POST`, 409: there); `POST
  .../sandboxclaims` naming the pool; a watch on the claim (`?watch=1&fieldSelector=
  metadata.name=…` from its resourceVersion, again from a fresh read on 410) until Ready.
- `get`: `GET` the claim, then the `Sandbox` it is bound to (`status.sandbox.name`).
- `list`: `GET .../sandboxclaims?labelSelector=…&limit=…&continue=…`, the API's own pages;
  the page token is its `continue` (an expired one: 410, `gone`).
- `pause`: merge-`PATCH` the Sandbox's `spec.operatingMode: Suspended`; a watch until its
  `Suspended` condition is True (the pod terminated).
- `connect`: `get`; a suspended one: `PATCH operatingMode: Running`, a watch until Ready.
- `delete`: `DELETE` the claim (background propagation: its Sandbox, pod and /workspace
  claim go with it); 404 is success.
- `exec`, `pty()`, `files()`: `pods/exec` (websocket, `v5.channel.k8s.io`, else v4).
- `stats()`: `GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{pod}` (`stats`).
- `templates()`: `GET .../sandboxtemplates` of the backend's namespace.
- `warm_pools()`: a `SandboxWarmPool`'s `spec.replicas`, its `status.readyReplicas` (`pools`).

Pause is a suspend, truthfully: agent-sandbox's `Suspended` terminates the pod and keeps the
Sandbox and its volumes, so memory and processes are lost and a resume starts the pod again
(the state is `stopped`, never `paused`); /workspace is the Sandbox's volume claim
(`workspace-<sandbox>`, from the template's volume claim template) and survives. Whatever the
config's idle mode says, that is what idling does here.

Labels and annotations on a claim (`claims`): `console.sandbox-console/managed=1` and each
metadata pair as `console.sandbox-console/<key>=<value>` (a key or value that is not label
syntax: `k-`/`h-` and a SHA-256 prefix); the exact metadata in the annotation
`console.sandbox-console/metadata` (JSON), the template id in `console.sandbox-console/template`.

Namespaces: `shared` puts every sandbox in `namespace` (default `sandboxes`); `per_space` in
`<namespace>-<space id>` (made on first use), the space read from the sandbox's
`console-space` metadata (a sandbox without one: `namespace`), and `release_space` deletes
it once it holds no claim. Templates named by id are read from `namespace`. An id or a listed
claim in any other namespace (`owns_namespace`), or per space in a namespace not its own
space's (`holds`), is none of this backend's: `not_found`, left alone, not listed.

exec, PTY and files go through pods/exec (`exec.PodExec`, on the `stream` channel client):
`pod_exec()` builds it on this backend's client, finding a sandbox's pod with `pod_of`;
`pty.KubernetesPtys` and `files.KubernetesFiles` stand on it.

Imports nothing of the project but `base`, `capabilities`, `guard` and `netpolicy`.
"""

from __future__ import annotations

import builtins
import hashlib
import logging
import re
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes import client as k8s

from ..base import (
    META_SPACE,
    SANDBOX_UID,
    WORKSPACE,
    Backend,
    BackendConfig,
    ErrorKind,
    ExecRequest,
    ExecResult,
    Finding,
    HealthInfo,
    ListQuery,
    NetworkCapabilities,
    Page,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
)
from ..capabilities import (
    FilesCapability,
    PtyCapability,
    SnapshotsCapability,
    StatsCapability,
    TemplatesCapability,
    WarmPoolCapability,
)
from ..guard import Resolver, system_resolver
from . import check, claims, network
from .claims import CLAIMS, SANDBOXES, SandboxRef, Watcher
from .client import REQUEST_TIMEOUT_S, api_client, call, call_unless, options_of
from .exec import PodExec, PodRef
from .files import KubernetesFiles
from .listing import list_page
from .pty import KubernetesPtys
from .registry import Registry
from .settings import DEFAULT_NAMESPACE, PER_SPACE
from .templates import Derived, KubernetesTemplates

logger = logging.getLogger(__name__)

_NAMESPACE_PART = re.compile(r"[^a-z0-9-]+")
# $0 = /workspace, $1 = the sandbox user's uid.
WORKSPACE_LAYOUT = (
    'cd "$0" && for d in input output; do [ -d "$d" ] || { mkdir "$d" && chown "$1:$1" "$d"; }; done'
    ' && chown "$1:$1" "$0"'
)


class KubernetesBackend(Backend):
    kind = "kubernetes"
    label = "Kubernetes"

    def __init__(self, config: BackendConfig, *, resolver: Resolver | None = None) -> None:
        super().__init__(config)
        self.options = options_of(config)
        self.resolver = resolver or system_resolver
        self.request_timeout = self.options.request_timeout or REQUEST_TIMEOUT_S
        self.ready_timeout = self.options.ready_timeout or claims.READY_TIMEOUT_S
        self._api: k8s.ApiClient | None = None
        self._lock = threading.Lock()
        self._namespaces: set[str] = set()
        self._registry: Registry | None = None
        self.derived = Derived(self)

    # The client --------------------------------------------------------------------------

    @property
    def api(self) -> k8s.ApiClient:
        """The ApiClient, built (and its address checked) on first use."""
        with self._lock:
            if self._api is None:
                self._api = api_client(self.config, resolver=self.resolver)
            return self._api

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                self._api.close()
                self._api = None
            if self._registry is not None:
                self._registry.close()
                self._registry = None

    def get_custom(self, resource: tuple[str, str, str], namespace: str, name: str, what: str) -> dict[str, Any]:
        group, version, plural = resource
        found: dict[str, Any] = call(
            f"reading {what}",
            self.custom.get_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            _request_timeout=self.request_timeout,
        )
        return found

    def create_custom(
        self,
        resource: tuple[str, str, str],
        namespace: str,
        body: dict[str, Any],
        *,
        kind: str,
        exists_ok: bool = False,
    ) -> dict[str, Any]:
        group, version, plural = resource
        name = body["metadata"]["name"]
        document = {"apiVersion": f"{group}/{version}", "kind": kind, **body}
        try:
            made: dict[str, Any] = call(
                f"creating {kind} {namespace}/{name}",
                self.custom.create_namespaced_custom_object,
                group,
                version,
                namespace,
                plural,
                document,
                _request_timeout=self.request_timeout,
            )
            return made
        except RemoteError as exc:
            if exists_ok and exc.kind == ErrorKind.CONFLICT:
                return document
            raise

    def delete_custom(self, resource: tuple[str, str, str], namespace: str, name: str, what: str) -> None:
        """Idempotent: a missing object is deleted already."""
        group, version, plural = resource
        call_unless(
            (ErrorKind.NOT_FOUND, ErrorKind.GONE),
            f"deleting {what}",
            self.custom.delete_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            propagation_policy="Background",
            _request_timeout=self.request_timeout,
        )

    def patch_custom(
        self, resource: tuple[str, str, str], namespace: str, name: str, body: dict[str, Any], what: str
    ) -> dict[str, Any]:
        group, version, plural = resource
        patched: dict[str, Any] = call(
            what,
            self.custom.patch_namespaced_custom_object,
            group,
            version,
            namespace,
            plural,
            name,
            body,
            _content_type="application/merge-patch+json",
            _request_timeout=self.request_timeout,
        )
        return patched

    def list_all(
        self, resource: tuple[str, str, str], namespace: str, what: str, *, selector: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Every object of `resource` in `namespace` (with labels `selector`), following the API's pages."""
        group, version, plural = resource
        items: builtins.list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": 500, "_request_timeout": self.request_timeout}
            if selector:
                kwargs["label_selector"] = selector
            if token:
                kwargs["_continue"] = token
            answer = call(what, self.custom.list_namespaced_custom_object, group, version, namespace, plural, **kwargs)
            items.extend(answer.get("items") or [])
            token = (answer.get("metadata") or {}).get("continue") or None
            if not token:
                return items

    # Namespaces ------------------------------------------------------------------------

    @property
    def base_namespace(self) -> str:
        return self.options.namespace or DEFAULT_NAMESPACE

    @property
    def per_space(self) -> bool:
        return self.options.namespace_mode == PER_SPACE

    def namespace_for(self, metadata: Mapping[str, str]) -> str:
        """Where a sandbox with `metadata` goes (per-space mode: its space's, made on first use)."""
        space = metadata.get(META_SPACE, "")
        if not self.per_space or not space:
            return self.base_namespace
        namespace = self.space_namespace(space)
        self._ensure_namespace(namespace)
        return namespace

    def space_namespace(self, space: str) -> str:
        """A space's namespace in per-space mode: `<namespace>-<space id>` (a digest of the id
        when it is not a namespace's syntax or too long)."""
        part = _NAMESPACE_PART.sub("-", space.lower()).strip("-")
        room = 62 - len(self.base_namespace)
        if not part or part != space or len(part) > room:
            part = hashlib.sha256(space.encode()).hexdigest()[: min(room, 32)]
        return f"{self.base_namespace}-{part}"

    def owns_namespace(self, namespace: str) -> bool:
        """Whether sandboxes of this backend may be in `namespace`: `namespace` (shared), or it
        and the spaces' `<namespace>-…` (per space); never another team's."""
        if namespace == self.base_namespace:
            return True
        return self.per_space and namespace.startswith(f"{self.base_namespace}-")

    def holds(self, claim: Mapping[str, Any]) -> bool:
        """Whether `claim` is where this backend puts it: the base namespace (shared, and what
        a per-space backend made before it was switched, or for no space), or per space its
        own space's namespace."""
        namespace = str((claim.get("metadata") or {}).get("namespace") or "")
        if namespace == self.base_namespace:
            return True
        space = claims.metadata_of(claim).get(META_SPACE, "")
        return self.per_space and bool(space) and namespace == self.space_namespace(space)

    def ref_of(self, sandbox_id: str) -> SandboxRef:
        """Where a sandbox id points, `not_found` for a namespace this backend does not use (an
        id is `<namespace>.<claim>`: one naming another namespace reaches nothing there)."""
        ref = SandboxRef.parse(sandbox_id)
        if not self.owns_namespace(ref.namespace):
            raise RemoteError(ErrorKind.NOT_FOUND, f"sandbox {sandbox_id} not found", retryable=False)
        return ref

    def release_space(self, space: str) -> builtins.list[str]:
        """Per-space mode: the space's namespace (its derived templates and pools with it),
        once it holds no claim; `conflict` naming how many stay. An account without `delete`
        on namespaces leaves it (nothing removed). Shared mode keeps nothing per space."""
        if not self.per_space:
            return []
        namespace = self.space_namespace(space)
        try:
            left = self.list_all(CLAIMS, namespace, f"listing the sandboxes of namespace {namespace}")
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return []
            raise
        if left:
            raise RemoteError(ErrorKind.CONFLICT, f"namespace {namespace} still holds {len(left)} sandbox claim(s)")
        # Forbidden: the account may create namespaces but not delete them (docs/kubernetes.md
        # makes `delete` optional); the namespace then stays, empty, for the cluster's admin.
        kept = (ErrorKind.NOT_FOUND, ErrorKind.FORBIDDEN)
        kw = {"_request_timeout": self.request_timeout}
        if call_unless(kept, f"deleting namespace {namespace}", self.core.delete_namespace, namespace, **kw) is None:
            logger.info("namespace %s not deleted (gone, or not this account's to delete)", namespace)
            return []
        with self._lock:
            self._namespaces.discard(namespace)
        return [f"namespace {namespace}"]

    def _ensure_namespace(self, namespace: str) -> None:
        with self._lock:
            if namespace in self._namespaces:
                return
        body = {"metadata": {"name": namespace, "labels": {claims.MANAGED: "1"}}}
        there = (ErrorKind.CONFLICT,)
        kw = {"_request_timeout": self.request_timeout}
        call_unless(there, f"creating namespace {namespace}", self.core.create_namespace, body, **kw)
        with self._lock:
            self._namespaces.add(namespace)

    # Health ----------------------------------------------------------------------------

    def health(self) -> HealthInfo:
        try:
            version = call("reading the API server's version", k8s.VersionApi(self.api).get_code)
            group, api_version, plural = CLAIMS
            served = call_unless(
                (ErrorKind.NOT_FOUND,),
                f"reading {group}/{api_version}",
                self.custom.get_api_resources,
                group,
                api_version,
                _request_timeout=self.request_timeout,
            )
            names = {resource.name for resource in (served.resources or [] if served else [])}
            missing = {"sandboxclaims", "sandboxtemplates", "sandboxwarmpools"} - names
            if missing:
                raise RemoteError(
                    ErrorKind.UNSUPPORTED,
                    f"agent-sandbox's {group}/{api_version} lacks {', '.join(sorted(missing))}: install its CRDs",
                )
            call(
                f"listing claims in {self.base_namespace}",
                self.custom.list_namespaced_custom_object,
                group,
                api_version,
                self.base_namespace,
                plural,
                limit=1,
                _request_timeout=self.request_timeout,
            )
        except RemoteError as exc:
            return HealthInfo(ok=False, detail=exc.message)
        return HealthInfo(
            ok=True,
            version=f"Kubernetes {version.git_version} with agent-sandbox {api_version}",
            detail=f"namespace {self.base_namespace} ({self.options.namespace_mode or 'shared'})",
        )

    def preflight(self) -> builtins.list[Finding]:
        """Test connection's findings (`check`): the API, agent-sandbox's CRDs at v1beta1, each
        permission the console needs in its namespace (every namespace, per space)."""
        try:
            api = self.api
        except RemoteError as exc:
            return [Finding("api", False, exc.message)]
        namespace = "" if self.per_space else self.base_namespace
        return check.check_cluster(api, namespace, per_space=self.per_space)

    def network_capabilities(self) -> NetworkCapabilities:
        return network.capabilities()

    # Lifecycle -------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        problems = network.problems(spec.network)
        if problems:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"Kubernetes cannot enforce {'; '.join(problems)}")
        if spec.workspace_volume:
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "Kubernetes sandboxes keep /workspace in their own volume claim; a named workspace is not offered",
            )
        namespace = self.namespace_for(spec.metadata)
        pool = self.derived.template_for(spec, namespace)
        try:
            return self.claim_from(pool, namespace, spec, template=pool, env=spec.env)
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
        # The claim found its template or pool gone (deleted behind the adapter's back, which
        # remembers the ones it made): made again, and claimed once more.
        pool = self.derived.template_for(spec, namespace)
        return self.claim_from(pool, namespace, spec, template=pool, env=spec.env)

    def claim_from(
        self, pool: str, namespace: str, spec: SandboxSpec, *, template: str, env: Mapping[str, str]
    ) -> SandboxInfo:
        """Claim a sandbox from `pool` (whose sandboxes are made from `template`) and wait for
        it; a claim that fails is deleted again."""
        name = claims.new_claim_name()
        ref = SandboxRef(namespace, name)
        body = claims.claim_body(
            name, pool=pool, template=template, metadata=spec.metadata, template_id=spec.template_id, env=env
        )
        made = self.create_custom(CLAIMS, namespace, body, kind="SandboxClaim")
        try:
            ready = claims.wait_ready(
                Watcher(self.custom, CLAIMS, namespace, name), timeout_s=self.ready_timeout, initial=made
            )
            self._lay_out_workspace(ref.sandbox_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                self.derived.forget(namespace, pool)
            self.delete(ref.sandbox_id)
            raise
        logger.info("created sandbox %s", ref.sandbox_id, extra={"sandbox_id": ref.sandbox_id, "pool": pool})
        return self._info(ready, None, state=SandboxState.RUNNING)

    def _lay_out_workspace(self, sandbox_id: str) -> None:
        """Give /workspace the layout sessions expect: a fresh volume claim is empty and root's
        (a cluster's storage copies nothing of the image), so input/ and output/ are made and
        all three given to the sandbox user, as root, once, before the sandbox is handed out."""
        request = ExecRequest(
            argv=("/bin/sh", "-c", WORKSPACE_LAYOUT, WORKSPACE, str(SANDBOX_UID)), user="root", timeout_s=60
        )
        try:
            result = self.exec(sandbox_id, request)
        except RemoteError as exc:
            if exc.kind == ErrorKind.UNSUPPORTED:  # no exec in this build: nothing can be laid out
                return
            raise
        if result.exit_code != 0:
            problem = result.stderr.decode(errors="replace").strip() or f"exit {result.exit_code}"
            raise RemoteError(ErrorKind.INTERNAL, f"laying out {WORKSPACE} in sandbox {sandbox_id}: {problem}")

    def _info(self, claim: Mapping[str, Any], sandbox: Mapping[str, Any] | None, *, state: SandboxState) -> SandboxInfo:
        return claims.info_of(claim, state)

    def _read(self, ref: SandboxRef) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The claim and the Sandbox it is bound to (None while unbound or gone)."""
        try:
            claim = self.get_custom(CLAIMS, ref.namespace, ref.claim, f"sandbox {ref.sandbox_id}")
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                raise RemoteError(ErrorKind.NOT_FOUND, f"sandbox {ref.sandbox_id} not found", retryable=False) from None
            raise
        claim.setdefault("metadata", {}).setdefault("namespace", ref.namespace)
        if not self.holds(claim):  # another space's look-alike, or a claim placed by hand
            raise RemoteError(ErrorKind.NOT_FOUND, f"sandbox {ref.sandbox_id} not found", retryable=False)
        bound = claims.sandbox_name(claim)
        if not bound:
            return claim, None
        try:
            return claim, self.get_custom(SANDBOXES, ref.namespace, bound, f"sandbox {bound} of {ref.sandbox_id}")
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
            return claim, None

    def get(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        claim, sandbox = self._read(self.ref_of(sandbox_id))
        return self._info(claim, sandbox, state=claims.sandbox_state(claim, sandbox))

    def list(self, query: ListQuery) -> Page:
        return list_page(self, query)

    def delete(self, sandbox_id: str) -> None:
        try:
            ref = self.ref_of(sandbox_id)
        except RemoteError:
            return  # no such id (or none of this backend's): nothing to delete
        self.delete_custom(CLAIMS, ref.namespace, ref.claim, f"sandbox {sandbox_id}")
        logger.info("deleted sandbox %s", sandbox_id, extra={"sandbox_id": sandbox_id})

    def _bound(self, sandbox_id: str) -> tuple[SandboxRef, dict[str, Any], dict[str, Any]]:
        ref = self.ref_of(sandbox_id)
        claim, sandbox = self._read(ref)
        if sandbox is None:
            state = claims.sandbox_state(claim, None)
            if state == SandboxState.GONE:
                raise RemoteError(ErrorKind.GONE, f"sandbox {sandbox_id} is gone")
            raise RemoteError(ErrorKind.CONFLICT, f"sandbox {sandbox_id} is still starting")
        return ref, claim, sandbox

    def _set_mode(self, ref: SandboxRef, sandbox: Mapping[str, Any], mode: str) -> None:
        name = str((sandbox.get("metadata") or {}).get("name"))
        self.patch_custom(
            SANDBOXES,
            ref.namespace,
            name,
            {"spec": {"operatingMode": mode}},
            f"setting sandbox {ref.sandbox_id} {mode.lower()}",
        )

    def pause(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        """Suspend: the pod is terminated, the Sandbox and /workspace kept (memory is not)."""
        ref, claim, sandbox = self._bound(sandbox_id)
        if (sandbox.get("spec") or {}).get("operatingMode") != "Suspended":
            self._set_mode(ref, sandbox, "Suspended")
        name = str((sandbox.get("metadata") or {}).get("name"))
        watcher = Watcher(self.custom, SANDBOXES, ref.namespace, name)

        def terminated(current: dict[str, Any]) -> bool:
            return (claims.condition(current, "Suspended") or {}).get("status") == "True"

        stopped = watcher.until(terminated, timeout_s=timeout_s or self.ready_timeout, what="to a stop")
        return self._info(claim, stopped, state=SandboxState.STOPPED)

    def connect(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        """A running sandbox; a suspended one is set running and waited for (a new pod:
        processes start afresh, /workspace is as it was)."""
        ref, claim, sandbox = self._bound(sandbox_id)
        state = claims.sandbox_state(claim, sandbox)
        if state == SandboxState.RUNNING:
            return self._info(claim, sandbox, state=state)
        if state == SandboxState.GONE:
            raise RemoteError(ErrorKind.GONE, f"sandbox {sandbox_id} is gone")
        if (sandbox.get("spec") or {}).get("operatingMode") == "Suspended":
            self._set_mode(ref, sandbox, "Running")
        name = str((sandbox.get("metadata") or {}).get("name"))
        watcher = Watcher(self.custom, SANDBOXES, ref.namespace, name)

        def ready(current: dict[str, Any]) -> bool:
            if claims.sandbox_state(claim, current) == SandboxState.GONE:
                raise RemoteError(ErrorKind.GONE, f"sandbox {sandbox_id} is gone")
            mode = (current.get("spec") or {}).get("operatingMode") or "Running"
            return mode == "Running" and (claims.condition(current, "Ready") or {}).get("status") == "True"

        running = watcher.until(ready, timeout_s=timeout_s or self.ready_timeout)
        return self._info(claim, running, state=SandboxState.RUNNING)

    def pod_of(self, sandbox_id: str) -> PodRef:
        """The pod of a running sandbox (exec, PTY, files, stats): the Sandbox's pod (named as
        the Sandbox, or by its `agents.x-k8s.io/pod-name` annotation) and its first
        container. `conflict` when it is not running, `not_found`/`gone` when it is no more."""
        ref, claim, sandbox = self._bound(sandbox_id)
        state = claims.sandbox_state(claim, sandbox)
        if state != SandboxState.RUNNING:
            raise RemoteError(ErrorKind.CONFLICT, f"sandbox {sandbox_id} is {state}, not running")
        meta = sandbox.get("metadata") or {}
        pod = (meta.get("annotations") or {}).get("agents.x-k8s.io/pod-name") or meta.get("name")
        containers = (
            (((sandbox.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}).get("containers")
        ) or []
        container = str(containers[0].get("name")) if containers else ""
        return PodRef(ref.namespace, str(pod), container)

    # Commands, terminals and files: pods/exec -------------------------------------------

    def pod_exec(self) -> PodExec:
        return PodExec(
            self.api.configuration,
            allow_private=self.config.allow_private_endpoints,
            locate=self.pod_of,
            guarded=not self.options.in_cluster,
        )

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        return self.pod_exec().exec(sandbox_id, request)

    def pty(self) -> PtyCapability:
        return KubernetesPtys(self.pod_exec())

    def files(self) -> FilesCapability:
        return KubernetesFiles(self.exec)

    # Capabilities ----------------------------------------------------------------------

    def templates(self) -> TemplatesCapability:
        return KubernetesTemplates(self)

    def snapshots(self) -> SnapshotsCapability:
        from .images import KubernetesSnapshots

        return KubernetesSnapshots(
            self,
            custom=self.custom,
            call=call,
            registry=self.registry,
            namespace=self.base_namespace,
            started=self.container_started,
        )

    def container_started(self, sandbox_id: str) -> datetime | None:
        """When the running sandbox's container started (the pod's container status), or None
        when the pod does not say."""
        ref = self.pod_of(sandbox_id)
        pod = call(f"reading pod {ref.namespace}/{ref.pod}", self.core.read_namespaced_pod, ref.pod, ref.namespace)
        for status in (pod.status.container_statuses if pod.status else None) or []:
            running = status.state.running if status.state else None
            if status.name == ref.container and running is not None and running.started_at is not None:
                started: datetime = running.started_at
                return started
        return None

    @property
    def registry(self) -> Registry | None:
        """The registry skill images are pushed to (`registry_url`), None when none is set;
        built on first use, its connections kept until `close`."""
        if not self.options.registry_url:
            return None
        with self._lock:
            if self._registry is None:
                self._registry = Registry(
                    self.options.registry_url,
                    username=self.options.registry_username,
                    password=self.options.registry_password,
                    allow_private=self.config.allow_private_endpoints,
                    resolver=self.resolver,
                )
            return self._registry

    def stats(self) -> StatsCapability:
        from .stats import KubernetesStats

        return KubernetesStats(self)

    def warm_pools(self) -> WarmPoolCapability:
        from .pools import KubernetesWarmPools

        return KubernetesWarmPools(self)
