"""The fake Kubernetes API driven by the unmodified official `kubernetes` client: kubeconfig
with the generated CA, discovery, CRUD on the agent-sandbox kinds, validation, pages with
`continue` tokens, watch streams and 410s, RBAC 403s and the self reviews."""

from __future__ import annotations

import json
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, config, watch

from tests.fakes.kube.cluster import FakeCluster, running_fake_cluster
from tests.fakes.kube.fixtures import kube_client, template_body, warm_pool_body
from tests.support.console_process import wait_for

pytestmark = pytest.mark.docker

# The client's models type every field Optional; the tests read them as the server answered.
apis: Any = client
EXT = ("extensions.agents.x-k8s.io", "v1beta1")


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _status(exc: client.ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.body or "{}")
    return body


def pvc_body(prefix: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"generateName": prefix, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def test_kubeconfig_with_the_ca_reaches_the_server_over_https(fake_cluster: FakeCluster, tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(fake_cluster.kubeconfig())
    loaded = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=loaded)
    assert fake_cluster.url.startswith("https://127.0.0.1:")
    assert loaded.host == fake_cluster.url
    assert loaded.verify_ssl
    api = client.ApiClient(loaded)
    assert apis.VersionApi(api).get_code().major == "1"
    names = {ns.metadata.name for ns in apis.CoreV1Api(api).list_namespace().items}
    assert {"default", "kube-system"} <= names


def test_a_client_without_the_ca_refuses_the_server(fake_cluster: FakeCluster) -> None:
    configuration = client.Configuration()
    configuration.host = fake_cluster.url
    configuration.api_key = {"authorization": f"Bearer {fake_cluster.admin_token}"}
    configuration.retries = 0
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        apis.CoreV1Api(client.ApiClient(configuration)).list_namespace()


def test_a_wrong_token_is_401_unauthorized(fake_cluster: FakeCluster) -> None:
    api = kube_client(fake_cluster, token="not-a-token")
    with pytest.raises(client.ApiException) as caught:
        apis.CoreV1Api(api).list_namespaced_pod("default")
    assert caught.value.status == 401
    assert _status(caught.value)["reason"] == "Unauthorized"


def test_discovery_names_the_agent_sandbox_groups_and_crds(kube_api: client.ApiClient) -> None:
    groups = {g.name: g for g in apis.ApisApi(kube_api).get_api_versions().groups}
    for group in (
        "agents.x-k8s.io",
        "extensions.agents.x-k8s.io",
        "metrics.k8s.io",
        "networking.k8s.io",
        "apiextensions.k8s.io",
        "authorization.k8s.io",
    ):
        assert group in groups
    assert groups["agents.x-k8s.io"].preferred_version.version == "v1beta1"
    resources = apis.CustomObjectsApi(kube_api).get_api_resources(*EXT).resources
    assert {r.name for r in resources} >= {
        "sandboxclaims",
        "sandboxtemplates",
        "sandboxwarmpools",
        "sandboxclaims/status",
    }
    crds = apis.ApiextensionsV1Api(kube_api).list_custom_resource_definition().items
    by_name = {crd.metadata.name: crd for crd in crds}
    sandbox = by_name["sandboxes.agents.x-k8s.io"]
    assert [(v.name, v.served, v.storage) for v in sandbox.spec.versions] == [("v1beta1", True, True)]
    assert {c.type for c in sandbox.status.conditions if c.status == "True"} >= {"Established"}
    assert "sandboxwarmpools.extensions.agents.x-k8s.io" in by_name


def test_custom_objects_round_trip_with_defaults(kube_api: client.ApiClient) -> None:
    api = apis.CustomObjectsApi(kube_api)
    name = _name("tpl")
    created = api.create_namespaced_custom_object(*EXT, "default", "sandboxtemplates", template_body(name))
    assert created["metadata"]["uid"]
    assert created["metadata"]["resourceVersion"]
    assert created["spec"]["envVarsInjectionPolicy"] == "Disallowed"  # the CRD's default
    got = api.get_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name)
    assert got == created
    labels = {"metadata": {"labels": {"team": "a"}}}
    with pytest.raises(client.ApiException) as strategic:  # custom resources take no strategic merge
        api.patch_namespaced_custom_object(
            *EXT, "default", "sandboxtemplates", name, labels, _content_type="application/strategic-merge-patch+json"
        )
    assert (strategic.value.status, _status(strategic.value)["reason"]) == (415, "UnsupportedMediaType")
    patched = api.patch_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name, labels)
    assert patched["metadata"]["labels"] == {"team": "a"}
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    api.delete_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name)
    with pytest.raises(client.ApiException) as caught:
        api.get_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name)
    assert caught.value.status == 404
    assert _status(caught.value)["message"] == f'sandboxtemplates.extensions.agents.x-k8s.io "{name}" not found'


def test_an_update_with_a_stale_resource_version_is_409_conflict(kube_api: client.ApiClient) -> None:
    api = apis.CustomObjectsApi(kube_api)
    name = _name("tpl")
    first = api.create_namespaced_custom_object(*EXT, "default", "sandboxtemplates", template_body(name))
    first["spec"]["service"] = True
    second = api.replace_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name, first)
    assert second["metadata"]["generation"] == 2
    with pytest.raises(client.ApiException) as caught:
        api.replace_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name, first)  # same old rv
    assert caught.value.status == 409
    assert _status(caught.value)["reason"] == "Conflict"
    with pytest.raises(client.ApiException) as again:
        api.create_namespaced_custom_object(*EXT, "default", "sandboxtemplates", template_body(name))
    assert (again.value.status, _status(again.value)["reason"]) == (409, "AlreadyExists")
    copied = {**template_body(_name("tpl")), "metadata": {"name": _name("tpl"), "resourceVersion": "5"}}
    with pytest.raises(client.ApiException) as stale:
        api.create_namespaced_custom_object(*EXT, "default", "sandboxtemplates", copied)
    assert _status(stale.value)["message"] == "resourceVersion should not be set on objects to be created"
    api.delete_namespaced_custom_object(*EXT, "default", "sandboxtemplates", name)


def test_a_pod_without_containers_and_an_unknown_namespace_are_refused(kube_api: client.ApiClient) -> None:
    core = apis.CoreV1Api(kube_api)
    with pytest.raises(client.ApiException) as invalid:
        core.create_namespaced_pod("default", {"metadata": {"name": "empty"}, "spec": {"containers": []}})
    status = _status(invalid.value)
    assert (invalid.value.status, status["message"]) == (422, 'Pod "empty" is invalid: spec.containers: Required value')
    with pytest.raises(client.ApiException) as missing:
        core.create_namespaced_persistent_volume_claim("no-such-ns", pvc_body("c-"))
    assert (missing.value.status, _status(missing.value)["message"]) == (404, 'namespaces "no-such-ns" not found')


def test_json_patch_and_scale_subresource(kube_api: client.ApiClient) -> None:
    api = apis.CustomObjectsApi(kube_api)
    name = _name("pool")
    api.create_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", warm_pool_body(name, "none", 0))
    operations = [{"op": "add", "path": "/spec/updateStrategy", "value": {"type": "Recreate"}}]
    patched = api.patch_namespaced_custom_object(
        *EXT, "default", "sandboxwarmpools", name, operations, _content_type="application/json-patch+json"
    )
    assert patched["spec"]["updateStrategy"]["type"] == "Recreate"
    api.patch_namespaced_custom_object_scale(*EXT, "default", "sandboxwarmpools", name, {"spec": {"replicas": 0}})
    scale = api.get_namespaced_custom_object_scale(*EXT, "default", "sandboxwarmpools", name)
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 0
    api.delete_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", name)


def test_missing_and_mistyped_fields_are_422_with_causes(kube_api: client.ApiClient) -> None:
    api = apis.CustomObjectsApi(kube_api)
    body = warm_pool_body(_name("pool"), "t")
    body["spec"]["replicas"] = "three"
    del body["spec"]["sandboxTemplateRef"]
    with pytest.raises(client.ApiException) as caught:
        api.create_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", body)
    status = _status(caught.value)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    causes = {(c["field"], c["reason"]) for c in status["details"]["causes"]}
    assert causes == {("spec.sandboxTemplateRef", "FieldValueRequired"), ("spec.replicas", "FieldValueTypeInvalid")}
    assert status["message"].startswith(
        f'SandboxWarmPool.extensions.agents.x-k8s.io "{body["metadata"]["name"]}" is invalid'
    )


def test_generate_name_and_pages_with_continue_tokens(kube_api: client.ApiClient) -> None:
    core = apis.CoreV1Api(kube_api)
    namespace = _name("pages")
    core.create_namespace({"metadata": {"name": namespace}})
    made = []
    for i in range(5):
        body = pvc_body("claim-", n=str(i), tier="a" if i < 3 else "b")
        made.append(core.create_namespaced_persistent_volume_claim(namespace, body).metadata.name)
    assert all(n.startswith("claim-") and len(n) == len("claim-") + 5 for n in made)
    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = core.list_namespaced_persistent_volume_claim(namespace, limit=2, _continue=token)
        pages += 1
        seen += [p.metadata.name for p in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 5 - len(seen)
    assert pages == 3
    assert sorted(seen) == sorted(made)
    selected = core.list_namespaced_persistent_volume_claim(namespace, label_selector="tier in (b),n!=3")
    assert [p.metadata.labels["n"] for p in selected.items] == ["4"]
    by_name = core.list_namespaced_persistent_volume_claim(namespace, field_selector=f"metadata.name={made[0]}")
    assert [p.metadata.name for p in by_name.items] == [made[0]]
    first = core.list_namespaced_persistent_volume_claim(namespace, limit=2)
    core.create_namespaced_persistent_volume_claim(namespace, pvc_body("zzz-late-"))  # would sort into page 2
    core.delete_namespaced_persistent_volume_claim(sorted(made)[-1], namespace)
    rest = core.list_namespaced_persistent_volume_claim(namespace, _continue=first.metadata._continue)
    paged = [p.metadata.name for p in first.items + rest.items]
    assert paged == sorted(made)  # the pages are one snapshot: neither the new nor the deleted one moves
    assert rest.metadata.resource_version == first.metadata.resource_version
    core.delete_namespace(namespace)


def test_an_expired_or_forged_continue_token_is_refused() -> None:
    with running_fake_cluster(history_size=5, docker_pods=False) as cluster:
        api = kube_client(cluster)
        core = apis.CoreV1Api(api)
        for _ in range(3):
            core.create_namespaced_persistent_volume_claim("default", pvc_body("c-"))
        token = core.list_namespaced_persistent_volume_claim("default", limit=1).metadata._continue
        for _ in range(6):  # the history rolls past the token's resourceVersion
            core.create_namespaced_persistent_volume_claim("default", pvc_body("d-"))
        with pytest.raises(client.ApiException) as caught:
            core.list_namespaced_persistent_volume_claim("default", limit=1, _continue=token)
        assert (caught.value.status, _status(caught.value)["reason"]) == (410, "Expired")
        with pytest.raises(client.ApiException) as forged:
            core.list_namespaced_persistent_volume_claim("default", limit=1, _continue="bm90LWEtdG9rZW4")
        assert (forged.value.status, _status(forged.value)["reason"]) == (400, "BadRequest")


def test_watch_streams_events_from_a_resource_version(kube_api: client.ApiClient) -> None:
    api = apis.CustomObjectsApi(kube_api)
    listed = api.list_namespaced_custom_object(*EXT, "default", "sandboxwarmpools")
    rv = listed["metadata"]["resourceVersion"]
    name = _name("pool")
    api.create_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", warm_pool_body(name, "none", 0))
    api.patch_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", name, {"metadata": {"labels": {"x": "1"}}})
    api.delete_namespaced_custom_object(*EXT, "default", "sandboxwarmpools", name)
    w = watch.Watch()
    events = []
    for event in w.stream(
        api.list_namespaced_custom_object,
        *EXT,
        "default",
        "sandboxwarmpools",
        resource_version=rv,
        timeout_seconds=2,
        field_selector=f"metadata.name={name}",
    ):
        labels = event["object"]["metadata"].get("labels") or {}
        events.append((event["type"], event["object"]["metadata"]["name"], labels.get("x")))
        if event["type"] == "DELETED":
            w.stop()
    # The warm pool controller's status writes come in between as MODIFIED events too.
    assert events[0] == ("ADDED", name, None)
    assert ("MODIFIED", name, "1") in events
    assert events[-1] == ("DELETED", name, "1")


def test_watch_sends_bookmarks_when_asked(kube_api: client.ApiClient) -> None:
    core = apis.CoreV1Api(kube_api)
    w = watch.Watch()
    kinds = set()
    for event in w.stream(core.list_namespaced_pod, "kube-system", allow_watch_bookmarks=True, timeout_seconds=3):
        kinds.add(event["type"])
        if "BOOKMARK" in kinds:
            w.stop()
    assert "BOOKMARK" in kinds


def test_watch_from_a_compacted_resource_version_gets_410_gone() -> None:
    with running_fake_cluster(history_size=3, docker_pods=False) as cluster:
        api = kube_client(cluster)
        core = apis.CoreV1Api(api)
        old = core.list_namespaced_persistent_volume_claim("default").metadata.resource_version
        for _ in range(5):
            core.create_namespaced_persistent_volume_claim("default", pvc_body("c-"))
        with pytest.raises(client.ApiException) as caught:
            for _ in watch.Watch().stream(
                core.list_namespaced_persistent_volume_claim, "default", resource_version=old, timeout_seconds=2
            ):
                pass
        assert caught.value.status == 410
        assert "too old resource version" in str(caught.value.reason)
        raw = core.list_namespaced_persistent_volume_claim(
            "default", watch=True, resource_version=old, _preload_content=False, timeout_seconds=2
        )
        line = json.loads(raw.data.splitlines()[0])
        assert line["type"] == "ERROR"
        assert (line["object"]["kind"], line["object"]["code"], line["object"]["reason"]) == ("Status", 410, "Expired")


def test_a_limited_token_gets_403_worded_like_the_apiserver(fake_cluster: FakeCluster) -> None:
    token = fake_cluster.token_with(
        [{"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxclaims"], "verbs": ["get", "list"]}],
        user="limited",
    )
    api = kube_client(fake_cluster, token)
    apis.CustomObjectsApi(api).list_namespaced_custom_object(*EXT, "default", "sandboxclaims")
    with pytest.raises(client.ApiException) as caught:
        apis.CoreV1Api(api).read_namespaced_pod("x", "ns")
    assert caught.value.status == 403
    assert _status(caught.value)["message"] == (
        'pods "x" is forbidden: User "limited" cannot get resource "pods" in API group "" in the namespace "ns"'
    )
    with pytest.raises(client.ApiException) as listing:
        apis.ApiextensionsV1Api(api).list_custom_resource_definition()
    assert _status(listing.value)["message"] == (
        'customresourcedefinitions.apiextensions.k8s.io is forbidden: User "limited" cannot list resource '
        '"customresourcedefinitions" in API group "apiextensions.k8s.io" at the cluster scope'
    )


def test_self_subject_reviews_answer_from_the_same_rules(fake_cluster: FakeCluster) -> None:
    token = fake_cluster.token_with(
        [{"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get", "create"]}], namespace="team"
    )
    auth = apis.AuthorizationV1Api(kube_client(fake_cluster, token))

    def allowed(**attrs: str) -> bool:
        review = auth.create_self_subject_access_review({"spec": {"resourceAttributes": attrs}})
        return bool(review.status.allowed)

    assert allowed(verb="create", resource="pods", subresource="exec", namespace="team")
    assert not allowed(verb="delete", resource="pods", namespace="team")
    assert not allowed(verb="get", resource="pods", namespace="other")
    rules = auth.create_self_subject_rules_review({"spec": {"namespace": "team"}}).status.resource_rules
    assert any("pods/exec" in r.resources for r in rules)


def test_a_watch_with_a_label_selector_sees_objects_come_and_go(kube_api: client.ApiClient) -> None:
    core = apis.CoreV1Api(kube_api)
    rv = core.list_namespaced_persistent_volume_claim("default").metadata.resource_version
    name = core.create_namespaced_persistent_volume_claim("default", pvc_body("sel-", tier="a")).metadata.name
    core.patch_namespaced_persistent_volume_claim(name, "default", {"metadata": {"labels": {"tier": "b"}}})
    core.patch_namespaced_persistent_volume_claim(name, "default", {"metadata": {"labels": {"tier": "a"}}})
    w = watch.Watch()
    seen = []
    for event in w.stream(
        core.list_namespaced_persistent_volume_claim,
        "default",
        label_selector="tier=a",
        resource_version=rv,
        timeout_seconds=2,
    ):
        if event["object"].metadata.name == name and event["type"] != "MODIFIED":  # binding writes MODIFY it
            seen.append(event["type"])
        if len(seen) == 3:
            w.stop()
    assert seen == ["ADDED", "DELETED", "ADDED"]
    core.delete_namespaced_persistent_volume_claim(name, "default")


def test_listing_without_the_watch_verb_cannot_watch(fake_cluster: FakeCluster) -> None:
    token = fake_cluster.token_with([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], user="lister")
    core = apis.CoreV1Api(kube_client(fake_cluster, token))
    core.list_namespaced_pod("default")
    with pytest.raises(client.ApiException) as caught:
        for _ in watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=1):
            pass
    assert caught.value.status == 403


def test_a_body_that_is_not_an_object_is_400_not_500(fake_cluster: FakeCluster, tmp_path: Path) -> None:
    # The client checks the body's type itself, so this goes around it.
    (tmp_path / "ca.pem").write_text(fake_cluster.ca_pem)
    context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    with httpx.Client(base_url=fake_cluster.url, verify=context, timeout=10) as http:
        answer = http.post(
            "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxtemplates",
            content=b'["x"]',
            headers={"Authorization": f"Bearer {fake_cluster.admin_token}", "Content-Type": "application/json"},
        )
    assert answer.status_code == 400
    assert answer.json()["reason"] == "BadRequest"


def test_a_pvc_in_use_stays_terminating_until_its_pod_is_gone(kube_api: client.ApiClient) -> None:
    core = apis.CoreV1Api(kube_api)
    pvc = core.create_namespaced_persistent_volume_claim("default", pvc_body("held-"))
    assert pvc.metadata.finalizers == ["kubernetes.io/pvc-protection"]
    name = pvc.metadata.name
    volume = {"name": "data", "persistentVolumeClaim": {"claimName": name}}
    container = {"name": "main", "image": "sandbox-console/base:latest", "command": ["sleep", "infinity"]}
    pod = {"metadata": {"generateName": "holder-"}, "spec": {"containers": [container], "volumes": [volume]}}
    holder = core.create_namespaced_pod("default", pod).metadata.name
    deleted = core.delete_namespaced_persistent_volume_claim(name, "default")
    assert deleted.metadata.deletion_timestamp is not None
    time.sleep(1.5)  # a few controller passes
    assert core.read_namespaced_persistent_volume_claim(name, "default").metadata.deletion_timestamp
    core.delete_namespaced_pod(holder, "default")
    wait_for(
        lambda: (
            not core.list_namespaced_persistent_volume_claim("default", field_selector=f"metadata.name={name}").items
        ),
        timeout=30,
        what="PVC released",
    )


@pytest.mark.parametrize(
    ("labels", "annotations"),
    [
        ({"tier": "not ok"}, {}),
        ({"tier": "x" * 64}, {}),
        ({"tier": "-dash"}, {}),
        ({"Bad_Prefix/tier": "a"}, {}),
        ({"x" * 64: "a"}, {}),
        ({}, {"note": "x" * (256 * 1024)}),
        ({}, {"bad key": "a"}),
    ],
)
def test_labels_and_annotations_outside_their_syntax_are_422(
    kube_api: client.ApiClient, labels: dict[str, str], annotations: dict[str, str]
) -> None:
    core = apis.CoreV1Api(kube_api)
    body = pvc_body("meta-", **labels)
    body["metadata"]["annotations"] = annotations
    with pytest.raises(client.ApiException) as caught:
        core.create_namespaced_persistent_volume_claim("default", body)
    status = _status(caught.value)
    assert (caught.value.status, status["reason"]) == (422, "Invalid")
    fields = {c["field"] for c in status["details"]["causes"]}
    assert fields == {"metadata.labels" if labels else "metadata.annotations"}


@pytest.mark.parametrize(
    "selector",
    ["tier=" + "x" * 64, "tier=-a", "tier in (a,-b)", "Bad_Prefix/tier=a", "!", "tier in ()", "tier notin ( )"],
)
def test_a_label_selector_outside_label_syntax_is_400(kube_api: client.ApiClient, selector: str) -> None:
    with pytest.raises(client.ApiException) as caught:
        apis.CoreV1Api(kube_api).list_namespaced_persistent_volume_claim("default", label_selector=selector)
    assert (caught.value.status, _status(caught.value)["reason"]) == (400, "BadRequest")
