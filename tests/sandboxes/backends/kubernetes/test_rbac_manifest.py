"""The RBAC manifest docs/kubernetes.md gives platform admins: exactly its rules, bound in the
sandboxes' namespace on the fake cluster, pass Test connection (`check.check_cluster`); one
rule fewer is reported by name; and the manifest grants what `check.PERMISSIONS` asks, no more."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.backends.kubernetes.check import NAMESPACE_PERMISSION, PERMISSIONS, check_cluster
from tests.fakes.kube.cluster import FakeCluster
from tests.fakes.kube.fixtures import kube_client
from tests.support.kube_rbac import manifest, namespaces_rule


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_manifest_grants_what_the_check_asks_and_binds_the_service_account() -> None:
    role, binding, account = manifest("Role"), manifest("RoleBinding"), manifest("ServiceAccount")
    asked = {(p.group, p.resource, verb) for p in PERMISSIONS for verb in p.verbs}
    assert granted(role["rules"]) == asked
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert (
        binding["metadata"]["namespace"] == role["metadata"]["namespace"] == manifest("Namespace")["metadata"]["name"]
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    per_space = {(p.group, p.resource, verb) for p in (NAMESPACE_PERMISSION,) for verb in p.verbs}
    assert granted(namespaces_rule()) == per_space


@pytest.mark.docker
def test_exactly_the_manifests_rules_pass_test_connection(fake_cluster: FakeCluster) -> None:
    role = manifest("Role")
    namespace = role["metadata"]["namespace"]
    token = fake_cluster.token_with(role["rules"], namespace=namespace)
    findings = check_cluster(kube_client(fake_cluster, token, namespace), namespace)
    assert [(f.name, f.detail) for f in findings if not f.ok] == []


@pytest.mark.docker
def test_one_rule_fewer_is_reported_by_name(fake_cluster: FakeCluster) -> None:
    role = manifest("Role")
    namespace = role["metadata"]["namespace"]
    rules = [rule for rule in role["rules"] if rule["resources"] != ["sandboxwarmpools"]]
    token = fake_cluster.token_with(rules, namespace=namespace)
    findings = {f.name: f for f in check_cluster(kube_client(fake_cluster, token, namespace), namespace)}
    permissions = findings["permissions"]
    assert not permissions.ok
    assert permissions.detail == (
        f"missing in namespace {namespace!r}: "
        + ", ".join(
            f"{verb} sandboxwarmpools.extensions.agents.x-k8s.io"
            for verb in ("get", "list", "watch", "create", "update", "patch", "delete")
        )
    )


@pytest.mark.docker
def test_one_namespace_per_space_needs_the_cluster_role_with_namespaces(fake_cluster: FakeCluster) -> None:
    rules = manifest("Role")["rules"]
    without = check_cluster(kube_client(fake_cluster, fake_cluster.token_with(rules)), "", per_space=True)
    missing = {f.name: f for f in without}["permissions"]
    assert missing.detail == "missing in every namespace: get namespaces, create namespaces"
    token = fake_cluster.token_with([*rules, *namespaces_rule()])
    assert all(f.ok for f in check_cluster(kube_client(fake_cluster, token), "", per_space=True))
