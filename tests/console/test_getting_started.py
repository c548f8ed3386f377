"""The dashboard's getting-started path checks itself off from real state, step by step."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from console.models import AdminJob, JobStatus
from sandboxes.catalog.services import config_fingerprint
from sandboxes.models import Session, Terminal
from skills.models import SkillImage, SkillImageStatus
from tests.factories import make_backend, make_config
from tests.personas import World

pytestmark = pytest.mark.django_db


def _steps(world: World, who: str = "alice") -> dict[str, tuple[bool, str]]:
    page = world.client_for(who).get(reverse("console:dashboard")).content.decode()
    found = re.findall(r'id="step-(\w+)" data-done="(true|false)">(.*?)</li>', page, re.S)
    return {key: (done == "true", body) for key, done, body in found}


def test_steps_check_off_as_the_state_appears(world: World) -> None:
    steps = _steps(world)
    assert list(steps) == ["config", "test", "skill", "session", "terminal"]
    assert not any(done for done, _ in steps.values())
    assert "ask a platform admin" in steps["config"][1]  # nothing granted yet, alice is no platform admin

    make_backend(world.space_a)
    steps = _steps(world)
    assert reverse("sandboxes:config_create", kwargs={"space_id": world.space_a.id}) in steps["config"][1]

    config = make_config(world.space_a, backend=world.space_a.granted_backends.get(), is_default=True)
    steps = _steps(world)
    assert steps["config"][0]
    assert not steps["test"][0]
    assert config.get_absolute_url() in steps["test"][1]

    # A failed test does not count; a succeeded one does.
    AdminJob.objects.create(kind="sandboxes.test_connection", space=world.space_a, status=JobStatus.FAILED)
    assert not _steps(world)["test"][0]
    AdminJob.objects.create(kind="sandboxes.test_connection", space=world.space_a, status=JobStatus.SUCCEEDED)
    assert _steps(world)["test"][0]

    # A ready generation with a skill in it.
    SkillImage.objects.create(
        space=world.space_a, config=config, generation=1, status=SkillImageStatus.FAILED, manifest=[{"name": "x"}]
    )
    assert not _steps(world)["skill"][0]
    SkillImage.objects.create(
        space=world.space_a,
        config=config,
        generation=2,
        snapshot_id="snap-000000000002",
        fingerprint=config_fingerprint(config),
        status=SkillImageStatus.READY,
        manifest=[{"name": "hello"}],
    )
    assert _steps(world)["skill"][0]

    session = Session.objects.create(space=world.space_a, key="first", config=config, sandbox_id="abc")
    steps = _steps(world)
    assert steps["session"][0]
    assert not steps["terminal"][0]
    assert reverse("sandboxes:terminal_page", kwargs={"session_id": session.id}) in steps["terminal"][1]

    terminal = Terminal.objects.create(session=session, user=world.alice)  # asked for, never opened
    assert not _steps(world)["terminal"][0]
    from django.utils import timezone

    Terminal.objects.filter(pk=terminal.pk).update(opened=timezone.now())
    steps = _steps(world)
    assert all(done for done, _ in steps.values())
    page = world.client_for("alice").get(reverse("console:dashboard")).content.decode()
    assert "5 of 5 done" in page
    assert "<details open" not in page  # folded once everything is done


def test_state_of_another_space_does_not_count(world: World) -> None:
    make_config(world.space_b, is_default=True)  # charlie's space
    assert not _steps(world)["config"][0]
    assert _steps(world, "charlie")["config"][0]


def test_no_path_for_who_administers_nothing(world: World) -> None:
    page = world.client_for("bob").get(reverse("console:dashboard")).content.decode()  # a member of A
    assert 'id="getting-started"' not in page


def test_platform_admin_without_backends_is_sent_to_register_one(world: World) -> None:
    steps = _steps(world, "root")
    assert reverse("sandboxes:backend_create") in steps["config"][1]


def test_platform_admin_with_an_ungranted_backend_is_offered_to_grant_it(world: World) -> None:
    backend = make_backend(name="Local Docker")  # registered (as `make start` does), granted to no space
    steps = _steps(world, "root")
    assert not steps["config"][0]
    assert reverse("sandboxes:backend_edit", kwargs={"backend_id": backend.id}) + "#id_spaces" in steps["config"][1]
    assert "Grant Local Docker to a space" in steps["config"][1]
    assert reverse("sandboxes:backend_create") not in steps["config"][1]
