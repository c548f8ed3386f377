"""Connecting a Kubernetes cluster on the platform's backend pages: a pasted kubeconfig or the
pod's own service account fills the backend's settings, the cluster check (`Backend.preflight`)
runs before anything is saved and its findings are shown; a kubeconfig the console cannot use
is a field error, a cluster that refuses the credentials saves nothing, and the token is
stored encrypted, never in the clear."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from django.urls import reverse

from console.crypto import decrypt, encrypt
from console.models import AuditEvent
from sandboxes.backends.kubernetes import kubeconfig
from sandboxes.models import PlatformBackend
from tests.factories import make_backend
from tests.fakes.kube.cluster import FakeCluster
from tests.personas import World
from tests.support.kube_rbac import console_role

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

CREATE = "sandboxes:backend_create"
NAMESPACE = "sandboxes"


def _form(**extra: Any) -> dict[str, Any]:
    data = {
        "name": "cluster",
        "kind": "kubernetes",
        "fields_for": "kubernetes",
        "allow_private_endpoints": "on",  # the fake listens on loopback
        "namespace_mode": "shared",
        "max_cpus": "2",
        "max_memory_mb": "2048",
    }
    data.update(extra)
    return data


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def _role_token(cluster: FakeCluster, *, without: str = "") -> str:
    rules = [rule for rule in console_role()["rules"] if rule["resources"] != [without]]
    return cluster.token_with(rules, namespace=NAMESPACE)


def test_a_pasted_kubeconfig_registers_the_cluster_with_its_token_encrypted(
    world: World, fake_cluster: FakeCluster
) -> None:
    token = _role_token(fake_cluster)
    pasted = fake_cluster.kubeconfig(token, namespace=NAMESPACE)
    response = world.client_for("root").post(
        reverse(CREATE), _form(kubeconfig=pasted, spaces=[str(world.space_a.id)]), follow=True
    )
    assert response.redirect_chain[-1][0] == reverse("sandboxes:backend_list")
    said = _messages(response)
    assert "Backend cluster registered." in said
    assert any(m.startswith("cluster: 6 of 6 checks passed (api: Kubernetes v") for m in said), said
    backend = PlatformBackend.objects.get(name="cluster")
    assert (backend.kind, backend.endpoint, backend.namespace, backend.in_cluster) == (
        "kubernetes",
        fake_cluster.url,
        NAMESPACE,
        False,
    )
    assert decrypt(backend.api_key_encrypted) == token
    assert decrypt(backend.tls_ca_encrypted).strip() == fake_cluster.ca_pem.strip()
    assert backend.kubeconfig_encrypted == ""  # its parts are kept, not the file
    stored = " ".join(str(value) for value in PlatformBackend.objects.filter(pk=backend.pk).values().get().values())
    assert token not in stored
    assert list(backend.spaces.all()) == [world.space_a]


def test_a_pasted_token_replaces_a_stored_kubeconfig(world: World, fake_cluster: FakeCluster) -> None:
    stored = make_backend(
        kind="kubernetes", kubeconfig_encrypted=encrypt(fake_cluster.kubeconfig()), allow_private_endpoints=True
    )
    token = _role_token(fake_cluster)
    pasted = fake_cluster.kubeconfig(token, namespace=NAMESPACE)
    url = reverse("sandboxes:backend_edit", args=[stored.pk])
    response = world.client_for("root").post(url, _form(kubeconfig=pasted), follow=True)
    assert "Backend cluster saved." in _messages(response)
    stored.refresh_from_db()
    assert (stored.endpoint, decrypt(stored.api_key_encrypted), stored.kubeconfig_encrypted) == (
        fake_cluster.url,
        token,
        "",
    )


def test_a_chosen_context_of_the_kubeconfig_is_used(world: World, fake_cluster: FakeCluster) -> None:
    document = yaml.safe_load(fake_cluster.kubeconfig(_role_token(fake_cluster), namespace=NAMESPACE))
    document["contexts"].append({"name": "broken", "context": {"cluster": "fake", "user": "nobody"}})
    document["current-context"] = "broken"
    response = world.client_for("root").post(
        reverse(CREATE), _form(kubeconfig=yaml.safe_dump(document), kubeconfig_context="fake")
    )
    assert response.status_code == 302
    assert PlatformBackend.objects.get(name="cluster").namespace == NAMESPACE


@pytest.mark.parametrize(
    ("user", "says"),
    [
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}, "cannot run a local binary"),
        ({"tokenFile": "/home/admin/token"}, "a path on your machine"),
    ],
)
def test_a_kubeconfig_the_console_cannot_use_is_a_field_error_and_saves_nothing(
    world: World, fake_cluster: FakeCluster, user: dict[str, Any], says: str
) -> None:
    document = yaml.safe_load(fake_cluster.kubeconfig())
    document["users"][0]["user"] = user
    response = world.client_for("root").post(reverse(CREATE), _form(kubeconfig=yaml.safe_dump(document)))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert says in " ".join(errors["kubeconfig"])
    assert fake_cluster.admin_token not in response.content.decode()
    assert not PlatformBackend.objects.exists()
    assert not AuditEvent.objects.filter(target_type="platform_backend").exists()


def test_a_cluster_refusing_the_credentials_saves_nothing(world: World, fake_cluster: FakeCluster) -> None:
    response = world.client_for("root").post(reverse(CREATE), _form(kubeconfig=fake_cluster.kubeconfig("forged")))
    assert response.status_code == 400
    [error] = response.context["form"].non_field_errors()
    assert error == (
        "Not saved: The API server does not answer: 401 Unauthorized: the token or client certificate is not accepted"
    )
    assert not PlatformBackend.objects.exists()


def test_a_missing_permission_is_named_once_saved(world: World, fake_cluster: FakeCluster) -> None:
    pasted = fake_cluster.kubeconfig(_role_token(fake_cluster, without="sandboxwarmpools"), namespace=NAMESPACE)
    response = world.client_for("root").post(reverse(CREATE), _form(kubeconfig=pasted), follow=True)
    said = _messages(response)
    missing = ", ".join(
        f"{verb} sandboxwarmpools.extensions.agents.x-k8s.io"
        for verb in ("get", "list", "watch", "create", "update", "patch", "delete")
    )
    assert f"cluster: permissions: missing in namespace 'sandboxes': {missing}" in said
    assert PlatformBackend.objects.filter(name="cluster").exists()


def test_the_in_cluster_service_account_connects_without_storing_its_token(
    world: World, fake_cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    token = _role_token(fake_cluster)
    (account / "token").write_text(token)
    (account / "ca.crt").write_text(fake_cluster.ca_pem)
    (account / "namespace").write_text(NAMESPACE)
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", fake_cluster.url.rsplit(":", 1)[1])
    root = world.client_for("root")
    response = root.post(reverse(CREATE), _form(in_cluster="on"), follow=True)
    assert any(m.startswith("cluster: 6 of 6 checks passed") for m in _messages(response)), _messages(response)
    backend = PlatformBackend.objects.get(name="cluster")
    assert (backend.in_cluster, backend.namespace, backend.endpoint, backend.api_key_encrypted) == (
        True,
        NAMESPACE,
        "",
        "",
    )
    tested = root.post(reverse("sandboxes:backend_test", args=[backend.pk]), follow=True)
    assert any(m.startswith("cluster: 6 of 6 checks passed") for m in _messages(tested))


def test_in_cluster_outside_a_pod_is_a_field_error(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    response = world.client_for("root").post(reverse(CREATE), _form(in_cluster="on"))
    assert response.status_code == 400
    assert "does not run in a Kubernetes pod" in " ".join(response.context["form"].errors["in_cluster"])
    assert not PlatformBackend.objects.exists()


def test_test_connection_on_the_backends_page_is_for_platform_admins_only(world: World) -> None:
    backend = make_backend()
    url = reverse("sandboxes:backend_test", args=[backend.pk])
    assert world.client_for("alice").post(url).status_code == 404
    assert Client().post(url).status_code == 302  # to sign in
