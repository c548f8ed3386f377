"""Generations of a space's skill image on the real Docker engine: uninstalling down to no
skill, and image depth staying bounded however many generations a space builds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.models import JobStatus
from sandboxes.models import SandboxConfig
from skills.images import current_image
from tests.factories import make_config
from tests.personas import World
from tests.support.skill_install import (
    build_sandboxes,
    clean_up,
    import_skill,
    job_error,
    plain_skill,
    run_install,
    run_uninstall,
)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]


@pytest.fixture
def installation(settings: Any, test_run_id: str) -> str:
    settings.CONSOLE_INSTALLATION_ID = f"test-{test_run_id}-generations"
    return str(settings.CONSOLE_INSTALLATION_ID)


@pytest.fixture
def config(
    world: World, docker_base_image: str, installation: str, settings: Any, tmp_path: Path
) -> Iterator[SandboxConfig]:
    settings.SKILL_PACKAGE_SOURCES_ROOT = tmp_path
    made: SandboxConfig = make_config(
        world.space_a, name="skills", default_template=docker_base_image, is_default=True, persistent_workspace=False
    )
    try:
        yield made
    finally:
        clean_up(made, installation)


def test_uninstalling_the_last_skill_leaves_an_empty_skill_image(
    world: World, config: SandboxConfig, installation: str
) -> None:
    only = import_skill(plain_skill("only-skill"))
    assert run_install(world.space_a, config, only).status == JobStatus.SUCCEEDED
    job = run_uninstall(world.space_a, config, "only-skill")
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    assert image.generation == 2
    assert image.skill_names == []
    assert build_sandboxes(config, installation) == []
