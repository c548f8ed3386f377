"""Warm pools kept by the cluster: a console pool is a `SandboxWarmPool` (agent-sandbox,
commit 2fd412d55ecae90861a101a5424a75473de97c36, `extensions/api/v1beta1/sandboxwarmpool_types.go`).

- `ensure(pool, spec, size)`: the spec's derived template (`templates.Derived`, the one a
  create of that spec uses), and the pool `sc-pool-<digest of the console's pool name>` in
  the spec's namespace with `replicas: size` and `sandboxTemplateRef` that template (created,
  else merge-patched); `updateStrategy: Recreate`, so a changed spec (a new template)
  replaces the unclaimed sandboxes at once. Answers (`status.readyReplicas`, the rest of
  `status.replicas`) as last reported by the controller. Size 0 drains it. The console's
  name for the pool is kept in its annotation `console.sandbox-console/pool-name`.
- `pools()`: the pools labelled `console.sandbox-console/pool` (one list; across namespaces
  in per-space mode, keeping the backend's own namespaces only), by the console's names,
  with their counts.
- `drain(pool)`: `DELETE` the pool (found by its label): its unclaimed sandboxes go with it
  (they are the pool's), claimed ones are their claims' and stay.
- `claim(pool, spec)`: None unless the pool reports a ready sandbox; else a SandboxClaim
  naming the pool (the controller adopts a ready sandbox; it carries the claim's labels and
  annotations like any other, so get, list and delete treat it the same). A spec with env
  gets None: the controller cold-starts any claim with env (a running pod takes none).

May import: the contract, `.claims`, `.templates` (through the backend).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, RemoteError, SandboxInfo, SandboxSpec
from ..capabilities import WarmPoolCapability
from .claims import MANAGED, PREFIX, WARM_POOLS
from .client import call

if TYPE_CHECKING:
    from .backend import KubernetesBackend

POOL = PREFIX + "pool"
POOL_NAME = PREFIX + "pool-name"


def pool_name(pool: str) -> str:
    return "sc-pool-" + hashlib.sha256(pool.encode()).hexdigest()[:24]


class KubernetesWarmPools(WarmPoolCapability):
    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend

    def _refuse(self, spec: SandboxSpec) -> None:
        if spec.workspace_volume:
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "Kubernetes sandboxes keep /workspace in their own volume claim; a named workspace is not offered",
            )

    def ensure(self, pool: str, spec: SandboxSpec, size: int) -> tuple[int, int]:
        if size < 0:
            raise RemoteError(ErrorKind.INVALID, "a pool's size is 0 or more")
        if size == 0:
            self.drain(pool)
            return 0, 0
        self._refuse(spec)
        namespace = self.backend.namespace_for(spec.metadata)
        template = self.backend.derived.template_for(spec, namespace)
        name = pool_name(pool)
        body: dict[str, Any] = {
            "spec": {
                "replicas": size,
                "sandboxTemplateRef": {"name": template},
                "updateStrategy": {"type": "Recreate"},
            }
        }
        metadata = {"name": name, "labels": {MANAGED: "1", POOL: _label(pool)}, "annotations": {POOL_NAME: pool}}
        try:
            made = self.backend.create_custom(
                WARM_POOLS, namespace, {"metadata": metadata, **body}, kind="SandboxWarmPool"
            )
        except RemoteError as exc:
            if exc.kind != ErrorKind.CONFLICT:
                raise
            made = self.backend.patch_custom(WARM_POOLS, namespace, name, body, f"sizing warm pool {name}")
        return _counts(made)

    def claim(self, pool: str, spec: SandboxSpec) -> SandboxInfo | None:
        self._refuse(spec)
        if spec.env:
            return None
        namespace = self.backend.namespace_for(spec.metadata)
        name = pool_name(pool)
        try:
            found = self.backend.get_custom(WARM_POOLS, namespace, name, f"warm pool {name}")
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return None
            raise
        ready, _ = _counts(found)
        if ready == 0:
            return None
        template = str(((found.get("spec") or {}).get("sandboxTemplateRef") or {}).get("name") or "")
        return self.backend.claim_from(name, namespace, spec, template=template, env={})

    def _kept(self, selector: str) -> list[dict[str, Any]]:
        group, version, plural = WARM_POOLS
        if self.backend.per_space:
            answer = call(
                "listing warm pools",
                self.backend.custom.list_cluster_custom_object,
                group,
                version,
                plural,
                label_selector=selector,
                _request_timeout=self.backend.request_timeout,
            )
            # Across the cluster: another team's look-alike pool is not ours to report or drain.
            return [
                item
                for item in answer.get("items") or []
                if self.backend.owns_namespace(str((item.get("metadata") or {}).get("namespace") or ""))
            ]
        return self.backend.list_all(WARM_POOLS, self.backend.base_namespace, "listing warm pools", selector=selector)

    def pools(self) -> dict[str, tuple[int, int]]:
        found = {}
        for item in self._kept(f"{MANAGED}=1,{POOL}"):
            name = ((item.get("metadata") or {}).get("annotations") or {}).get(POOL_NAME)
            if name:
                found[str(name)] = _counts(item)
        return found

    def drain(self, pool: str) -> None:
        for item in self._kept(f"{MANAGED}=1,{POOL}={_label(pool)}"):
            meta = item.get("metadata") or {}
            self.backend.delete_custom(
                WARM_POOLS,
                str(meta.get("namespace") or self.backend.base_namespace),
                str(meta.get("name")),
                "a warm pool",
            )


def _label(pool: str) -> str:
    return hashlib.sha256(pool.encode()).hexdigest()[:40]


def _counts(pool: dict[str, Any]) -> tuple[int, int]:
    status = pool.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    return ready, max(0, int(status.get("replicas") or 0) - ready)
