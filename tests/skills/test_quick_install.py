"""The one-step skill install: from the skill's card, its install page or the space page, a
version and a target (a space the user administers, one of its configs) start the install job,
whose status HTMX then polls in place. Forged targets are refused and start nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.models import AdminJob
from sandboxes.models import SandboxConfig
from skills.models import SkillVersion
from tests.factories import make_config
from tests.personas import World
from tests.skills.test_image_pages import ready_generation
from tests.support.skills import make_version

pytestmark = pytest.mark.django_db

URL = "/skills/install/"
HTMX = {"HX-Request": "true", "HX-Target": "quick-install-result"}


@pytest.fixture
def setup(world: World) -> tuple[SandboxConfig, SandboxConfig, SkillVersion]:
    main = make_config(world.space_a, name="main", is_default=True)
    spare = make_config(world.space_a, name="spare")
    return main, spare, make_version("pdf-tools")


def target(config: SandboxConfig) -> str:
    return f"{config.space_id}:{config.id}"


def test_the_url_is_the_named_route() -> None:
    assert reverse("skills:quick_install") == URL


def test_an_admin_installs_in_one_post_and_gets_the_job_polling_in_place(world: World, setup: Any) -> None:
    _, spare, version = setup
    answer = world.client_for("alice").post(URL, {"version": str(version.id), "target": target(spare)}, headers=HTMX)
    assert answer.status_code == 200
    job = AdminJob.objects.get(kind="skills.install")
    assert job.params == {
        "space_id": str(world.space_a.id),
        "config_id": str(spare.id),
        "skill_version_id": str(version.id),
    }
    page = answer.content.decode()
    assert "Installing pdf-tools into Space A on spare." in page
    # The job's own status card, polling the job page's HTMX part until the job ends.
    assert 'id="job-status"' in page
    assert f'hx-get="{reverse("console:job_detail", args=[job.id])}"' in page
    assert 'hx-trigger="every 2s"' in page
    polled = world.client_for("alice").get(
        reverse("console:job_detail", args=[job.id]), headers={"HX-Request": "true", "HX-Target": "job-status"}
    )
    assert polled.status_code == 200
    assert 'id="job-status"' in polled.content.decode()


def test_without_javascript_the_post_goes_to_the_job_page(world: World, setup: Any) -> None:
    main, _, version = setup
    answer = world.client_for("alice").post(URL, {"version": str(version.id), "target": target(main)})
    job = AdminJob.objects.get(kind="skills.install")
    assert answer.status_code == 302
    assert answer["Location"] == job.get_absolute_url()


@pytest.mark.parametrize(("persona", "status"), [("bob", 403), ("carol", 403), ("charlie", 404), ("anonymous", 302)])
def test_only_the_space_admins_install(world: World, setup: Any, persona: str, status: int) -> None:
    main, _, version = setup
    answer = world.client_for(persona).post(URL, {"version": str(version.id), "target": target(main)}, headers=HTMX)
    assert answer.status_code == status
    assert not AdminJob.objects.exists()


@pytest.mark.parametrize(
    "forged",
    [
        "{b}:{b_config}",  # another space and its config
        "{a}:{b_config}",  # my space, another space's config
        "not-a-uuid:{a_config}",
        "{a}:not-a-uuid",
        "{a}",
        "",
        "../{a}:{a_config}",
    ],
)
def test_forged_targets_are_refused_and_start_nothing(world: World, setup: Any, forged: str) -> None:
    main, _, version = setup
    theirs = make_config(world.space_b, name="theirs", is_default=True)
    value = forged.format(a=world.space_a.id, a_config=main.id, b=world.space_b.id, b_config=theirs.id)
    answer = world.client_for("alice").post(URL, {"version": str(version.id), "target": value}, headers=HTMX)
    if value.startswith(f"{world.space_a.id}"):
        assert answer.status_code == 200  # my space: said in words, in place
        assert "Choose a sandbox config of Space A" in answer.content.decode()
    else:
        assert answer.status_code == 404
    assert not AdminJob.objects.exists()


def test_a_missing_version_and_a_refused_install_are_said_in_place(world: World, setup: Any) -> None:
    main, _, version = setup
    client = world.client_for("alice")
    missing = client.post(URL, {"version": "nope", "target": target(main)}, headers=HTMX)
    assert "Choose a skill to install" in missing.content.decode()
    ready_generation(main, version, 1)
    again = client.post(URL, {"version": str(version.id), "target": target(main)}, headers=HTMX)
    assert again.status_code == 200
    assert "already installed" in again.content.decode()
    assert 'id="quick-install-error"' in again.content.decode()
    assert not AdminJob.objects.exists()
    # Without JavaScript the same refusal comes back as a message on the install page.
    plain = client.post(URL, {"version": str(version.id), "target": target(main)}, follow=True)
    assert "already installed" in plain.content.decode()
    assert plain.redirect_chain[-1][0] == reverse("skills:version_install", args=[version.id])


def test_the_post_needs_the_csrf_token(world: World, setup: Any) -> None:
    main, _, version = setup
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.alice)
    assert strict.post(URL, {"version": str(version.id), "target": target(main)}).status_code == 403
    assert not AdminJob.objects.exists()


def test_the_card_offers_only_the_spaces_the_user_administers(world: World, setup: Any) -> None:
    main, spare, version = setup
    make_config(world.space_b, name="theirs", is_default=True)
    card = world.client_for("alice").get(version.skill.get_absolute_url()).content.decode()
    assert 'id="quick-install"' in card
    assert f'value="{target(main)}"' in card
    assert f'value="{target(spare)}"' in card
    assert str(world.space_b.id) not in card
    # A member administers nothing: no form.
    assert 'id="quick-install"' not in world.client_for("bob").get(version.skill.get_absolute_url()).content.decode()


def test_the_space_page_offers_its_admins_a_skill_to_install(world: World, setup: Any) -> None:
    main, _, version = setup
    page = world.client_for("alice").get(world.space_a.get_absolute_url()).content.decode()
    assert 'id="install-skill"' in page
    assert f'<option value="{version.id}">' in page
    assert f'value="{target(main)}"' in page
    assert 'id="install-skill"' not in world.client_for("bob").get(world.space_a.get_absolute_url()).content.decode()
