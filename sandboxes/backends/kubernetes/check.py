"""Test connection for a cluster: the API answers, agent-sandbox's four CRDs are served at the
version the backend speaks, and each permission the console needs is granted — each a
`Finding` naming precisely what is missing.

- The API: `GET /version` (which Kubernetes answers), then `GET /apis`, which unlike
  `/version` needs accepted credentials; a refused token stops here.
- The CRDs: API discovery (`/apis`, then `/apis/<group>/<version>`), which every authenticated
  user may read (the `system:discovery` role), so the check needs no cluster-wide right. The
  four kinds and their groups are those of kubernetes-sigs/agent-sandbox's manifests
  (`k8s/crds/`, commit 2fd412d55ecae90861a101a5424a75473de97c36): `sandboxes` in
  `agents.x-k8s.io`; `sandboxclaims`, `sandboxtemplates`, `sandboxwarmpools` in
  `extensions.agents.x-k8s.io`; each served at v1beta1 (storage) and v1alpha1.
- The permissions: one SelfSubjectAccessReview per verb and resource (`kubectl auth can-i`
  asks the same), in the backend's namespace — or across namespaces when each space has its
  own. `PERMISSIONS` is the one list; docs/kubernetes.md's RBAC manifest grants exactly it
  (tests/sandboxes/backends/kubernetes/test_rbac_manifest.py holds the two together).

Imports nothing of the project but the contract (`base`) and no Django; it is handed a
`kubernetes.client.ApiClient` (the backend's `client.py` builds it from the settings).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..base import Finding

NEEDED_VERSION = "v1beta1"
CORE_GROUP = "agents.x-k8s.io"
EXTENSIONS_GROUP = "extensions.agents.x-k8s.io"
# (group, plural, kind) of the four CRDs.
CRDS = (
    (CORE_GROUP, "sandboxes", "Sandbox"),
    (EXTENSIONS_GROUP, "sandboxclaims", "SandboxClaim"),
    (EXTENSIONS_GROUP, "sandboxtemplates", "SandboxTemplate"),
    (EXTENSIONS_GROUP, "sandboxwarmpools", "SandboxWarmPool"),
)
TIMEOUT = (5, 15)  # connect, read (seconds) of each call


@dataclass(frozen=True)
class Permission:
    """Verbs on one resource the console needs (an RBAC PolicyRule's worth). `loses`: what
    goes without it when it is not essential (else sessions fail)."""

    group: str
    resource: str  # plural, with a subresource after a slash ("pods/exec")
    verbs: tuple[str, ...]
    loses: str = ""
    cluster_scoped: bool = False

    def can_i(self, verb: str) -> str:
        """How `kubectl auth can-i` names it: "create sandboxclaims.extensions.agents.x-k8s.io"."""
        resource, _, sub = self.resource.partition("/")
        dotted = f"{resource}.{self.group}" if self.group else resource
        return f"{verb} {dotted}{'/' + sub if sub else ''}"


PERMISSIONS = (
    Permission(EXTENSIONS_GROUP, "sandboxclaims", ("get", "list", "watch", "create", "patch", "delete")),
    Permission(CORE_GROUP, "sandboxes", ("get", "list", "watch", "patch")),
    Permission(EXTENSIONS_GROUP, "sandboxtemplates", ("get", "list", "create", "update", "patch", "delete")),
    Permission(EXTENSIONS_GROUP, "sandboxwarmpools", ("get", "list", "watch", "create", "update", "patch", "delete")),
    # A sandbox's pod, its PVCs and its NetworkPolicy are agent-sandbox's controller's to make and
    # (by owner references) to remove; the console only reads the pod to exec into it.
    Permission("", "pods", ("get",)),
    # A websocket exec is a GET upgraded; API servers before 1.31 authorise it as `get`, later as `create`.
    Permission("", "pods/exec", ("create", "get")),
    Permission("metrics.k8s.io", "pods", ("get", "list"), loses="live CPU and memory of sessions"),
)
# Where each space has its own namespace, the console makes them.
NAMESPACE_PERMISSION = Permission("", "namespaces", ("get", "create"), cluster_scoped=True)


def needed(per_space: bool) -> tuple[Permission, ...]:
    return (*PERMISSIONS, NAMESPACE_PERMISSION) if per_space else PERMISSIONS


@dataclass(frozen=True)
class Denied:
    permission: Permission
    verb: str
    reason: str = ""

    @property
    def name(self) -> str:
        return self.permission.can_i(self.verb)


def check_cluster(api: k8s.ApiClient, namespace: str, *, per_space: bool = False) -> list[Finding]:
    """Every finding, in order: the API, each CRD, the permissions (essential, then the rest).
    Stops after the first when the API does not answer or refuses the credentials."""
    try:
        version = k8s.VersionApi(api).get_code(_request_timeout=TIMEOUT)
        # /version answers anyone; discovery only the credentials the API server accepts.
        groups = k8s.ApisApi(api).get_api_versions(_request_timeout=TIMEOUT)
    except (ApiException, HTTPError, OSError, ValueError) as exc:
        return [Finding("api", False, f"The API server does not answer: {_why(exc)}")]
    findings = [Finding("api", True, f"Kubernetes {version.git_version} answers and accepts the credentials")]
    try:
        findings += crd_findings(served_versions(api, groups))
        denied = denied_permissions(api, namespace, needed(per_space))
    except (ApiException, HTTPError, OSError, ValueError) as exc:
        return [*findings, Finding("permissions", False, f"The check stopped: {_why(exc)}")]
    where = "in every namespace" if per_space else f"in namespace {namespace!r}"
    return findings + permission_findings(denied, where)


def served_versions(api: k8s.ApiClient, listing: k8s.V1APIGroupList) -> dict[str, list[str]]:
    """For each of the four CRDs' plural ("sandboxes"): the versions the API serves it at,
    from the discovery `listing` of `/apis`."""
    ours = {group for group, _, _ in CRDS}
    found: dict[str, list[str]] = {plural: [] for _, plural, _ in CRDS}
    for group in listing.groups or []:
        if group.name not in ours:
            continue
        for version in group.versions or []:
            resources = k8s.CustomObjectsApi(api).get_api_resources(
                group.name, version.version, _request_timeout=TIMEOUT
            )
            names = {resource.name for resource in resources.resources or []}
            for crd_group, plural, _ in CRDS:
                if crd_group == group.name and plural in names:
                    found[plural].append(version.version)
    return found


def crd_findings(served: dict[str, list[str]]) -> list[Finding]:
    findings = []
    for group, plural, kind in CRDS:
        name = f"crd {plural}.{group}"
        versions = served.get(plural, [])
        if NEEDED_VERSION in versions:
            findings.append(Finding(name, True, f"{kind} served at {', '.join(versions)}"))
        elif versions:
            findings.append(
                Finding(
                    name,
                    False,
                    f"{kind} is served only at {', '.join(versions)}; the console speaks {NEEDED_VERSION}: "
                    "upgrade agent-sandbox (docs/kubernetes.md)",
                )
            )
        else:
            findings.append(
                Finding(
                    name,
                    False,
                    f"{kind} is not installed: apply agent-sandbox's sandbox-with-extensions.yaml (docs/kubernetes.md)",
                )
            )
    return findings


def denied_permissions(api: k8s.ApiClient, namespace: str, permissions: Iterable[Permission]) -> list[Denied]:
    """Each verb of `permissions` the credentials lack (one SelfSubjectAccessReview each)."""
    reviews = k8s.AuthorizationV1Api(api)
    denied = []
    for permission in permissions:
        resource, _, sub = permission.resource.partition("/")
        for verb in permission.verbs:
            attributes = k8s.V1ResourceAttributes(
                group=permission.group,
                resource=resource,
                subresource=sub or None,
                verb=verb,
                namespace=None if permission.cluster_scoped else namespace,
            )
            body = k8s.V1SelfSubjectAccessReview(
                api_version="authorization.k8s.io/v1",
                kind="SelfSubjectAccessReview",
                spec=k8s.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes),
            )
            answer = reviews.create_self_subject_access_review(body, _request_timeout=TIMEOUT)
            status = answer.status
            if status is None or not status.allowed:
                denied.append(Denied(permission, verb, (status.reason or "") if status else ""))
    return denied


def permission_findings(denied: list[Denied], where: str) -> list[Finding]:
    essential = [d for d in denied if not d.permission.loses]
    findings = [
        Finding(
            "permissions",
            not essential,
            f"missing {where}: {', '.join(d.name for d in essential)}"
            if essential
            else f"every permission sessions need is granted {where}",
        )
    ]
    for loses in dict.fromkeys(d.permission.loses for d in denied if d.permission.loses):
        names = ", ".join(d.name for d in denied if d.permission.loses == loses)
        findings.append(
            Finding(
                "permissions (optional)", False, f"missing {where}: {names}; without them: no {loses}", blocking=False
            )
        )
    return findings


def _why(exc: Any) -> str:
    """An API error in words: 401 and 403 say which; a Status body's message when it has one."""
    if isinstance(exc, ApiException):
        if exc.status == 401:
            return "401 Unauthorized: the token or client certificate is not accepted"
        message = _status_message(exc)
        return f"{exc.status} {exc.reason}{': ' + message if message else ''}"
    return f"{type(exc).__name__}: {exc}"[:300]


def _status_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return ""
    return str(body.get("message") or "")[:300] if isinstance(body, dict) else ""
