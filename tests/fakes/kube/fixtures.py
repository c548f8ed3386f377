"""pytest fixtures for the fake Kubernetes cluster.

Loaded through `pytest_plugins` in tests/conftest.py.

- `fake_cluster` (session): one `FakeCluster` (HTTPS on a loopback port, the agent-sandbox
  CRDs, pods as Docker containers) started on first use. It needs the Docker engine and
  `sandbox-console/base:latest`: outside CI a missing one skips saying what is missing, in CI
  it fails. Every container and volume it made (labelled with its run id) is removed at the end.
- `sandbox_template` (function): a SandboxTemplate in `default` whose pod runs the base image
  with a long-running command and `/workspace` from a volume claim template, plus a
  SandboxWarmPool of 0 replicas on it (a v1beta1 claim names a warm pool); both deleted after.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from docker.errors import DockerException

from tests.fakes.kube.cluster import FakeCluster, running_fake_cluster
from tests.fakes.kube.crds import SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS
from tests.fakes.kube.errors import ApiError

BASE_IMAGE = "sandbox-console/base:latest"
RUN_ID = "pytest-kube-" + uuid.uuid4().hex[:10]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def docker_problem() -> str | None:
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(BASE_IMAGE)
        client.close()
    except DockerException as exc:
        return f"the fake Kubernetes cluster needs the Docker engine and {BASE_IMAGE}: {exc}"
    return None


@pytest.fixture(scope="session")
def fake_cluster() -> Iterator[FakeCluster]:
    problem = docker_problem()
    if problem:
        # Same policy as tests/conftest.py: a missing service skips locally, fails in CI.
        if IN_CI:
            pytest.fail(f"[CI] {problem}", pytrace=False)
        pytest.skip(problem)
    with running_fake_cluster(run_id=RUN_ID) as cluster:
        yield cluster


def template_body(name: str, *, image: str = BASE_IMAGE, workspace: str = "1Gi") -> dict[str, Any]:
    """A SandboxTemplate running `image` idle, `/workspace` on a claim from a volume template."""
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "podTemplate": {
                "metadata": {"labels": {"app": "sandbox"}},
                "spec": {
                    "containers": [
                        {
                            "name": "sandbox",
                            "image": image,
                            "command": ["sleep", "infinity"],
                            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
                        }
                    ],
                },
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "workspace"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": workspace}}},
                }
            ],
        },
    }


def warm_pool_body(name: str, template: str, replicas: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxWarmPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }


@pytest.fixture
def sandbox_template(fake_cluster: FakeCluster) -> Iterator[dict[str, Any]]:
    """The template object as stored; its warm pool has the same name."""
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    store = fake_cluster.store
    template = store.create(SANDBOX_TEMPLATES, "default", template_body(name))
    store.create(SANDBOX_WARM_POOLS, "default", warm_pool_body(name, name))
    yield template
    for resource in (SANDBOX_WARM_POOLS, SANDBOX_TEMPLATES):
        with contextlib.suppress(ApiError):
            store.delete(resource, "default", name)


def kube_client(cluster: FakeCluster, token: str | None = None, namespace: str = "default") -> Any:
    """An official `kubernetes.client.ApiClient` loaded from the cluster's kubeconfig (its CA)."""
    import yaml
    from kubernetes import config

    return config.new_client_from_config_dict(yaml.safe_load(cluster.kubeconfig(token, namespace)))


@pytest.fixture
def kube_api(fake_cluster: FakeCluster) -> Iterator[Any]:
    """An admin `kubernetes.client.ApiClient` on the session's fake cluster."""
    client = kube_client(fake_cluster)
    yield client
    client.close()
