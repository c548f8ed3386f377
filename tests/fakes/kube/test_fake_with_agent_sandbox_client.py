"""The unmodified k8s-agent-sandbox client (1.0.8) against the fake Kubernetes API.

Every call below is a public call of the client, pointed at the fake only through its own
options: a kubernetes ``ApiClient`` built from the fake's kubeconfig, and
``SandboxDirectConnectionConfig`` naming the router behind the API server's service proxy
(tests/fakes/kube/runtime.py). The claim, the warm pool and the template are the agent-sandbox
CRDs; the claim's pod is a Docker container, and commands and files reach it through the
router and the python runtime as the client speaks to them. Covered: create (cold, adopted
from a warm pool, a named claim adopted by a second client), commands, files, delete, and the
failures the client handles.

Checked against: k8s-agent-sandbox 1.0.8 from PyPI (unmodified), and what the fake answers
taken from kubernetes-sigs/agent-sandbox at 2fd412d55ecae90861a101a5424a75473de97c36 (claim
controller conditions, the router, examples/python-runtime-sandbox).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kubernetes
import pytest
import requests
from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.exceptions import (
    SandboxRequestError,
    SandboxTemplateNotFoundError,
    SandboxWarmPoolNotFoundError,
)
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from k8s_agent_sandbox.sandbox import Sandbox

from tests.fakes.kube.fixtures import kube_client, template_body, warm_pool_body
from tests.fakes.kube.runtime import ROUTER_NAMESPACE, ROUTER_PORT, ROUTER_SERVICE
from tests.support.console_process import wait_for

pytestmark = [pytest.mark.docker]

EXT = ("extensions.agents.x-k8s.io", "v1beta1")
NAMESPACE = "default"


@dataclass(frozen=True)
class Router:
    """The router as a client outside the cluster reaches it: the API server's service proxy,
    its CA, a bearer token."""

    cluster: Any
    api: kubernetes.client.ApiClient
    ca_file: str

    @property
    def url(self) -> str:
        service = f"services/{ROUTER_SERVICE}:{ROUTER_PORT}"
        return f"{self.cluster.url}/api/v1/namespaces/{ROUTER_NAMESPACE}/{service}/proxy"

    def client(self, **connection: Any) -> SandboxClient[Sandbox]:
        config = SandboxDirectConnectionConfig(
            api_url=self.url,
            extra_headers={"Authorization": f"Bearer {self.cluster.admin_token}"},
            ca_cert=self.ca_file,
            **connection,
        )
        return SandboxClient(connection_config=config, api_client=self.api)

    def call(
        self, path: str, *, token: str = "", headers: dict[str, str] | None = None, json: Any = None
    ) -> requests.Response:
        """A request of our own, no client in between."""
        auth = {"Authorization": f"Bearer {token or self.cluster.admin_token}"}
        return requests.request(
            "GET" if json is None else "POST",
            f"{self.url}{path}",
            headers={**auth, **(headers or {})},
            json=json,
            verify=self.ca_file,
            timeout=30,
        )


def _create(api: kubernetes.client.ApiClient, plural: str, body: dict[str, Any]) -> None:
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(*EXT, NAMESPACE, plural, body)


def _delete(api: kubernetes.client.ApiClient, plural: str, name: str) -> None:
    try:
        kubernetes.client.CustomObjectsApi(api).delete_namespaced_custom_object(*EXT, NAMESPACE, plural, name)
    except kubernetes.client.ApiException as e:
        if e.status != 404:
            raise


def _runtime_template(name: str) -> dict[str, Any]:
    """The fixtures' template as upstream's python-sandbox-template.yaml shapes a runtime one:
    the runtime's port declared, its base directory on the workspace volume."""
    body = template_body(name)
    container = body["spec"]["podTemplate"]["spec"]["containers"][0]
    container["ports"] = [{"containerPort": 8888}]
    container["env"] = [{"name": "SANDBOX_BASE_DIR", "value": "/workspace"}]
    return body


@pytest.fixture(scope="module")
def admin_api(fake_cluster: Any) -> Iterator[kubernetes.client.ApiClient]:
    api = kube_client(fake_cluster)
    yield api
    api.close()


@pytest.fixture(scope="module")
def router(
    fake_cluster: Any, admin_api: kubernetes.client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Router:
    ca_file = tmp_path_factory.mktemp("kube-ca") / "ca.pem"
    ca_file.write_text(fake_cluster.ca_pem)
    return Router(fake_cluster, admin_api, str(ca_file))


@pytest.fixture(scope="module")
def warm_pool(admin_api: kubernetes.client.ApiClient) -> Iterator[str]:
    suffix = uuid.uuid4().hex[:6]
    template, pool = f"runtime-{suffix}", f"runtime-pool-{suffix}"
    _create(admin_api, "sandboxtemplates", _runtime_template(template))
    _create(admin_api, "sandboxwarmpools", warm_pool_body(pool, template))
    yield pool
    _delete(admin_api, "sandboxwarmpools", pool)
    _delete(admin_api, "sandboxtemplates", template)


@pytest.fixture(scope="module")
def client(router: Router) -> Iterator[SandboxClient[Sandbox]]:
    with router.client() as c:
        yield c


@pytest.fixture(scope="module")
def sandbox(client: SandboxClient[Sandbox], warm_pool: str) -> Iterator[Sandbox]:
    """One sandbox claimed from the pool, shared by the read-mostly tests."""
    sb = client.create_sandbox(warm_pool, namespace=NAMESPACE, sandbox_ready_timeout=90, labels={"suite": "client"})
    yield sb
    client.delete_sandbox(sb.claim_name or "", namespace=NAMESPACE)


def _claims(api: kubernetes.client.ApiClient) -> list[str]:
    listed = kubernetes.client.CustomObjectsApi(api).list_namespaced_custom_object(*EXT, NAMESPACE, "sandboxclaims")
    assert isinstance(listed, dict)
    return [item["metadata"]["name"] for item in listed["items"]]


def test_create_waits_for_the_claim_and_finds_its_sandbox(
    sandbox: Sandbox, client: SandboxClient[Sandbox], admin_api: kubernetes.client.ApiClient
) -> None:
    assert sandbox.claim_name in _claims(admin_api)
    assert sandbox.claim_name in client.list_all_sandboxes(NAMESPACE, label_selector="suite=client")
    assert sandbox.status()[0] == "SandboxReady"
    # The client reads the pod's IP from the Sandbox's status and routes by it.
    assert sandbox.get_pod_ip()
    assert sandbox.get_pod_name()


def test_run_a_command(sandbox: Sandbox) -> None:
    assert sandbox.commands is not None
    result = sandbox.commands.run("echo hello from the pod")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello from the pod\n", "", 0)
    # The runtime runs commands from its base directory, without a shell.
    where = sandbox.commands.run("pwd")
    assert where.stdout == "/workspace\n"
    literal = sandbox.commands.run("echo $HOME '>' file")
    assert literal.stdout == "$HOME > file\n"
    # The router found the claim's own pod.
    assert sandbox.commands.run("hostname").stdout == f"{sandbox.get_pod_name()}\n"


def test_write_then_read_a_file(sandbox: Sandbox) -> None:
    assert sandbox.files is not None
    assert sandbox.commands is not None
    payload = bytes(range(256)) * 16
    sandbox.files.write("notes/data.bin", payload)
    assert sandbox.files.read("notes/data.bin") == payload
    assert sandbox.files.exists("notes/data.bin")
    listed = {entry.name: entry for entry in sandbox.files.list("notes")}
    assert listed["data.bin"].size == len(payload)
    assert listed["data.bin"].type == "file"
    # What the runtime wrote is in the pod's container, where a command sees it.
    assert sandbox.commands.run("wc -c notes/data.bin").stdout == f"{len(payload)} notes/data.bin\n"


def test_a_failing_command_reports_its_exit_code(sandbox: Sandbox) -> None:
    assert sandbox.commands is not None
    failed = sandbox.commands.run("ls /no/such/dir")
    assert failed.exit_code == 2
    assert "No such file or directory" in failed.stderr
    assert failed.stdout == ""
    missing = sandbox.commands.run("no-such-program --flag")
    assert missing.exit_code == 1
    assert missing.stderr == "Failed to execute command: [Errno 2] No such file or directory: 'no-such-program'"


def test_a_missing_file_is_a_404(sandbox: Sandbox) -> None:
    assert sandbox.files is not None
    with pytest.raises(SandboxRequestError) as raised:
        sandbox.files.read("no-such-file.txt")
    assert raised.value.status_code == 404
    assert raised.value.response.json() == {"message": "File not found"}
    assert sandbox.files.exists("no-such-file.txt") is False
    # Outside the base directory the runtime refuses, whatever the client lets through.
    with pytest.raises(SandboxRequestError) as escaped:
        sandbox.files.read("../etc/hostname", allow_unsafe_paths=True)
    assert escaped.value.status_code == 403


def test_a_port_nothing_listens_on_is_the_routers_502(router: Router, sandbox: Sandbox) -> None:
    with router.client(server_port=9999) as other:
        handle = other.get_sandbox(sandbox.claim_name or "", namespace=NAMESPACE)
        assert handle.commands is not None
        with pytest.raises(SandboxRequestError) as raised:
            handle.commands.run("true")
        handle.close_connection()
    assert raised.value.status_code == 502
    assert raised.value.response.json() == {"detail": f"Could not connect to the backend sandbox: {sandbox.sandbox_id}"}


def test_the_router_is_a_service_behind_the_api_servers_proxy(fake_cluster: Any, router: Router) -> None:
    core = kubernetes.client.CoreV1Api(router.api)
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
    refused = router.call("/execute", token=claims_only)
    assert refused.status_code == 403
    assert refused.json()["reason"] == "Forbidden"
    proxy_only = fake_cluster.token_with([{"apiGroups": [""], "resources": ["services/proxy"], "verbs": ["get"]}])
    # Past the API server, the router wants to know which sandbox.
    answer = router.call("/execute", token=proxy_only)
    assert answer.status_code == 400
    assert answer.json() == {"detail": "X-Sandbox-ID header is required."}


def _sandbox_exists(api: kubernetes.client.ApiClient, name: str) -> bool:
    try:
        kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object(
            "agents.x-k8s.io", "v1beta1", NAMESPACE, "sandboxes", name
        )
    except kubernetes.client.ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def test_delete_removes_the_claim_its_sandbox_and_pod(
    router: Router, client: SandboxClient[Sandbox], warm_pool: str
) -> None:
    sb = client.create_sandbox(warm_pool, namespace=NAMESPACE, sandbox_ready_timeout=90)
    name, sandbox_id, pod_ip = sb.claim_name, sb.sandbox_id, sb.get_pod_ip()
    assert sb.commands is not None
    assert sb.commands.run("true").exit_code == 0
    client.delete_sandbox(name or "", namespace=NAMESPACE)
    assert not sb.is_active
    assert name not in _claims(router.api)
    wait_for(lambda: not _sandbox_exists(router.api, sandbox_id), timeout=60, what=f"sandbox {sandbox_id} gone")
    # Nothing answers at the pod's address any more.
    answer = router.call(
        "/execute",
        json={"command": "true"},
        headers={"X-Sandbox-ID": sandbox_id, "X-Sandbox-Namespace": NAMESPACE, "X-Sandbox-Pod-IP": pod_ip or ""},
    )
    assert answer.status_code == 502


def test_a_warm_sandbox_is_adopted_and_reached_by_its_own_name(
    client: SandboxClient[Sandbox], admin_api: kubernetes.client.ApiClient
) -> None:
    """With a warm pool the sandbox is not named after the claim: the client reads its name
    from the claim's status and routes to that sandbox's pod."""
    suffix = uuid.uuid4().hex[:6]
    template, pool = f"warm-{suffix}", f"warm-pool-{suffix}"
    _create(admin_api, "sandboxtemplates", _runtime_template(template))
    _create(admin_api, "sandboxwarmpools", warm_pool_body(pool, template, replicas=1))
    custom = kubernetes.client.CustomObjectsApi(admin_api)

    def pool_ready() -> bool:
        got = custom.get_namespaced_custom_object(*EXT, NAMESPACE, "sandboxwarmpools", pool)
        assert isinstance(got, dict)
        return bool((got.get("status") or {}).get("readyReplicas") == 1)

    try:
        wait_for(pool_ready, timeout=60, what=f"warm pool {pool} ready")
        sb = client.create_sandbox(pool, namespace=NAMESPACE, sandbox_ready_timeout=90)
        assert sb.sandbox_id != sb.claim_name
        assert sb.sandbox_id.startswith(f"{pool}-")
        assert sb.commands is not None
        assert sb.commands.run("hostname").stdout == f"{sb.sandbox_id}\n"
        client.delete_sandbox(sb.claim_name or "", namespace=NAMESPACE)
    finally:
        _delete(admin_api, "sandboxwarmpools", pool)
        _delete(admin_api, "sandboxtemplates", template)


def test_a_named_claim_is_adopted_by_another_client(
    router: Router, client: SandboxClient[Sandbox], warm_pool: str
) -> None:
    name = f"named-{uuid.uuid4().hex[:6]}"
    first = client.create_sandbox(warm_pool, namespace=NAMESPACE, claim_name=name, sandbox_ready_timeout=90)
    # The same name again is the API server's 409, unless the caller asks to adopt it.
    with pytest.raises(kubernetes.client.ApiException) as conflict:
        client.create_sandbox(warm_pool, namespace=NAMESPACE, claim_name=name, sandbox_ready_timeout=10)
    assert conflict.value.status == 409
    with router.client() as other:
        adopted = other.create_sandbox(
            warm_pool, namespace=NAMESPACE, claim_name=name, adopt_existing=True, sandbox_ready_timeout=30
        )
        assert adopted.sandbox_id == first.sandbox_id
        assert adopted.commands is not None
        assert adopted.commands.run("hostname").stdout == f"{first.get_pod_name()}\n"
    # Named claims are the caller's: leaving the client left the claim in place.
    assert name in _claims(router.api)
    client.delete_sandbox(name, namespace=NAMESPACE)
    assert name not in _claims(router.api)


def test_a_missing_warm_pool_fails_the_ready_wait(
    client: SandboxClient[Sandbox], admin_api: kubernetes.client.ApiClient
) -> None:
    before = set(_claims(admin_api))
    with pytest.raises(SandboxWarmPoolNotFoundError, match='SandboxWarmPool "no-such-pool" not found'):
        client.create_sandbox("no-such-pool", namespace=NAMESPACE, sandbox_ready_timeout=30)
    # The client rolls its claim back.
    assert set(_claims(admin_api)) == before


def test_a_pool_without_its_template_fails_the_ready_wait(
    client: SandboxClient[Sandbox], admin_api: kubernetes.client.ApiClient
) -> None:
    pool = f"orphan-pool-{uuid.uuid4().hex[:6]}"
    _create(admin_api, "sandboxwarmpools", warm_pool_body(pool, "no-such-template"))
    try:
        with pytest.raises(SandboxTemplateNotFoundError, match='SandboxTemplate "no-such-template" not found'):
            client.create_sandbox(pool, namespace=NAMESPACE, sandbox_ready_timeout=30)
    finally:
        _delete(admin_api, "sandboxwarmpools", pool)
