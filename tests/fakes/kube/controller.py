"""agent-sandbox's controllers, run in a thread of the fake: the Sandbox controller here, the
SandboxClaim and SandboxWarmPool controllers in `extensions` (upstream splits them the same
way: `controllers/` and `extensions/controllers/`).

Read from kubernetes-sigs/agent-sandbox at commit 2fd412d55ecae90861a101a5424a75473de97c36,
`controllers/sandbox_controller.go`. What is kept: the pod is named after the sandbox (or the
`agents.x-k8s.io/pod-name` annotation), carries the `agents.x-k8s.io/sandbox-name-hash`
label (FNV-1a of the name), the pod template's non-system labels and annotations (recorded in
`agents.x-k8s.io/propagated-labels` / `-annotations`) and the extension labels (warm pool,
template ref hash); each volume claim template becomes a PVC `<template>-<sandbox>` owned by
the sandbox and mounted as a volume of that name; `operatingMode: Suspended` deletes the pod
(the PVCs stay) and clears the pod-name annotation, `Running` makes it again; status carries
`podIPs`, `nodeName`, `selector` and the conditions Suspended, PodScheduled, Finished and Ready
with upstream's reasons and messages. Not kept: the Service (`spec.service`), expiry by
`shutdownTime`, tracing and metrics.

The loop is level-triggered: any store event wakes it, and every pass reconciles every object,
so it converges whatever order events come in; a write that changes nothing is not made.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tests.fakes.kube.crds import SANDBOXES
from tests.fakes.kube.errors import ApiError
from tests.fakes.kube.resources import PODS, PVCS, Resource
from tests.fakes.kube.store import Obj, Store, now

if TYPE_CHECKING:
    from tests.fakes.kube.cluster import FakeCluster

log = logging.getLogger(__name__)

SANDBOX_NAME_HASH = "agents.x-k8s.io/sandbox-name-hash"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
TEMPLATE_REF_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
LAUNCH_TYPE = "agents.x-k8s.io/launch-type"
CREATED_BY = "agents.x-k8s.io/created-by"
WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
TEMPLATE_REF_HASH = "agents.x-k8s.io/sandbox-template-ref-hash"
TEMPLATE_HASH = "agents.x-k8s.io/sandbox-template-hash"
POD_TEMPLATE_HASH = "agents.x-k8s.io/sandbox-pod-template-hash"
ADOPTABLE = "agents.x-k8s.io/adoptable"
PROPAGATED_LABELS = "agents.x-k8s.io/propagated-labels"
PROPAGATED_ANNOTATIONS = "agents.x-k8s.io/propagated-annotations"
EXTENSION_POD_LABELS = (WARM_POOL_LABEL, TEMPLATE_REF_HASH)
EXT_GROUP = "extensions.agents.x-k8s.io"


def name_hash(name: str) -> str:
    """Upstream's NameHash: FNV-1a 32-bit of the name as 8 hex digits."""
    h = 0x811C9DC5
    for byte in name.encode():
        h ^= byte
        h = (h * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def is_system_key(key: str) -> bool:
    return key.startswith(("agents.x-k8s.io/", "extensions.agents.x-k8s.io/"))


def controller_of(obj: Obj) -> dict[str, Any] | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def controller_ref(owner: Obj) -> dict[str, Any]:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controlled_by(obj: Obj, owner: Obj) -> bool:
    ref = controller_of(obj)
    return ref is not None and ref.get("uid") == owner["metadata"]["uid"]


def set_condition(conditions: list[dict[str, Any]], condition: dict[str, Any]) -> list[dict[str, Any]]:
    """meta.SetStatusCondition: replace by type, keeping lastTransitionTime unless the status
    changed."""
    out = [dict(c) for c in conditions]
    for existing in out:
        if existing["type"] == condition["type"]:
            moved = existing.get("status") != condition["status"]
            existing.update(condition)
            if moved or not existing.get("lastTransitionTime"):
                existing["lastTransitionTime"] = now()
            return out
    out.append({**condition, "lastTransitionTime": now()})
    return out


def condition(kind: str, status: str, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "observedGeneration": generation}


def find_condition(obj: Obj, kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return None


def is_ready(obj: Obj) -> bool:
    found = find_condition(obj, "Ready")
    return found is not None and found.get("status") == "True"


def write_status(store: Store, resource: Resource, obj: Obj, status: dict[str, Any]) -> None:
    """Write `status` when it differs from the object's (a no-op write is skipped)."""
    if (obj.get("status") or {}) == status:
        return

    def change(current: Obj) -> Obj:
        current["status"] = status
        return current

    try:
        store.mutate(resource, obj["metadata"].get("namespace"), obj["metadata"]["name"], change, subresource="status")
    except ApiError as exc:
        if exc.code != 404:
            raise


class SandboxReconciler:
    """controllers/sandbox_controller.go: a Sandbox's PVCs, pod and status."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, sandbox: Obj) -> None:
        meta = sandbox["metadata"]
        if meta.get("deletionTimestamp"):
            return
        namespace, name = meta["namespace"], meta["name"]
        hashed = name_hash(name)
        errors: list[str] = []
        try:
            self._pvcs(sandbox, hashed)
        except ApiError as exc:
            errors.append(str(exc))
        pod, pod_error = self._pod(sandbox, hashed)
        if pod_error:
            errors.append(pod_error)
        sandbox = self.store.find(SANDBOXES, namespace, name) or sandbox
        status = copy.deepcopy(sandbox.get("status") or {})
        owned = pod is not None and controlled_by(pod, sandbox)
        if pod is None:
            status.pop("podIPs", None)
            status.pop("nodeName", None)
        else:
            status["selector"] = f"{SANDBOX_NAME_HASH}={hashed}"
            ips = [ip["ip"] for ip in (pod.get("status") or {}).get("podIPs") or []] if owned else []
            if ips:
                status["podIPs"] = ips
            else:
                status.pop("podIPs", None)
            node = pod.get("spec", {}).get("nodeName") if owned else None
            if node:
                status["nodeName"] = node
            else:
                status.pop("nodeName", None)
        generation = meta.get("generation", 1)
        conditions = status.get("conditions") or []
        conditions = set_condition(conditions, self._suspended(sandbox, pod, generation))
        finished = self._finished(sandbox, pod, generation) if owned else None
        scheduled = self._scheduled(pod, generation)
        for kind, value in (("Finished", finished), ("PodScheduled", scheduled)):
            if value is None:
                conditions = [c for c in conditions if c["type"] != kind]
            else:
                conditions = set_condition(conditions, value)
        conditions = set_condition(conditions, self._ready(sandbox, pod, errors, generation))
        status["conditions"] = conditions
        write_status(self.store, SANDBOXES, sandbox, status)

    # -- children -------------------------------------------------------------------------------

    def _pvcs(self, sandbox: Obj, hashed: str) -> None:
        namespace = sandbox["metadata"]["namespace"]
        for template in sandbox["spec"].get("volumeClaimTemplates") or []:
            tmeta = template.get("metadata") or {}
            pvc_name = f"{tmeta.get('name', '')}-{sandbox['metadata']['name']}"
            existing = self.store.find(PVCS, namespace, pvc_name)
            if existing is not None:
                if (
                    controller_of(existing) is None
                    and (existing["metadata"].get("labels") or {}).get(SANDBOX_NAME_HASH) == hashed
                ):
                    self.store.mutate(PVCS, namespace, pvc_name, lambda o: _own(o, sandbox))
                continue
            body = {
                "metadata": {
                    "name": pvc_name,
                    "labels": {**(tmeta.get("labels") or {}), SANDBOX_NAME_HASH: hashed},
                    "ownerReferences": [controller_ref(sandbox)],
                },
                "spec": copy.deepcopy(template.get("spec") or {}),
            }
            if tmeta.get("annotations"):
                body["metadata"]["annotations"] = dict(tmeta["annotations"])
            self.store.create(PVCS, namespace, body)

    def _pod(self, sandbox: Obj, hashed: str) -> tuple[Obj | None, str]:
        meta = sandbox["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        annotations = meta.get("annotations") or {}
        pod_name = annotations.get(POD_NAME_ANNOTATION) or name
        pod = self.store.find(PODS, namespace, pod_name)
        if pod is None and POD_NAME_ANNOTATION in annotations:
            self._set_pod_name(sandbox, None)
        if sandbox["spec"].get("operatingMode") == "Suspended":
            if pod is not None and controlled_by(pod, sandbox):
                self._delete(PODS, namespace, pod_name)
                return self.store.find(PODS, namespace, pod_name), ""
            self._set_pod_name(sandbox, None)
            return pod, ""
        if pod is not None:
            ref = controller_of(pod)
            if ref is not None and ref.get("uid") != meta["uid"]:
                self._set_pod_name(sandbox, None)
                return None, (
                    f'pod "{pod_name}" is owned by {ref.get("kind")}/{ref.get("name")} (UID: {ref.get("uid")}), '
                    f'not by sandbox "{name}"'
                )
            labels = pod["metadata"].get("labels") or {}
            if ref is None and labels.get(ADOPTABLE) != "true" and labels.get(SANDBOX_NAME_HASH) != hashed:
                return None, (
                    f'cannot adopt unowned pod "{pod_name}": missing required pool authorization label '
                    f'("{ADOPTABLE}") or sandbox tracking label ("{SANDBOX_NAME_HASH}")'
                )
            wanted = self._pod_labels(sandbox, hashed, pod)
            if ref is None or wanted != labels:
                self.store.mutate(PODS, namespace, pod_name, lambda o: _relabel(_own(o, sandbox), wanted))
            self._set_pod_name(sandbox, pod_name)
            return self.store.find(PODS, namespace, pod_name), ""
        template = sandbox["spec"].get("podTemplate") or {}
        tmeta = template.get("metadata") or {}
        labels = {k: v for k, v in (tmeta.get("labels") or {}).items() if not is_system_key(k)}
        managed_labels = sorted(labels)
        labels[SANDBOX_NAME_HASH] = hashed
        labels.update(self._extension_labels(sandbox))
        created_by = (meta.get("labels") or {}).get(CREATED_BY)
        if created_by:
            labels[CREATED_BY] = created_by
        pod_annotations = {k: v for k, v in (tmeta.get("annotations") or {}).items() if not is_system_key(k)}
        managed_annotations = sorted(pod_annotations)
        if managed_labels:
            pod_annotations[PROPAGATED_LABELS] = ",".join(managed_labels)
        if managed_annotations:
            pod_annotations[PROPAGATED_ANNOTATIONS] = ",".join(managed_annotations)
        spec = copy.deepcopy(template.get("spec") or {})
        claim_volumes = [
            {"name": t["metadata"]["name"], "persistentVolumeClaim": {"claimName": f"{t['metadata']['name']}-{name}"}}
            for t in sandbox["spec"].get("volumeClaimTemplates") or []
        ]
        names = {v["name"] for v in claim_volumes}
        spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") not in names] + claim_volumes
        body: Obj = {
            "metadata": {
                "name": name,
                "labels": labels,
                "ownerReferences": [controller_ref(sandbox)],
            },
            "spec": spec,
        }
        if pod_annotations:
            body["metadata"]["annotations"] = pod_annotations
        try:
            pod = self.store.create(PODS, namespace, body)
        except ApiError as exc:
            return None, f"pod create error: {exc}"
        self._set_pod_name(sandbox, name)
        return pod, ""

    def _extension_labels(self, sandbox: Obj) -> dict[str, str]:
        ref = controller_of(sandbox)
        if ref is None or ref.get("apiVersion", "").split("/")[0] != EXT_GROUP:
            return {}
        labels = sandbox["metadata"].get("labels") or {}
        out = {}
        if ref.get("kind") == "SandboxWarmPool" and labels.get(WARM_POOL_LABEL):
            out[WARM_POOL_LABEL] = labels[WARM_POOL_LABEL]
        if labels.get(TEMPLATE_REF_HASH):
            out[TEMPLATE_REF_HASH] = labels[TEMPLATE_REF_HASH]
        return out

    def _pod_labels(self, sandbox: Obj, hashed: str, pod: Obj) -> dict[str, str]:
        """updatePodMetadata: the template's labels set, ones no longer in it dropped, the
        extension labels kept in step with the sandbox's owner."""
        labels = dict(pod["metadata"].get("labels") or {})
        template_labels = ((sandbox["spec"].get("podTemplate") or {}).get("metadata") or {}).get("labels") or {}
        propagated = ((pod["metadata"].get("annotations") or {}).get(PROPAGATED_LABELS) or "").split(",")
        for key in propagated:
            if key and not is_system_key(key) and key not in template_labels:
                labels.pop(key, None)
        labels.update({k: v for k, v in template_labels.items() if not is_system_key(k)})
        labels[SANDBOX_NAME_HASH] = hashed
        extension = self._extension_labels(sandbox)
        for key in EXTENSION_POD_LABELS:
            if key in extension:
                labels[key] = extension[key]
            else:
                labels.pop(key, None)
        return labels

    def _set_pod_name(self, sandbox: Obj, pod_name: str | None) -> None:
        current = (sandbox["metadata"].get("annotations") or {}).get(POD_NAME_ANNOTATION)
        if current == pod_name or (pod_name is not None and current):
            return

        def change(obj: Obj) -> Obj:
            annotations = obj["metadata"].setdefault("annotations", {})
            if pod_name is None:
                annotations.pop(POD_NAME_ANNOTATION, None)
            else:
                annotations[POD_NAME_ANNOTATION] = pod_name
            return obj

        try:
            self.store.mutate(SANDBOXES, sandbox["metadata"]["namespace"], sandbox["metadata"]["name"], change)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _delete(self, resource: Resource, namespace: str, name: str) -> None:
        try:
            self.store.delete(resource, namespace, name)
        except ApiError as exc:
            if exc.code != 404:
                raise

    # -- conditions -----------------------------------------------------------------------------

    @staticmethod
    def _suspended(sandbox: Obj, pod: Obj | None, generation: int) -> dict[str, Any]:
        if sandbox["spec"].get("operatingMode") != "Suspended":
            return condition("Suspended", "False", "NotSuspended", "", generation)
        if pod is None:
            return condition("Suspended", "True", "PodTerminated", "", generation)
        if not controlled_by(pod, sandbox):
            return condition("Suspended", "False", "PodNotOwned", "", generation)
        return condition("Suspended", "False", "PodTerminating", "", generation)

    @staticmethod
    def _scheduled(pod: Obj | None, generation: int) -> dict[str, Any] | None:
        if pod is None:
            return None
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled":
                reason = c.get("reason") or ("PodScheduled" if c.get("status") == "True" else "PodSchedulingUnknown")
                return condition("PodScheduled", c.get("status", "Unknown"), reason, c.get("message", ""), generation)
        return condition("PodScheduled", "Unknown", "PodSchedulingUnknown", "", generation)

    @staticmethod
    def _finished(sandbox: Obj, pod: Obj | None, generation: int) -> dict[str, Any] | None:
        phase = ((pod or {}).get("status") or {}).get("phase")
        if phase == "Succeeded":
            return condition("Finished", "True", "PodSucceeded", "Pod completed successfully", generation)
        if phase == "Failed":
            return condition("Finished", "True", "PodFailed", "Pod failed", generation)
        return None

    @staticmethod
    def _ready(sandbox: Obj, pod: Obj | None, errors: list[str], generation: int) -> dict[str, Any]:
        if errors:
            return condition("Ready", "False", "ReconcilerError", "Error seen: " + "\n".join(errors), generation)
        if sandbox["spec"].get("operatingMode") == "Suspended":
            message = "Sandbox is suspending" if pod is not None else "Sandbox is suspended"
            return condition("Ready", "False", "SandboxSuspended", message, generation)
        if pod is None:
            return condition("Ready", "False", "DependenciesNotReady", "Pod does not exist", generation)
        status = pod.get("status") or {}
        phase = status.get("phase", "")
        if phase == "Succeeded":
            return condition("Ready", "False", "PodSucceeded", "Pod completed successfully", generation)
        if phase == "Failed":
            return condition("Ready", "False", "PodFailed", "Pod failed", generation)
        message = f"Pod exists with phase: {phase}"
        ready = False
        if phase == "Running":
            message = "Pod is Running but not Ready"
            for c in status.get("conditions") or []:
                if c.get("type") == "Ready":
                    if c.get("status") == "True":
                        if status.get("podIPs"):
                            message, ready = "Pod is Ready", True
                        else:
                            message = "Pod is Ready but has no podIPs yet"
                    break
        if ready:
            return condition("Ready", "True", "DependenciesReady", message, generation)
        return condition("Ready", "False", "DependenciesNotReady", message, generation)


def _own(obj: Obj, owner: Obj) -> Obj:
    refs = [r for r in obj["metadata"].get("ownerReferences") or [] if not r.get("controller")]
    obj["metadata"]["ownerReferences"] = [*refs, controller_ref(owner)]
    return obj


def _relabel(obj: Obj, labels: dict[str, str]) -> Obj:
    obj["metadata"]["labels"] = labels
    return obj


class ControllerLoop:
    """One thread running reconcile passes, woken by every store event (and every second)."""

    def __init__(self, name: str, store: Store, reconcile: Callable[[], None], period: float = 1.0) -> None:
        self.name = name
        self.store = store
        self._reconcile = reconcile
        self.period = period
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.idle = threading.Event()

    def start(self) -> None:
        self._unsubscribe = self.store.subscribe(lambda event: self._wake.set())
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
        self._stop.set()
        self._wake.set()
        if self._thread:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.period)
            if self._stop.is_set():
                return
            self._wake.clear()
            self.idle.clear()
            try:
                self._reconcile()
            except ApiError as exc:  # a conflict or a race with a client: the next pass retries
                log.debug("%s: %s", self.name, exc)
                self._wake.set()
            except Exception:
                log.exception("%s: reconcile pass failed", self.name)
            self.idle.set()


def start_controllers(cluster: FakeCluster) -> Callable[[], None]:
    """Start the controllers on the cluster's store (PVC protection always; agent-sandbox's
    when its CRDs are installed); the function stops them."""
    from tests.fakes.kube.core import release_claims
    from tests.fakes.kube.extensions import ClaimReconciler, WarmPoolReconciler

    store = cluster.store
    sandboxes = SandboxReconciler(store)
    claims = ClaimReconciler(store)
    pools = WarmPoolReconciler(store)

    def reconcile_all() -> None:
        release_claims(store)
        if SANDBOXES.key not in store.resources:
            return
        for pool in store.items(pools.resource):
            pools.reconcile(pool)
        for claim in store.items(claims.resource):
            claims.reconcile(claim)
        for sandbox in store.items(SANDBOXES):
            sandboxes.reconcile(sandbox)

    loop = ControllerLoop("fake-kube-controllers", store, reconcile_all)
    loop.start()
    return loop.stop
