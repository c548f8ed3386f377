"""The pip lock of skill image generations: recorded from what pip installed, carried on, shown
on the Skill image page, and reused by a rebuild from the base template (real Docker, a local
wheel folder that gains a newer version between builds).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.urls import reverse

from console.models import JobStatus
from sandboxes.models import SandboxConfig
from skills.images import current_image
from skills.install.build import parent_lock
from skills.install.lock import constraints_text, lock_after_build
from tests.personas import World
from tests.support.skill_install import (
    import_skill,
    job_error,
    plain_skill,
    run_install,
    run_uninstall,
    skill_with_dependency,
    skills_config,
    write_wheel,
)


def test_a_build_locks_what_it_added_or_changed_and_what_the_parent_locked() -> None:
    base = {"pip": "24.0", "six": "1.16.0"}
    after = {**base, "tinydep": "1.0", "six": "1.17.0", "other": "3"}
    assert lock_after_build({"other": "3"}, base, after) == {"other": "3", "six": "1.17.0", "tinydep": "1.0"}
    # What the parent locked but this build no longer has (an uninstalled skill's) is gone.
    assert lock_after_build({"gone": "1", "tinydep": "1.0"}, base, {**base, "tinydep": "1.0"}) == {"tinydep": "1.0"}
    # No python3 in the image: the parent's lock stands.
    assert lock_after_build({"tinydep": "1.0"}, None, None) == {"tinydep": "1.0"}


def test_constraints_pin_each_locked_version_and_skip_what_pip_could_misread() -> None:
    text = constraints_text({"tinydep": "1.0", "b-pkg": "2.0.post1+local", "bad name": "1", "x": "1; rm"})
    assert text == "b-pkg==2.0.post1+local\ntinydep==1.0\n"


@pytest.mark.parametrize("stored", [{"pip": ["tinydep"]}, {"pip": "tinydep==1"}, {"pip": {"tinydep": 1}}, ["x"], None])
def test_a_malformed_stored_lock_is_read_as_no_lock_not_a_crash(stored: object) -> None:
    """The lock is a JSON field: a row edited by hand (or a lock of another shape) must not
    fail every later rebuild with a TypeError; what is not name -> version is left out."""
    parent = SimpleNamespace(lock=stored)
    plan = SimpleNamespace(parent=parent)
    assert constraints_text(parent_lock(plan)) == ""  # type: ignore[arg-type]
    mixed = SimpleNamespace(parent=SimpleNamespace(lock={"pip": {"tinydep": "1.0", "bad": 2}}))
    assert parent_lock(mixed) == {"tinydep": "1.0"}  # type: ignore[arg-type]


@pytest.fixture
def config(world: World, docker_base_image: str, installation: str, wheels: Path) -> Iterator[SandboxConfig]:
    with skills_config(world.space_a, docker_base_image, installation, pip_find_links=wheels.name) as made:
        yield made


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db
def test_a_rebuild_from_the_base_installs_the_locked_versions(
    world: World, config: SandboxConfig, wheels: Path
) -> None:
    unpinned = import_skill(skill_with_dependency("tiny-skill", requirement="tinydep>=1.0"))
    job = run_install(world.space_a, config, unpinned)
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    first = current_image(world.space_a, config)
    assert first is not None
    assert first.lock == {"pip": {"tinydep": "1.0"}}

    # The source now offers a newer version; an unpinned resolve would take it.
    write_wheel(wheels, version="2.0", value=2)
    job = run_install(world.space_a, config, import_skill(plain_skill("other-skill")))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    second = current_image(world.space_a, config)
    assert second is not None
    assert second.lock == {"pip": {"tinydep": "1.0"}}  # carried on: built on the first's snapshot

    # Uninstalling rebuilds from the base template and reinstalls tiny-skill: with the lock.
    job = run_uninstall(world.space_a, config, "other-skill")
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    rebuilt = current_image(world.space_a, config)
    assert rebuilt is not None
    assert rebuilt.base_template == config.default_template
    assert rebuilt.lock == {"pip": {"tinydep": "1.0"}}
    assert "pip installs with the lock of generation 2: tinydep==1.0" in rebuilt.log
    assert [entry["installed"] for entry in rebuilt.manifest] == [["tinydep-1.0"]]

    page = world.client_for("carol").get(
        reverse("skills:image_detail", kwargs={"space_id": world.space_a.id}), {"config": str(config.id)}
    )
    assert page.status_code == 200
    assert "<code>tinydep==1.0</code>" in page.content.decode()


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db
def test_a_locked_version_the_source_lost_fails_the_rebuild_naming_the_lock(
    world: World, config: SandboxConfig, wheels: Path
) -> None:
    job = run_install(world.space_a, config, import_skill(skill_with_dependency("tiny-skill")))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    job = run_install(world.space_a, config, import_skill(plain_skill("other-skill")))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    write_wheel(wheels, version="2.0", value=2)
    (wheels / "tinydep-1.0-py3-none-any.whl").unlink()

    job = run_uninstall(world.space_a, config, "other-skill")
    assert job.status == JobStatus.FAILED
    assert "pip installed with the lock of generation 2" in job.error
    assert "tinydep==1.0" in job.error
    current = current_image(world.space_a, config)
    assert current is not None
    assert current.generation == 2  # the previous generation stays in force
