"""Pods of the fake Kubernetes cluster (tests/fakes/kube/) for the exec, terminal and file
tests, and the backend's way into them (`PodExec`) as the backend builds it: the API server's
URL, the cluster's CA as PEM data, a bearer token.

Fixtures (a test module takes them as attributes: `pod = kube_pods.pod`): `pod`, one idle pod
per module; `pods`, a `PodExec` whose every sandbox id is that pod.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client as k8s

from sandboxes.backends.kubernetes.exec import PodExec, PodRef
from tests.fakes.kube import FakeCluster

BASE_IMAGE = "sandbox-console/base:latest"
POD_START_S = 60.0


def configuration(cluster: FakeCluster, token: str | None = None) -> k8s.Configuration:
    config = k8s.Configuration()
    config.host = cluster.url
    config.api_key = {"BearerToken": token or cluster.admin_token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    config.ca_cert_data = cluster.ca_pem
    return config


def pod_exec(cluster: FakeCluster, pod: PodRef, token: str | None = None) -> PodExec:
    """A `PodExec` whose every sandbox id is `pod` (the backend maps ids to pods itself)."""
    return PodExec(configuration(cluster, token), allow_private=True, locate=lambda sandbox_id: pod)


def pod_body(name: str, **security: Any) -> Any:
    container: dict[str, Any] = {"name": "sandbox", "image": BASE_IMAGE, "command": ["sleep", "infinity"]}
    if security:
        container["securityContext"] = security
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [container]}}


@contextmanager
def running_pod(cluster: FakeCluster, namespace: str = "default", **security: Any) -> Iterator[PodRef]:
    """A pod running the base image idle, created through the API; deleted afterwards."""
    name = f"exec-{uuid.uuid4().hex[:8]}"
    api = k8s.ApiClient(configuration(cluster))
    core = k8s.CoreV1Api(api)
    core.create_namespaced_pod(namespace, pod_body(name, **security))
    try:
        deadline = time.monotonic() + POD_START_S
        while True:
            try:
                cluster.pod_container(namespace, name)
                break
            except LookupError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"pod {name} did not start in {POD_START_S:.0f} s") from None
                time.sleep(0.2)
        yield PodRef(namespace, name)
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        api.close()


@pytest.fixture(scope="module")
def pod(fake_cluster: FakeCluster) -> Iterator[PodRef]:
    with running_pod(fake_cluster) as ref:
        yield ref


@pytest.fixture
def pods(fake_cluster: FakeCluster, pod: PodRef) -> PodExec:
    return pod_exec(fake_cluster, pod)
