"""Bearer tokens, the RBAC rules each one is bound to, and the reviews a client asks about them.

`Authorizer.issue(rules)` mints a token for a user bound to rbac.authorization.k8s.io/v1
PolicyRule dicts (`apiGroups`, `resources`, `verbs`, optional `resourceNames`,
`nonResourceURLs`), cluster-wide or in one namespace (a Role). Every authenticated user also
has what the default ClusterRoles give everyone (system:basic-user, system:discovery,
system:public-info-viewer): the two self-reviews and discovery. A request outside the rules is
the apiserver's 403 (`pods "x" is forbidden: User "u" cannot get resource "pods" in API group ""
in the namespace "ns"`); SelfSubjectAccessReview and SelfSubjectRulesReview are answered from
the same rules.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.kube.errors import ApiError, qualified, unauthorized

Rule = dict[str, Any]

EVERYONE: list[Rule] = [
    {
        "apiGroups": ["authorization.k8s.io"],
        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        "verbs": ["create"],
    },
    {
        "nonResourceURLs": [
            "/api",
            "/api/*",
            "/apis",
            "/apis/*",
            "/healthz",
            "/livez",
            "/readyz",
            "/version",
            "/version/",
            "/openapi",
            "/openapi/*",
        ],
        "verbs": ["get"],
    },
]
ALL: list[Rule] = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]


@dataclass(frozen=True)
class Attributes:
    """What a request asks (k8s.io/apiserver authorizer.Attributes)."""

    verb: str
    path: str = ""
    resource_request: bool = False
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""


@dataclass
class Subject:
    user: str
    rules: list[Rule]
    namespace: str | None = None  # bound by a Role in this namespace; None: a ClusterRole
    groups: list[str] = field(default_factory=lambda: ["system:authenticated"])


def _matches(values: list[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def _resource_matches(resources: list[str], resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in resources:
        if r == "*" or r == combined:
            return True
        if subresource and r == f"*/{subresource}":
            return True
    return False


def rule_allows(rule: Rule, a: Attributes) -> bool:
    if not _matches(rule.get("verbs", []), a.verb):
        return False
    if not a.resource_request:
        return any(
            u == "*" or u == a.path or (u.endswith("*") and a.path.startswith(u[:-1]))
            for u in rule.get("nonResourceURLs", [])
        )
    if "nonResourceURLs" in rule and "resources" not in rule:
        return False
    if not _matches(rule.get("apiGroups", []), a.group):
        return False
    if not _resource_matches(rule.get("resources", []), a.resource, a.subresource):
        return False
    names = rule.get("resourceNames") or []
    return not names or a.name in names


class Authorizer:
    def __init__(self) -> None:
        self._tokens: dict[str, Subject] = {}
        self._serial = itertools.count(1)

    def issue(self, rules: list[Rule], *, user: str | None = None, namespace: str | None = None) -> str:
        token = secrets.token_urlsafe(24)
        name = user or f"system:serviceaccount:{namespace or 'default'}:fake-user-{next(self._serial)}"
        self._tokens[token] = Subject(name, [dict(r) for r in rules], namespace)
        return token

    def authenticate(self, header: str | None) -> Subject:
        if not header or not header.lower().startswith("bearer "):
            raise unauthorized()
        subject = self._tokens.get(header[7:].strip())
        if subject is None:
            raise unauthorized()
        return subject

    @staticmethod
    def allows(subject: Subject, a: Attributes) -> bool:
        if any(rule_allows(r, a) for r in EVERYONE):
            return True
        if subject.namespace is not None and (not a.resource_request or a.namespace != subject.namespace):
            return False
        return any(rule_allows(r, a) for r in subject.rules)

    def check(self, subject: Subject, a: Attributes) -> None:
        if not self.allows(subject, a):
            raise forbidden(subject, a)


def forbidden(subject: Subject, a: Attributes) -> ApiError:
    if not a.resource_request:
        return ApiError(403, f'forbidden: User "{subject.user}" cannot {a.verb} path "{a.path}"', "Forbidden", {})
    resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
    where = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    why = f'User "{subject.user}" cannot {a.verb} resource "{resource}" in API group "{a.group}" {where}'
    target = qualified(a.resource, a.group)
    message = f'{target} "{a.name}" is forbidden: {why}' if a.name else f"{target} is forbidden: {why}"
    details: dict[str, Any] = {"kind": a.resource}
    if a.name:
        details["name"] = a.name
    if a.group:
        details["group"] = a.group
    return ApiError(403, message, "Forbidden", details)


def access_review(authorizer: Authorizer, subject: Subject, body: dict[str, Any]) -> dict[str, Any]:
    """A SelfSubjectAccessReview answered for `subject`."""
    spec = body.get("spec") or {}
    if spec.get("resourceAttributes"):
        ra = spec["resourceAttributes"]
        a = Attributes(
            verb=ra.get("verb", ""),
            resource_request=True,
            group=ra.get("group", ""),
            version=ra.get("version", ""),
            resource=ra.get("resource", ""),
            subresource=ra.get("subresource", ""),
            namespace=ra.get("namespace", ""),
            name=ra.get("name", ""),
        )
    elif spec.get("nonResourceAttributes"):
        nra = spec["nonResourceAttributes"]
        a = Attributes(verb=nra.get("verb", ""), path=nra.get("path", ""))
    else:
        raise ApiError(
            422,
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: '
            '"null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
            "Invalid",
        )
    allowed = authorizer.allows(subject, a)
    status: dict[str, Any] = {"allowed": allowed}
    if allowed:
        status["reason"] = f'RBAC: allowed by ClusterRoleBinding "fake" of ClusterRole "fake" to User "{subject.user}"'
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": status,
    }


def rules_review(subject: Subject, body: dict[str, Any]) -> dict[str, Any]:
    """A SelfSubjectRulesReview: the subject's rules that apply in `spec.namespace`."""
    namespace = (body.get("spec") or {}).get("namespace", "")
    applies = subject.namespace is None or subject.namespace == namespace
    rules = (subject.rules if applies else []) + EVERYONE
    resource_rules = [
        {k: list(r[k]) for k in ("verbs", "apiGroups", "resources", "resourceNames") if k in r}
        for r in rules
        if "resources" in r
    ]
    non_resource = [
        {"verbs": list(r["verbs"]), "nonResourceURLs": list(r["nonResourceURLs"])}
        for r in rules
        if "nonResourceURLs" in r
    ]
    return {
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": {"namespace": namespace},
        "status": {"resourceRules": resource_rules, "nonResourceRules": non_resource, "incomplete": False},
    }
