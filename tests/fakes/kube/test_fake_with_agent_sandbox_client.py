"""The unmodified k8s-agent-sandbox client (1.0.8) against the fake Kubernetes API: how it
reaches a sandbox, the router behind the API server's service proxy (tests/fakes/kube/runtime.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import requests

from tests.fakes.kube.fixtures import kube_client
from tests.fakes.kube.runtime import ROUTER_NAMESPACE, ROUTER_PORT, ROUTER_SERVICE

pytestmark = [pytest.mark.docker]

NAMESPACE = "default"


def _router_url(cluster: Any) -> str:
    return f"{cluster.url}/api/v1/namespaces/{ROUTER_NAMESPACE}/services/{ROUTER_SERVICE}:{ROUTER_PORT}/proxy"


@pytest.fixture(scope="module")
def ca_file(fake_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("kube-ca") / "ca.pem"
    path.write_text(fake_cluster.ca_pem)
    return str(path)


@pytest.fixture(scope="module")
def admin_api(fake_cluster: Any) -> Iterator[kubernetes.client.ApiClient]:
    api = kube_client(fake_cluster)
    yield api
    api.close()


def _bare_router_call(cluster: Any, ca_file: str, token: str) -> requests.Response:
    return requests.get(
        f"{_router_url(cluster)}/execute", headers={"Authorization": f"Bearer {token}"}, verify=ca_file, timeout=10
    )


def test_the_router_is_a_service_behind_the_api_servers_proxy(
    fake_cluster: Any, admin_api: kubernetes.client.ApiClient, ca_file: str
) -> None:
    core = kubernetes.client.CoreV1Api(admin_api)
    service = core.read_namespaced_service(ROUTER_SERVICE, ROUTER_NAMESPACE)
    assert service.spec is not None
    assert [(port.name, port.port) for port in service.spec.ports or []] == [("proxy", ROUTER_PORT)]
    with pytest.raises(kubernetes.client.ApiException) as missing:
        core.connect_get_namespaced_service_proxy_with_path("no-such-service", NAMESPACE, "execute")
    assert missing.value.status == 404
    # The proxy is the services/proxy subresource: a token without it is refused.
    claims_only = fake_cluster.token_with(
        [{"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"], "verbs": ["*"]}]
    )
    refused = _bare_router_call(fake_cluster, ca_file, claims_only)
    assert refused.status_code == 403
    assert refused.json()["reason"] == "Forbidden"
    proxy_only = fake_cluster.token_with([{"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"]}])
    # Past the API server, the router wants to know which sandbox.
    answer = _bare_router_call(fake_cluster, ca_file, proxy_only)
    assert answer.status_code == 400
    assert answer.json() == {"detail": "X-Sandbox-ID header is required."}
