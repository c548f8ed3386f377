"""A platform admin's walk with a Kubernetes cluster, end to end through the console's own
pages and the agent API, the cluster being the fake (tests/fakes/kube/) served on loopback:
connect it by pasting a kubeconfig whose token holds exactly the Role of docs/kubernetes.md,
grant it to a space; the space admin makes a config with a warm pool; an agent starts a
session through the API and is handed a pool's sandbox; the space admin opens its terminal and
installs a bundled skill, which becomes an image in the admin's registry (Debian's
docker-registry on loopback) that the next session runs."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse
from kubernetes import client as k8s

from console.models import AdminJob, JobStatus
from console.services import SYSTEM, Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import PlatformBackend, SandboxConfig, Session
from sandboxes.pools.keeper import refill
from sandboxes.sessions.runtime import Runtime
from sandboxes.terminal import process as terminal_process
from skills.images import current_image
from skills.services import do_import_examples
from tests.fakes.kube.cluster import FakeCluster
from tests.fakes.kube.crds import SANDBOX_CLAIMS, SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS, SANDBOXES
from tests.fakes.kube.fixtures import kube_client, template_body
from tests.personas import World
from tests.support.jobs import run_to_end
from tests.support.kube_rbac import console_role
from tests.support.oci_registry import LocalRegistry
from tests.support.skill_install import clean_up, job_error
from tests.support.terminal_support import open_terminal

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TEMPLATE = f"walk-{uuid.uuid4().hex[:6]}"
POOL_READY_S = 90.0


@pytest.fixture
def namespace(fake_cluster: FakeCluster, oci_registry: LocalRegistry, docker_base_image: str) -> Iterator[str]:
    """The docs' namespace, holding the platform's template the configs start from: the base
    image as pushed to the registry (skill images are layers on it)."""
    base = oci_registry.push_local_image(docker_base_image, "sandbox-console/base", "latest")
    namespace = console_role()["metadata"]["namespace"]
    api = kube_client(fake_cluster)
    with contextlib.suppress(k8s.ApiException):  # made by an earlier test of the run
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
    custom = k8s.CustomObjectsApi(api)
    group, version = "extensions.agents.x-k8s.io", "v1beta1"
    custom.create_namespaced_custom_object(
        group, version, namespace, "sandboxtemplates", template_body(TEMPLATE, image=base)
    )
    yield namespace
    custom.delete_namespaced_custom_object(group, version, namespace, "sandboxtemplates", TEMPLATE)


def _register(
    root: Client, cluster: FakeCluster, namespace: str, world: World, registry: LocalRegistry
) -> PlatformBackend:
    token = cluster.token_with(console_role()["rules"], namespace=namespace)
    form = {
        "name": "cluster",
        "kind": "kubernetes",
        "fields_for": "kubernetes",
        "kubeconfig": cluster.kubeconfig(token, namespace=namespace),
        "allow_private_endpoints": "on",  # the fake listens on loopback
        "namespace_mode": "shared",
        "max_cpus": "2",
        "max_memory_mb": "2048",
        "max_pool_size": "2",
        "registry_url": registry.url,
        "spaces": [str(world.space_a.id)],
    }
    response = root.post(reverse("sandboxes:backend_create"), form, follow=True)
    said = [str(m) for m in response.context["messages"]]
    assert any(m.startswith("cluster: 6 of 6 checks passed") for m in said), said
    return PlatformBackend.objects.get(name="cluster")


def _make_config(alice: Client, world: World, backend: PlatformBackend) -> SandboxConfig:
    form = {
        "name": "on the cluster",
        "backend": str(backend.pk),
        "default_template": TEMPLATE,
        "cpus": "1",
        "memory_mb": "512",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
        "persistent_workspace": "on",
        "is_default": "on",
    }
    response = alice.post(reverse("sandboxes:config_create", args=[world.space_a.pk]), form)
    assert response.status_code == 302, response.content.decode()[-3000:]
    config = SandboxConfig.objects.get(space=world.space_a, name="on the cluster")
    sized = alice.post(reverse("sandboxes:pool_size", args=[world.space_a.pk, config.pk]), {"pool_size": "1"})
    assert sized.status_code == 302
    config.refresh_from_db()
    assert config.pool_size == 1
    return config


def _ready_pool_sandboxes(cluster: FakeCluster, namespace: str) -> set[str]:
    """The Sandboxes a warm pool holds ready (owned by a pool, not yet by a claim)."""
    ready = set()
    for item in cluster.store.items(SANDBOXES, namespace):
        owners = {ref.get("kind") for ref in item["metadata"].get("ownerReferences") or []}
        conditions = {c.get("type"): c.get("status") for c in (item.get("status") or {}).get("conditions") or []}
        if "SandboxWarmPool" in owners and conditions.get("Ready") == "True":
            ready.add(item["metadata"]["name"])
    return ready


def _wait_for_pool(cluster: FakeCluster, namespace: str) -> set[str]:
    deadline = time.monotonic() + POOL_READY_S
    while not (ready := _ready_pool_sandboxes(cluster, namespace)):
        assert time.monotonic() < deadline, "the warm pool made no ready sandbox"
        time.sleep(0.5)
    return ready


class Agent:
    def __init__(self, space_id: Any, token: str) -> None:
        self.client, self.space_id = Client(), space_id
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, key: str, suffix: str, body: Any = None) -> Any:
        url = f"/api/v1/spaces/{self.space_id}/sessions/{key}/{suffix}"
        data = json.dumps(body) if body is not None else ""
        return self.client.post(url, data, content_type="application/json", headers=self.headers)


async def _terminal_echo(user: Any, session: Session) -> bytes:
    comm, screen, _ = await open_terminal(user, session)
    try:
        await screen.run("echo walk-$((6*7)); id -u\n")
        await screen.until_output(b"walk-42", timeout=30)
        return screen.data
    finally:
        await comm.disconnect(code=1000)
        await terminal_process.close_all("test finished")


@pytest.mark.django_db(transaction=True)
def _install_a_skill(alice: Client, world: World, config: SandboxConfig) -> str:
    """Install the bundled text-stats skill from the Skill image page; the new image's id."""
    imported = do_import_examples(actor=SYSTEM)
    version = next(r.version for r in imported.results if r.version.skill.name == "text-stats")
    started = alice.post(
        reverse("skills:image_install", args=[world.space_a.pk]), {"config": str(config.pk), "version": str(version.pk)}
    )
    assert started.status_code == 302
    job = run_to_end(str(AdminJob.objects.get(kind="skills.install", space=world.space_a).pk))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    return image.snapshot_id


@contextlib.contextmanager
def pulled(cluster: FakeCluster, namespace: str, template: str) -> Iterator[None]:
    """The skill image pulled from the registry into the engine, as a node would (the fake
    kubelet never pulls)."""
    pinned = cluster.store.get(SANDBOX_TEMPLATES, namespace, template)["spec"]["podTemplate"]["spec"]["containers"][0][
        "image"
    ]
    engine = docker.from_env(timeout=120)
    repository, digest = pinned.split("@")
    try:
        engine.images.pull(repository, tag=digest)
        yield
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            engine.images.remove(pinned, force=True)
        engine.close()


@pytest.mark.django_db(transaction=True)
def test_a_cluster_connected_granted_pooled_and_used_through_the_api_and_the_terminal(
    world: World, fake_cluster: FakeCluster, namespace: str, oci_registry: LocalRegistry, settings: Any
) -> None:
    settings.CONSOLE_INSTALLATION_ID = installation = f"walk-{uuid.uuid4().hex[:6]}"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    backend = _register(world.client_for("root"), fake_cluster, namespace, world, oci_registry)
    assert list(backend.spaces.all()) == [world.space_a]

    config = _make_config(world.client_for("alice"), world, backend)
    try:
        # The config's Test connection: the cluster check in its health step, then a sandbox made and run.
        assert world.client_for("alice").post(reverse("sandboxes:config_test", args=[config.pk])).status_code == 302
        tested = run_to_end(str(AdminJob.objects.get(kind="sandboxes.test_connection", space=world.space_a).pk))
        assert tested.status == JobStatus.SUCCEEDED, tested.error
        steps = {step["name"]: step for step in tested.result["steps"]}
        assert steps["health"]["detail"].endswith("; 6 of 6 checks passed")
        assert [name for name, step in steps.items() if not step["ok"]] == []

        report = refill(config)
        assert (report.errors, report.skipped) == ([], ""), report
        assert [p for p in fake_cluster.store.items(SANDBOX_WARM_POOLS, namespace) if p["spec"].get("replicas") == 1]
        pooled = _wait_for_pool(fake_cluster, namespace)

        _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(world.alice))
        agent = Agent(world.space_a.pk, token)
        resolved = agent.post("walk-1", "resolve")
        assert resolved.status_code == 200, resolved.content
        session = Session.objects.get(space=world.space_a, key="walk-1")
        claim = fake_cluster.store.get(SANDBOX_CLAIMS, namespace, session.sandbox_id.split(".", 1)[1])
        assert claim["status"]["sandbox"]["name"] in pooled  # handed the pool's sandbox, not a new one

        ran = agent.post("walk-1", "exec", {"shell": "echo from-the-api; id -u"})
        assert ran.status_code == 200, ran.content
        assert json.loads(ran.content)["stdout"].split() == ["from-the-api", "1000"]

        screen = async_to_sync(_terminal_echo)(world.alice, session)
        assert b"walk-42" in screen

        snapshot = _install_a_skill(world.client_for("alice"), world, config)
        with pulled(fake_cluster, namespace, snapshot):
            assert agent.post("walk-2", "resolve").status_code == 200
            assert Session.objects.get(space=world.space_a, key="walk-2").template_id == snapshot
            script = "printf 'one two two\\n' > notes.txt && /opt/skills/text-stats/scripts/text-stats.sh notes.txt"
            counted = agent.post("walk-2", "exec", {"shell": script, "cwd": "/workspace"})
            assert counted.status_code == 200, counted.content
            assert '"words": 3' in json.loads(counted.content)["stdout"].replace(":3", ": 3")
    finally:
        for session in Session.objects.filter(config=config):
            Runtime().delete(session, actor=Actor(world.alice))
        native = get_backend(config).warm_pools()
        if native is not None:
            for name in native.pools():
                native.drain(name)
        clean_up(config, installation)
