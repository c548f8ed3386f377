"""Connecting a Kubernetes cluster in Chromium against the live console (Daphne): a platform
admin chooses the kind, pastes a kubeconfig that would run a program and is told why not on
the field, then pastes one with a service account's token (exactly the Role of
docs/kubernetes.md on the fake cluster, served on 127.0.0.1) and sees the cluster check's
findings once saved; the same paste works with JavaScript off.

Screenshots go to var/test-artifacts/screenshots/.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from django.urls import reverse

from sandboxes.models import PlatformBackend
from tests.fakes.kube.cluster import FakeCluster
from tests.personas import World
from tests.support.browser import log_in, shoot_all
from tests.support.kube_rbac import console_role

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker, pytest.mark.slow]


def _paste(page: Any, name: str, kubeconfig: str, space_id: str) -> None:
    page.fill("#id_name", name)
    page.fill("#id_kubeconfig", kubeconfig)
    page.check("#id_allow_private_endpoints")  # the fake listens on loopback
    page.check(f"input[name=spaces][value='{space_id}']")
    page.click("#backend-form button[type=submit]:has-text('Save')")


def test_a_platform_admin_connects_a_cluster_by_pasting_a_kubeconfig(
    world: World, fake_cluster: FakeCluster, daphne_url: str, page: Any
) -> None:
    base, space_id = daphne_url, str(world.space_a.id)
    role = console_role()
    token = fake_cluster.token_with(role["rules"], namespace=role["metadata"]["namespace"])
    good = fake_cluster.kubeconfig(token, namespace=role["metadata"]["namespace"])
    plugin = yaml.safe_load(good)
    plugin["users"][0]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, base, "root")

    page.goto(f"{base}{reverse('sandboxes:backend_create')}")
    page.select_option("#id_kind", "kubernetes")
    page.wait_for_selector("#id_kubeconfig")
    assert page.locator("#id_in_cluster").count() == 1  # the other way in
    _paste(page, "refused", yaml.safe_dump(plugin), space_id)
    page.wait_for_selector("#backend-form .has-error .error")
    assert "cannot run a local binary" in page.inner_text("#backend-form")
    assert page.input_value("#id_kubeconfig") == ""  # a secret is never rendered back
    shoot_all(page, "connect-cluster-refused", reload=False)
    assert not PlatformBackend.objects.exists()

    _paste(page, "cluster", good, space_id)
    page.wait_for_url(re.compile(r".*/platform/backends/$"))
    said = page.inner_text(".messages")
    assert "Backend cluster registered." in said
    assert "cluster: 6 of 6 checks passed" in said
    shoot_all(page, "connect-cluster-registered", reload=False)
    assert PlatformBackend.objects.get(name="cluster").endpoint == fake_cluster.url

    nojs_context = page.context.browser.new_context(java_script_enabled=False)
    try:
        nojs = nojs_context.new_page()
        log_in(nojs, base, "root")
        nojs.goto(f"{base}{reverse('sandboxes:backend_create')}")
        nojs.select_option("#id_kind", "kubernetes")
        nojs.click("button[name=choose_kind]:has-text('Next')")
        nojs.wait_for_selector("#id_kubeconfig")
        _paste(nojs, "without js", good, space_id)
        nojs.wait_for_url(re.compile(r".*/platform/backends/$"))
        assert "without js: 6 of 6 checks passed" in nojs.inner_text(".messages")
    finally:
        nojs_context.close()
