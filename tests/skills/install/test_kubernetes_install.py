"""A bundled example skill installed into a Kubernetes-backed space's image (the fake cluster,
the local OCI registry): the build pod's changes become an image pushed to the registry and a
SandboxTemplate named after the snapshot, and a session on the new image runs the skill's
script.

The template image is pushed to the registry first, as a platform admin does: skill images are
layers on it. The fake kubelet never pulls, so the test pulls the pushed skill image from the
loopback registry into the engine, as a node would.
"""

from __future__ import annotations

from collections.abc import Iterator

import docker
import httpx
import pytest
from django.urls import reverse

from console.models import JobStatus
from console.services import SYSTEM
from sandboxes.backends.base import ExecRequest
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.images import current_image
from skills.services import do_import_examples
from tests.conftest import REDIS_URL
from tests.fakes.kube.cluster import FakeCluster
from tests.fakes.kube.crds import SANDBOX_TEMPLATES
from tests.fakes.kube.fixtures import template_body
from tests.personas import World
from tests.support.kube_backend import make_kube_backend
from tests.support.oci_registry import LocalRegistry
from tests.support.skill_install import clean_up, job_error, make_skills_config, run_install

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]


@pytest.fixture
def config(
    world: World,
    fake_cluster: FakeCluster,
    oci_registry: LocalRegistry,
    docker_base_image: str,
    installation: str,
) -> Iterator[SandboxConfig]:
    base = oci_registry.push_local_image(docker_base_image, "sandbox-console/base", "latest")
    backend = make_kube_backend(fake_cluster, world.space_a, registry_url=oci_registry.url)
    made = make_skills_config(world.space_a, base, backend=backend)
    try:
        yield made
    finally:
        clean_up(made, installation)


def test_an_example_skill_installs_into_an_image_a_session_runs(
    world: World, config: SandboxConfig, fake_cluster: FakeCluster, oci_registry: LocalRegistry
) -> None:
    imported = do_import_examples(actor=SYSTEM)
    version = next(r.version for r in imported.results if r.version.skill.name == "text-stats")
    job = run_install(world.space_a, config, version)
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    assert image.snapshot_id.startswith("snap-")

    # The config's Templates page lists the skill image among its snapshots, not its templates,
    # beside the platform admin's SandboxTemplates.
    fake_cluster.store.create(SANDBOX_TEMPLATES, "default", template_body("admins-python"))
    try:
        html = world.client_for("alice").get(reverse("sandboxes:template_list", args=[config.pk])).content.decode()
    finally:
        fake_cluster.store.delete(SANDBOX_TEMPLATES, "default", "admins-python")
    templates_part = html[html.index('id="templates"') : html.index('id="snapshots"')]
    snapshots_part = html[html.index('id="snapshots"') :]
    assert "admins-python" in templates_part
    assert image.snapshot_id not in templates_part
    assert image.snapshot_id in snapshots_part

    template = fake_cluster.store.get(SANDBOX_TEMPLATES, "default", image.snapshot_id)
    pinned = template["spec"]["podTemplate"]["spec"]["containers"][0]["image"]
    assert pinned.startswith(f"{oci_registry.host}/sandbox-console/base@sha256:")
    engine = docker.from_env(timeout=120)
    repository, digest = pinned.split("@")
    try:
        engine.images.pull(repository, tag=digest)

        runtime = Runtime(RedisSessionStore(REDIS_URL))
        session = runtime.resolve(world.space_a, "uses-text-stats").session
        assert session.template_id == image.snapshot_id

        def run(shell: str) -> str:
            result = runtime.exec(session, ExecRequest(shell=shell, user="user", timeout_s=60, cwd="/workspace"))
            assert result.exit_code == 0, result.stderr.decode() + result.stdout.decode()
            return result.stdout.decode()

        run("printf 'one two two\\n' > notes.txt")
        stats = run("/opt/skills/text-stats/scripts/text-stats.sh notes.txt")
        assert '"words": 3' in stats.replace(":3", ": 3")

        # Deleting the snapshot deletes its SandboxTemplate and its manifest in the registry.
        snapshots = get_backend(config).snapshots()
        assert snapshots is not None
        snapshots.delete(image.snapshot_id)
        assert fake_cluster.store.find(SANDBOX_TEMPLATES, "default", image.snapshot_id) is None
        answer = httpx.head(f"{oci_registry.url}/v2/sandbox-console/base/manifests/{digest}")
        assert answer.status_code == 404
    finally:
        engine.images.remove(pinned, force=True)
        engine.close()
