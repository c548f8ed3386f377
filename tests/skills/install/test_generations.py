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
from tests.personas import World
from tests.support.skill_install import (
    build_sandboxes,
    import_skill,
    job_error,
    plain_skill,
    run_install,
    run_uninstall,
    skills_config,
)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]


@pytest.fixture
def config(
    world: World, docker_base_image: str, installation: str, settings: Any, tmp_path: Path
) -> Iterator[SandboxConfig]:
    settings.SKILL_PACKAGE_SOURCES_ROOT = tmp_path
    with skills_config(world.space_a, docker_base_image, installation) as made:
        yield made


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
