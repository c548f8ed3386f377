"""A Cube template the console builds gets the config's disk limit as its writable layer
(CubeAPI POST /templates `writableLayerSize`), against the fake Cube; the build job hands the
config's limit over, and E2B and Cube say on the config page where a limit holds."""

from __future__ import annotations

import pytest

from sandboxes.backends.base import TemplateBuildSpec
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.e2b.backend import E2BBackend
from tests.fakes.fixtures import FakeHandle

pytestmark = [pytest.mark.docker, pytest.mark.e2b, pytest.mark.cube]


@pytest.mark.parametrize(("disk_mb", "sent"), [(1536, "1536M"), (4096, "4G"), (None, "1G")])
def test_a_cube_template_is_created_with_the_disk_as_its_writable_layer(
    fake_cube: FakeHandle, docker_base_image: str, disk_mb: int | None, sent: str
) -> None:
    adapter = CubeBackend(fake_cube.backend_config("cube"))
    templates = adapter.templates()
    assert templates is not None
    spec = TemplateBuildSpec(name="disk", labels={"image": docker_base_image}, disk_mb=disk_mb)
    template = templates.create(spec)
    try:
        detail = adapter._api("GET", f"/templates/{template.template_id}", "template", idempotent=True).json()
        assert detail["createRequest"]["writableLayerSize"] == sent
    finally:
        templates.delete(template.template_id)
        adapter.close()


def test_e2b_and_cube_say_where_a_disk_limit_holds(fake_cube: FakeHandle, fake_e2b: FakeHandle) -> None:
    cube = CubeBackend(fake_cube.backend_config("cube")).disk_capabilities()
    assert cube.writable_layer
    assert "writableLayerSize" in cube.summary
    e2b = E2BBackend(fake_e2b.backend_config("e2b")).disk_capabilities()
    assert not e2b.any
    assert "takes no disk size" in e2b.summary
