"""Test connection of a Kubernetes backend (`check.check_cluster`) against the fake cluster:
the API, agent-sandbox's four CRDs and the versions they are served at, each permission by
SelfSubjectAccessReview — and what it says when one of them is not there."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from sandboxes.backends.base import Finding
from sandboxes.backends.kubernetes.check import CRDS, PERMISSIONS, check_cluster
from tests.fakes.kube.cluster import FakeCluster, running_fake_cluster
from tests.fakes.kube.fixtures import kube_client

pytestmark = pytest.mark.docker


def by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {finding.name: finding for finding in findings}


def every_rule() -> list[dict[str, object]]:
    return [{"apiGroups": [p.group], "resources": [p.resource], "verbs": list(p.verbs)} for p in PERMISSIONS]


def test_a_cluster_with_agent_sandbox_and_every_right_passes(fake_cluster: FakeCluster) -> None:
    api = kube_client(fake_cluster, fake_cluster.token_with(every_rule(), namespace="team-a"))
    findings = check_cluster(api, "team-a")
    assert [f for f in findings if not f.ok] == []
    found = by_name(findings)
    assert found["api"].detail.endswith("answers and accepts the credentials")
    for group, plural, kind in CRDS:
        assert found[f"crd {plural}.{group}"].detail.startswith(f"{kind} served at v1beta1")
    assert found["permissions"].detail == "every permission sessions need is granted in namespace 'team-a'"


def test_each_missing_permission_is_named_and_only_metrics_is_optional(fake_cluster: FakeCluster) -> None:
    rules = [
        {"apiGroups": [p.group], "resources": [p.resource], "verbs": [v for v in p.verbs if v != "delete"]}
        for p in PERMISSIONS
        if p.resource != "pods/exec" and p.group != "metrics.k8s.io"
    ]
    api = kube_client(fake_cluster, fake_cluster.token_with(rules, namespace="team-a"))
    found = by_name(check_cluster(api, "team-a"))
    essential = found["permissions"]
    assert not essential.ok
    assert essential.blocking
    assert essential.detail == (
        "missing in namespace 'team-a': delete sandboxclaims.extensions.agents.x-k8s.io, "
        "delete sandboxtemplates.extensions.agents.x-k8s.io, delete sandboxwarmpools.extensions.agents.x-k8s.io, "
        "create pods/exec, get pods/exec"
    )
    optional = found["permissions (optional)"]
    assert not optional.ok
    assert not optional.blocking
    assert "get pods.metrics.k8s.io, list pods.metrics.k8s.io; without them: no live CPU and memory" in optional.detail


def test_rights_in_another_namespace_do_not_count(fake_cluster: FakeCluster) -> None:
    api = kube_client(fake_cluster, fake_cluster.token_with(every_rule(), namespace="team-b"))
    found = by_name(check_cluster(api, "team-a"))
    assert not found["permissions"].ok
    assert "create sandboxclaims.extensions.agents.x-k8s.io" in found["permissions"].detail


@pytest.fixture(scope="module")
def bare_cluster() -> Iterator[FakeCluster]:
    """A cluster without agent-sandbox installed."""
    with running_fake_cluster(with_crds=False, run_id="pytest-kube-bare") as cluster:
        yield cluster


def test_a_cluster_without_agent_sandbox_is_told_what_to_install(bare_cluster: FakeCluster) -> None:
    found = by_name(check_cluster(kube_client(bare_cluster), "default"))
    assert found["api"].ok
    for group, plural, kind in CRDS:
        crd = found[f"crd {plural}.{group}"]
        assert not crd.ok
        assert crd.detail == (
            f"{kind} is not installed: apply agent-sandbox's sandbox-with-extensions.yaml (docs/kubernetes.md)"
        )


def test_a_refused_token_stops_at_the_api(fake_cluster: FakeCluster) -> None:
    findings = check_cluster(kube_client(fake_cluster, "not-a-token"), "default")
    assert findings == [
        Finding(
            "api",
            False,
            "The API server does not answer: 401 Unauthorized: the token or client certificate is not accepted",
        )
    ]


def test_an_api_server_that_does_not_answer_stops_there() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    configuration = k8s.Configuration(host=f"https://127.0.0.1:{port}")
    configuration.retries = False
    findings = check_cluster(k8s.ApiClient(configuration), "default")
    assert len(findings) == 1
    assert findings[0].name == "api"
    assert not findings[0].ok
    assert findings[0].detail.startswith("The API server does not answer: ")


def test_no_right_is_asked_on_what_agent_sandbox_s_controller_makes(fake_cluster: FakeCluster) -> None:
    # The controller makes (and garbage-collects) each sandbox's pod, PVCs and NetworkPolicy; the
    # console reads its pod and execs into it, nothing more, so an account without the rest passes.
    rules = [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
        {"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get", "list"]},
        *(
            {"apiGroups": [p.group], "resources": [p.resource], "verbs": list(p.verbs)}
            for p in PERMISSIONS
            if p.group.endswith("agents.x-k8s.io")
        ),
    ]
    api = kube_client(fake_cluster, fake_cluster.token_with(rules, namespace="team-a"))
    assert [(f.name, f.detail) for f in check_cluster(api, "team-a") if not f.ok] == []
