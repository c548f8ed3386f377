"""The resource types the fake serves and the discovery documents describing them.

A `Resource` is one entry of an APIResourceList (group, version, plural, kind, scope, verbs,
subresources); `/api`, `/apis` and `/apis/<group>/<version>` are built from the registered
ones, so a client's discovery (and `kubectl api-resources`) sees exactly what the fake serves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
READ_VERBS = ("get", "list")


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()  # "status", "scale", "exec", ...
    verbs: tuple[str, ...] = ALL_VERBS
    stored: bool = True  # False: answered by a handler (reviews, metrics), never kept

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    def base_path(self, namespace: str | None) -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"


def _core(plural: str, kind: str, **kw: Any) -> Resource:
    return Resource("", "v1", plural, kind, **kw)


NAMESPACES = _core("namespaces", "Namespace", namespaced=False, short_names=("ns",), subresources=("status",))
PODS = _core("pods", "Pod", short_names=("po",), subresources=("status", "exec", "log"))
PVCS = _core("persistentvolumeclaims", "PersistentVolumeClaim", short_names=("pvc",), subresources=("status",))
SERVICES = _core("services", "Service", short_names=("svc",), subresources=("status",))
EVENTS = _core("events", "Event", short_names=("ev",))
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",))
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
    short_names=("crd", "crds"),
    subresources=("status",),
    verbs=(*READ_VERBS, "watch"),
)
SSAR = Resource(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    namespaced=False,
    verbs=("create",),
    stored=False,
)
SSRR = Resource(
    "authorization.k8s.io",
    "v1",
    "selfsubjectrulesreviews",
    "SelfSubjectRulesReview",
    namespaced=False,
    verbs=("create",),
    stored=False,
)
POD_METRICS = Resource("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", verbs=READ_VERBS, stored=False)
NODE_METRICS = Resource(
    "metrics.k8s.io", "v1beta1", "nodes", "NodeMetrics", namespaced=False, verbs=READ_VERBS, stored=False
)

BUILTIN = (NAMESPACES, PODS, PVCS, SERVICES, EVENTS, NETWORK_POLICIES, CRDS, SSAR, SSRR, POD_METRICS, NODE_METRICS)

# What /version answers: a recent release, as `kubectl version` would print it.
VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.1",
    "gitCommit": "8adc0f041b8e7ad1d30e29cc59c6ae7a15e19828",
    "gitTreeState": "clean",
    "buildDate": "2025-05-15T08:19:08Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass
class Catalog:
    """The served resources, by (group, version, plural)."""

    resources: dict[tuple[str, str, str], Resource] = field(default_factory=dict)

    def add(self, resources: Iterable[Resource]) -> None:
        for r in resources:
            self.resources[(r.group, r.version, r.plural)] = r

    def remove(self, group: str) -> None:
        for key in [k for k in self.resources if k[0] == group]:
            del self.resources[key]

    def find(self, group: str, version: str, plural: str) -> Resource | None:
        return self.resources.get((group, version, plural))

    def by_kind(self, group: str, kind: str) -> Resource | None:
        for r in self.resources.values():
            if r.group == group and r.kind == kind:
                return r
        return None

    def groups(self) -> dict[str, list[str]]:
        """group -> its versions, preferred (newest registered first) first."""
        out: dict[str, list[str]] = {}
        for group, version, _ in self.resources:
            versions = out.setdefault(group, [])
            if version not in versions:
                versions.append(version)
        return out

    def api_versions(self) -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}],
        }

    def _group_doc(self, group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def api_group_list(self) -> dict[str, Any]:
        groups = [self._group_doc(g, vs) for g, vs in self.groups().items() if g]
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.groups().get(group)
        if not group or not versions:
            return None
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group, versions)}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        served = [r for (g, v, _), r in self.resources.items() if g == group and v == version]
        if not served:
            return None
        entries: list[dict[str, Any]] = []
        for r in served:
            entry: dict[str, Any] = {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(r.verbs),
            }
            if r.short_names:
                entry["shortNames"] = list(r.short_names)
            entries.append(entry)
            for sub in r.subresources:
                sub_verbs = (
                    ["create", "get"] if sub in ("exec", "attach", "portforward") else ["get", "patch", "update"]
                )
                entries.append(
                    {
                        "name": f"{r.plural}/{sub}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind if sub != "exec" else "PodExecOptions",
                        "verbs": sub_verbs,
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}".lstrip("/"),
            "resources": entries,
        }
