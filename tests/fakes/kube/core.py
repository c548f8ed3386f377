"""Admission for the core kinds the fake keeps: the defaults the apiserver fills in on create
and the validation a client meets first (a pod needs containers, each with a name and an image;
a PVC needs access modes and a storage request); and the PVC protection of
kube-controller-manager: a PVC carries the `kubernetes.io/pvc-protection` finalizer, so
deleting one that a pod still mounts leaves it Terminating until no pod uses it.
"""

from __future__ import annotations

from typing import Any

from tests.fakes.kube.errors import ApiError
from tests.fakes.kube.resources import PODS, PVCS, Resource
from tests.fakes.kube.store import Store

PVC_PROTECTION = "kubernetes.io/pvc-protection"

Cause = dict[str, str]


def _required(path: str) -> Cause:
    return {"reason": "FieldValueRequired", "message": "Required value", "field": path}


def _pod(obj: dict[str, Any], creating: bool) -> list[Cause]:
    spec = obj.setdefault("spec", {})
    causes: list[Cause] = []
    containers = spec.get("containers")
    if not containers:
        return [_required("spec.containers")]
    for i, container in enumerate(containers):
        if not container.get("name"):
            causes.append(_required(f"spec.containers[{i}].name"))
        if not container.get("image"):
            causes.append(_required(f"spec.containers[{i}].image"))
        if creating:
            image = str(container.get("image", ""))
            latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
            container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("resources", {})
    if creating:
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        spec.setdefault("enableServiceLinks", True)
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    return causes


def _pvc(obj: dict[str, Any], creating: bool) -> list[Cause]:
    spec = obj.setdefault("spec", {})
    causes: list[Cause] = []
    if not spec.get("accessModes"):
        causes.append(_required("spec.accessModes"))
    if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
        causes.append(_required("spec.resources[storage]"))
    if creating and not causes:
        spec.setdefault("volumeMode", "Filesystem")
        finalizers = obj["metadata"].setdefault("finalizers", [])
        if PVC_PROTECTION not in finalizers:
            finalizers.append(PVC_PROTECTION)
        obj["status"] = {"phase": "Pending"}
    return causes


def admit(resource: Resource, obj: dict[str, Any], old: dict[str, Any] | None) -> list[Cause]:
    """The store's validator for pods and PVCs (defaults filled in on create)."""
    if resource is PODS:
        return _pod(obj, old is None)
    if resource is PVCS:
        return _pvc(obj, old is None)
    return []


def release_claims(store: Store) -> None:
    """The pvc-protection controller: drop the finalizer of a deleted PVC no pod mounts."""
    for pvc in store.items(PVCS):
        meta = pvc["metadata"]
        if not meta.get("deletionTimestamp") or PVC_PROTECTION not in (meta.get("finalizers") or []):
            continue
        in_use = any(
            (volume.get("persistentVolumeClaim") or {}).get("claimName") == meta["name"]
            for pod in store.items(PODS, meta["namespace"])
            for volume in pod["spec"].get("volumes") or []
        )
        if in_use:
            continue

        def release(obj: dict[str, Any]) -> dict[str, Any]:
            obj["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or [] if f != PVC_PROTECTION]
            return obj

        try:
            store.mutate(PVCS, meta["namespace"], meta["name"], release)
        except ApiError as exc:
            if exc.code != 404:
                raise
