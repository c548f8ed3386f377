"""agent-sandbox's controllers and the Docker-backed pods of the fake, driven by the unmodified
official `kubernetes` client: a claim becomes a ready sandbox and pod, a warm pool's sandbox is
adopted, suspend/resume keeps the workspace, deleting the claim cleans up, a missing image
shows as the kubelet shows it, metrics come from docker stats, a claim on a missing pool or
template says which."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from kubernetes import client, watch

from tests.fakes.kube.cluster import FakeCluster, running_fake_cluster
from tests.fakes.kube.fixtures import BASE_IMAGE, kube_client, template_body, warm_pool_body
from tests.support.console_process import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# The client's models type every field Optional; the tests read them as the server answered.
apis: Any = client
EXT = ("extensions.agents.x-k8s.io", "v1beta1")
CORE = ("agents.x-k8s.io", "v1beta1")


@pytest.fixture
def custom(kube_api: client.ApiClient) -> Any:
    return apis.CustomObjectsApi(kube_api)


@pytest.fixture
def core(kube_api: client.ApiClient) -> Any:
    return apis.CoreV1Api(kube_api)


@pytest.fixture
def engine() -> Iterator[docker.DockerClient]:
    engine = docker.from_env(timeout=60)
    yield engine
    engine.close()


def make_claim(custom: Any, pool: str, name: str | None = None, **spec: Any) -> str:
    name = name or f"claim-{uuid.uuid4().hex[:8]}"
    body = {"metadata": {"name": name}, "spec": {"warmPoolRef": {"name": pool}, **spec}}
    custom.create_namespaced_custom_object(*EXT, "default", "sandboxclaims", body)
    return name


def ready_claim(custom: Any, name: str, timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        claim: dict[str, Any] = custom.get_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)
        conditions = (claim.get("status") or {}).get("conditions") or []
        return claim if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    claim: dict[str, Any] = wait_for(check, timeout=timeout, what=f"claim {name} Ready")
    return claim


def ready_sandbox(custom: Any, template: dict[str, Any]) -> str:
    """A claim on the template's (empty) warm pool, once Ready: its name, the sandbox's and the pod's."""
    name = make_claim(custom, template["metadata"]["name"])
    ready_claim(custom, name)
    return name


def test_a_claim_becomes_a_ready_sandbox_with_a_pod_and_its_volume(
    fake_cluster: FakeCluster, sandbox_template: dict[str, Any], custom: Any, core: Any, engine: docker.DockerClient
) -> None:
    pool = sandbox_template["metadata"]["name"]
    name = make_claim(custom, pool)
    claim = ready_claim(custom, name)
    assert claim["status"]["sandbox"]["name"] == name  # made cold from the template: the pool is empty
    sandbox = custom.get_namespaced_custom_object(*CORE, "default", "sandboxes", name)
    assert sandbox["metadata"]["annotations"]["agents.x-k8s.io/pod-name"] == name
    assert sandbox["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"
    assert sandbox["metadata"]["ownerReferences"][0]["kind"] == "SandboxClaim"
    ready = next(c for c in sandbox["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["reason"], ready["message"]) == ("DependenciesReady", "Pod is Ready")
    pod = core.read_namespaced_pod(name, "default")
    assert pod.status.phase == "Running"
    assert pod.metadata.labels["agents.x-k8s.io/sandbox-name-hash"] == sandbox["status"]["selector"].split("=")[1]
    assert pod.metadata.labels["app"] == "sandbox"
    assert [v.persistent_volume_claim.claim_name for v in pod.spec.volumes] == [f"workspace-{name}"]
    pvc = core.read_namespaced_persistent_volume_claim(f"workspace-{name}", "default")
    assert pvc.status.phase == "Bound"
    container = engine.containers.get(fake_cluster.pod_container("default", name))
    assert container.attrs["HostConfig"]["NetworkMode"] == "none"
    assert container.attrs["HostConfig"]["Dns"] == ["127.0.0.1"]
    assert container.labels["sandbox-console.fake-kube.run"] == fake_cluster.run_id
    assert [m["Destination"] for m in container.attrs["Mounts"]] == ["/workspace"]
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)


def test_a_warm_pool_sandbox_is_adopted_and_the_pool_refills(
    fake_cluster: FakeCluster, sandbox_template: dict[str, Any], custom: Any
) -> None:
    template = sandbox_template["metadata"]["name"]
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    custom.create_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", warm_pool_body(pool, template, 1))

    def pool_ready() -> dict[str, Any] | None:
        found: dict[str, Any] = custom.get_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", pool)
        return found if (found.get("status") or {}).get("readyReplicas") == 1 else None

    status = wait_for(pool_ready, timeout=60, what="warm pool ready")["status"]
    warm = custom.list_namespaced_custom_object(*CORE, "default", "sandboxes", label_selector=status["selector"])
    [member] = [s["metadata"]["name"] for s in warm["items"]]
    name = make_claim(custom, pool)
    claim = ready_claim(custom, name)
    assert claim["status"]["sandbox"]["name"] == member
    assert claim["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"] == member
    adopted = custom.get_namespaced_custom_object(*CORE, "default", "sandboxes", member)
    assert adopted["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"
    assert "agents.x-k8s.io/warm-pool-sandbox" not in adopted["metadata"]["labels"]
    assert adopted["metadata"]["ownerReferences"][0]["name"] == name
    status = wait_for(pool_ready, timeout=60, what="warm pool refilled")["status"]
    refilled = custom.list_namespaced_custom_object(*CORE, "default", "sandboxes", label_selector=status["selector"])
    assert [s["metadata"]["name"] for s in refilled["items"]] != [member]
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", pool)


def test_suspend_deletes_the_pod_and_resume_finds_the_workspace(
    fake_cluster: FakeCluster, sandbox_template: dict[str, Any], custom: Any, core: Any, engine: docker.DockerClient
) -> None:
    name = ready_sandbox(custom, sandbox_template)
    first = fake_cluster.pod_container("default", name)
    result = engine.containers.get(first).exec_run(["sh", "-c", "echo kept > /workspace/note"])
    assert result.exit_code == 0
    custom.patch_namespaced_custom_object(*CORE, "default", "sandboxes", name, {"spec": {"operatingMode": "Suspended"}})

    def suspended() -> bool:
        sandbox = custom.get_namespaced_custom_object(*CORE, "default", "sandboxes", name)
        conditions = {c["type"]: c for c in sandbox["status"]["conditions"]}
        return conditions["Suspended"]["status"] == "True" and conditions["Ready"]["reason"] == "SandboxSuspended"

    wait_for(suspended, timeout=60, what="sandbox suspended")
    assert not core.list_namespaced_pod("default", field_selector=f"metadata.name={name}").items
    assert core.read_namespaced_persistent_volume_claim(f"workspace-{name}", "default").status.phase == "Bound"
    wait_for(lambda: not engine.containers.list(all=True, filters={"id": first}), timeout=60, what="container removed")
    custom.patch_namespaced_custom_object(*CORE, "default", "sandboxes", name, {"spec": {"operatingMode": "Running"}})
    ready_claim(custom, name)
    second = fake_cluster.pod_container("default", name)
    assert second != first
    assert engine.containers.get(second).exec_run(["cat", "/workspace/note"]).output == b"kept\n"
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)


def test_deleting_the_claim_deletes_sandbox_pod_volume_and_container(
    fake_cluster: FakeCluster, sandbox_template: dict[str, Any], custom: Any, core: Any, engine: docker.DockerClient
) -> None:
    name = ready_sandbox(custom, sandbox_template)
    container = fake_cluster.pod_container("default", name)
    pvc_uid = core.read_namespaced_persistent_volume_claim(f"workspace-{name}", "default").metadata.uid
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)
    assert not custom.list_namespaced_custom_object(
        *CORE, "default", "sandboxes", field_selector=f"metadata.name={name}"
    )["items"]
    assert not core.list_namespaced_pod("default", field_selector=f"metadata.name={name}").items
    wait_for(
        lambda: (
            not core.list_namespaced_persistent_volume_claim(
                "default", field_selector=f"metadata.name=workspace-{name}"
            ).items
        ),
        timeout=30,
        what="PVC deleted once its pod is gone",
    )
    wait_for(
        lambda: not engine.containers.list(all=True, filters={"id": container}), timeout=60, what="container removed"
    )
    volumes = {"label": f"sandbox-console.fake-kube.pvc={pvc_uid}"}
    wait_for(lambda: not engine.volumes.list(filters=volumes), timeout=60, what="volume removed")


def test_a_claim_on_a_missing_pool_or_template_says_which_as_the_controller_does(custom: Any) -> None:
    """computeReadyCondition in sandboxclaim_controller.go: the reasons and messages that the
    k8s-agent-sandbox client turns into its not-found errors."""
    orphan_pool = f"orphan-{uuid.uuid4().hex[:8]}"
    custom.create_namespaced_custom_object(
        *EXT, "default", "sandboxwarmpools", warm_pool_body(orphan_pool, "no-such-template")
    )
    expected = {
        make_claim(custom, "no-such-pool"): ("WarmPoolNotFound", 'SandboxWarmPool "no-such-pool" not found'),
        make_claim(custom, orphan_pool): ("TemplateNotFound", 'SandboxTemplate "no-such-template" not found'),
    }

    def refusal(name: str) -> tuple[str, str] | None:
        claim = custom.get_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)
        for c in (claim.get("status") or {}).get("conditions") or []:
            if c["type"] == "Ready" and c["status"] == "False" and c["reason"].endswith("NotFound"):
                return c["reason"], c["message"]
        return None

    for name, answer in expected.items():
        assert wait_for(functools.partial(refusal, name), timeout=30, what=f"claim {name} refused") == answer
        custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", orphan_pool)


def test_a_watch_sees_the_pod_come_up(sandbox_template: dict[str, Any], custom: Any, core: Any) -> None:
    rv = core.list_namespaced_pod("default").metadata.resource_version
    name = make_claim(custom, sandbox_template["metadata"]["name"])
    w = watch.Watch()
    phases = []
    for event in w.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=rv,
        timeout_seconds=60,
        field_selector=f"metadata.name={name}",
    ):
        phases.append((event["type"], event["object"].status.phase if event["object"].status else None))
        if phases[-1][1] == "Running":
            w.stop()
    assert phases[0][0] == "ADDED"
    assert phases[-1] == ("MODIFIED", "Running")
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)


def test_an_image_that_is_not_on_the_node_is_err_image_pull(fake_cluster: FakeCluster, custom: Any, core: Any) -> None:
    name = f"tpl-{uuid.uuid4().hex[:6]}"
    body = template_body(name, image="registry.invalid/not-here:1")
    custom.create_namespaced_custom_object(*EXT, "default", "sandboxtemplates", body)
    custom.create_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", warm_pool_body(name, name, 0))
    claim = make_claim(custom, name)

    def waiting_reason() -> str | None:
        pods = core.list_namespaced_pod("default", field_selector=f"metadata.name={claim}").items
        statuses = (pods[0].status.container_statuses or []) if pods and pods[0].status else []
        reason = statuses[0].state.waiting.reason if statuses and statuses[0].state.waiting else None
        return reason if reason == "ImagePullBackOff" else None

    wait_for(waiting_reason, timeout=60, what="ImagePullBackOff")
    pod = core.read_namespaced_pod(claim, "default")
    assert pod.status.phase == "Pending"
    sandbox = custom.get_namespaced_custom_object(*CORE, "default", "sandboxes", claim)
    ready = next(c for c in sandbox["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["message"]) == ("False", "Pod exists with phase: Pending")
    for plural, obj in (("sandboxclaims", claim), ("sandboxwarmpools", name), ("sandboxtemplates", name)):
        custom.delete_namespaced_custom_object(*EXT, "default", plural, obj)


def test_pod_metrics_come_from_docker_stats(sandbox_template: dict[str, Any], custom: Any) -> None:
    name = ready_sandbox(custom, sandbox_template)
    metrics = custom.get_namespaced_custom_object("metrics.k8s.io", "v1beta1", "default", "pods", name)
    assert metrics["kind"] == "PodMetrics"
    [container] = metrics["containers"]
    assert container["name"] == "sandbox"
    assert container["usage"]["cpu"].endswith("n")
    assert int(container["usage"]["memory"].removesuffix("Ki")) > 0
    listed = custom.list_namespaced_custom_object("metrics.k8s.io", "v1beta1", "default", "pods")
    assert name in {m["metadata"]["name"] for m in listed["items"]}
    custom.delete_namespaced_custom_object(*EXT, "default", "sandboxclaims", name)


def test_a_cluster_without_the_crds_answers_404_like_a_real_one() -> None:
    with running_fake_cluster(with_crds=False, docker_pods=False) as cluster:
        api = kube_client(cluster)
        crds = apis.ApiextensionsV1Api(api).list_custom_resource_definition().items
        assert crds == []
        groups = {g.name for g in apis.ApisApi(api).get_api_versions().groups}
        assert "agents.x-k8s.io" not in groups
        with pytest.raises(client.ApiException) as caught:
            apis.CustomObjectsApi(api).list_namespaced_custom_object(*EXT, "default", "sandboxclaims")
        assert caught.value.status == 404
        assert "the server could not find the requested resource" in (caught.value.body or "")


def test_the_base_image_is_what_the_template_fixture_runs(sandbox_template: dict[str, Any]) -> None:
    containers = sandbox_template["spec"]["podTemplate"]["spec"]["containers"]
    assert [c["image"] for c in containers] == [BASE_IMAGE]


def test_a_command_missing_from_the_image_is_run_container_error(core: Any) -> None:
    name = f"broken-{uuid.uuid4().hex[:6]}"
    container = {"name": "main", "image": BASE_IMAGE, "command": ["/no/such/program"]}
    core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {"containers": [container]}})

    def reason() -> str | None:
        status = core.read_namespaced_pod(name, "default").status
        statuses = status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting.reason if waiting and waiting.reason == "RunContainerError" else None

    wait_for(reason, timeout=60, what="RunContainerError")
    assert core.read_namespaced_pod(name, "default").status.phase == "Pending"
    core.delete_namespaced_pod(name, "default")


def test_a_container_that_keeps_failing_is_crash_loop_back_off(core: Any) -> None:
    name = f"crashing-{uuid.uuid4().hex[:6]}"
    container = {"name": "main", "image": BASE_IMAGE, "command": ["sh", "-c", "exit 3"]}
    core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {"containers": [container]}})

    def backing_off() -> Any:
        statuses = core.read_namespaced_pod(name, "default").status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return statuses[0] if waiting and waiting.reason == "CrashLoopBackOff" else None

    status = wait_for(backing_off, timeout=60, what="CrashLoopBackOff")
    assert status.restart_count >= 1
    assert status.last_state.terminated.exit_code == 3
    assert core.read_namespaced_pod(name, "default").status.phase == "Running"
    core.delete_namespaced_pod(name, "default")
