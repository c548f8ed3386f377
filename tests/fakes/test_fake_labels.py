"""The fake's containers and committed images must not look like console templates.

The base image is labelled console.managed=1 / console.kind=template, and containers and
`docker commit` images inherit their image's labels; the fake overrides both markers, so
while fake sandboxes and snapshots exist the Docker adapter's template list stays clean.
"""

from __future__ import annotations

import docker
import pytest

from sandboxes.backends.base import BackendConfig
from sandboxes.backends.docker.backend import DockerBackend
from tests.fakes.fake_runtime import LABEL_RUN
from tests.fakes.fixtures import FakeHandle

pytestmark = [pytest.mark.docker, pytest.mark.e2b]


def test_fake_sandboxes_and_snapshots_stay_out_of_the_docker_template_list(fake_e2b: FakeHandle) -> None:
    engine = docker.from_env(timeout=60)
    docker_backend = DockerBackend(BackendConfig(kind="docker"))
    with fake_e2b.http() as http:
        created = http.post("/sandboxes", json={"templateID": "base", "timeout": 120, "metadata": {"t": "labels"}})
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["sandboxID"]
        try:
            snap = http.post(f"/sandboxes/{sandbox_id}/snapshots", json={"name": "label-check"})
            assert snap.status_code == 201, snap.text
            try:
                run_label = f"{LABEL_RUN}={fake_e2b.run_id}"
                containers = engine.api.containers(all=True, filters={"label": run_label})
                images = engine.api.images(filters={"label": run_label})
                assert containers
                assert images
                for row in [*containers, *images]:
                    assert row["Labels"]["console.kind"] == "fake-e2b"
                    assert row["Labels"]["console.managed"] == "0"
                fake_images = {image["Id"] for image in images}
                templates = docker_backend.templates()
                assert templates is not None
                for template in templates.list():
                    assert engine.api.inspect_image(template.template_id)["Id"] not in fake_images
                    assert LABEL_RUN not in template.labels
            finally:
                http.delete(f"/templates/{snap.json()['snapshotID']}")
        finally:
            http.delete(f"/sandboxes/{sandbox_id}")
            docker_backend.close()
            engine.close()
