"""Skill image pages and services without a backend: personas, pointers, refusals.

Generations here are rows written the way a finished build writes them (a ready row plus the
pointer through `do_set_session_image`); the builds themselves are in test_install.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError
from django.urls import reverse

from console.crypto import encrypt
from console.models import AdminJob
from console.services import SYSTEM, ServiceError
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.catalog.services import do_set_session_image
from sandboxes.models import PlatformBackend, SandboxConfig
from skills.images import current_image
from skills.install.plan import package_sources
from skills.install.start import do_start_install
from skills.install.steps import StepFailed
from skills.models import SkillImage, SkillImageItem, SkillImageStatus, SkillVersion
from skills.services import do_delete_skill_version, spaces_with_skill
from tests.factories import make_config
from tests.personas import World
from tests.support.skills import make_version

pytestmark = pytest.mark.django_db


def ready_generation(
    config: SandboxConfig, version: SkillVersion, generation: int, *, point: bool = True
) -> SkillImage:
    image = SkillImage.objects.create(
        space=config.space,
        config=config,
        generation=generation,
        snapshot_id=f"snap-{generation:012d}",
        fingerprint=config_fingerprint(config),
        status=SkillImageStatus.READY,
        manifest=[
            {
                "name": version.skill.name,
                "version_id": str(version.id),
                "content_hash": version.content_hash,
                "size": version.size,
                "file_count": version.file_count,
                "dependencies": {"pip": ["tinydep>=1"], "npm": [], "debian": []},
                "installed": ["tinydep-1.0"],
                "verified_by": "default checks",
            }
        ],
        timings={"create": 0.5, "copy": 0.1},
        created_by_name="alice",
    )
    SkillImageItem.objects.create(
        image=image, skill=version.skill, version=version, name=version.skill.name, content_hash=version.content_hash
    )
    if point:
        do_set_session_image(
            config.space,
            config,
            snapshot_id=image.snapshot_id,
            fingerprint=image.fingerprint,
            label=f"generation {generation}",
            actor=SYSTEM,
        )
    return image


@pytest.fixture
def setup(world: World) -> tuple[SandboxConfig, SkillVersion, SkillImage, SkillImage]:
    config: SandboxConfig = make_config(world.space_a, name="main", is_default=True)
    version = make_version("pdf-tools")
    first = ready_generation(config, version, 1)
    second = ready_generation(config, version, 2)
    return config, version, first, second


def image_url(world: World) -> str:
    return reverse("skills:image_detail", kwargs={"space_id": world.space_a.id})


# --- Personas --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("persona", "status"), [("alice", 200), ("bob", 200), ("carol", 200), ("root", 200), ("charlie", 404)]
)
def test_image_page_by_persona(world: World, setup: Any, persona: str, status: int) -> None:
    assert world.client_for(persona).get(image_url(world)).status_code == status


def test_anonymous_is_sent_to_login(world: World, setup: Any) -> None:
    response = world.client_for("anonymous").get(image_url(world))
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_admin_sees_actions_and_viewers_read_only(world: World, setup: Any) -> None:
    _, _, first, second = setup
    admin_page = world.client_for("alice").get(image_url(world)).content.decode()
    assert 'id="install"' in admin_page
    assert "Uninstall…" in admin_page
    assert reverse("skills:image_rollback", kwargs={"space_id": world.space_a.id, "image_id": first.id}) in admin_page
    assert "Delete old snapshots…" in admin_page
    assert "/opt/skills/pdf-tools" in admin_page
    assert "tinydep-1.0" in admin_page
    assert second.snapshot_id in admin_page
    for persona in ("bob", "carol"):
        page = world.client_for(persona).get(image_url(world)).content.decode()
        assert 'id="read-only"' in page
        assert 'id="install"' not in page
        assert "Roll back…" not in page
        assert "Uninstall…" not in page
        assert "/opt/skills/pdf-tools" in page


WRITE_URLS = ("image_install", "image_uninstall", "image_cleanup")


@pytest.mark.parametrize("name", WRITE_URLS)
@pytest.mark.parametrize(("persona", "status"), [("bob", 403), ("carol", 403), ("charlie", 404)])
def test_writes_are_for_space_admins(world: World, setup: Any, name: str, persona: str, status: int) -> None:
    config, version, _, _ = setup
    url = reverse(f"skills:{name}", kwargs={"space_id": world.space_a.id})
    data = {"config": str(config.id), "version": str(version.id), "skill": "pdf-tools"}
    assert world.client_for(persona).post(url, data).status_code == status
    assert not AdminJob.objects.filter(kind__startswith="skills.").exists()


@pytest.mark.parametrize(("persona", "status"), [("bob", 403), ("carol", 403), ("charlie", 404)])
def test_rollback_is_for_space_admins(world: World, setup: Any, persona: str, status: int) -> None:
    _, _, first, second = setup
    url = reverse("skills:image_rollback", kwargs={"space_id": world.space_a.id, "image_id": first.id})
    assert world.client_for(persona).post(url).status_code == status
    assert world.client_for(persona).get(url).status_code == status
    assert current_image(world.space_a, first.config) == second


def test_admin_install_starts_a_job(world: World, setup: Any) -> None:
    config, _, _, _ = setup
    other = make_version("csv-tools")
    url = reverse("skills:image_install", kwargs={"space_id": world.space_a.id})
    response = world.client_for("alice").post(url, {"config": str(config.id), "version": str(other.id)})
    job = AdminJob.objects.get(kind="skills.install")
    assert response.status_code == 302
    assert response["Location"] == job.get_absolute_url()
    assert job.params == {
        "space_id": str(world.space_a.id),
        "config_id": str(config.id),
        "skill_version_id": str(other.id),
    }
    assert job.space == world.space_a


def test_installing_what_is_current_is_refused(world: World, setup: Any) -> None:
    config, version, _, _ = setup
    url = reverse("skills:image_install", kwargs={"space_id": world.space_a.id})
    response = world.client_for("alice").post(url, {"config": str(config.id), "version": str(version.id)}, follow=True)
    assert "already installed" in response.content.decode()
    assert not AdminJob.objects.exists()


def test_a_config_of_another_space_is_not_found(world: World, setup: Any) -> None:
    _, version, _, _ = setup
    foreign = make_config(world.space_b, name="theirs")
    url = reverse("skills:image_install", kwargs={"space_id": world.space_a.id})
    assert (
        world.client_for("alice").post(url, {"config": str(foreign.id), "version": str(version.id)}).status_code == 404
    )
    with pytest.raises(ServiceError):
        do_start_install(world.space_a, foreign, version, actor=SYSTEM)


def test_admin_uninstall_confirms_then_starts_a_job(world: World, setup: Any) -> None:
    config, _, _, _ = setup
    url = reverse("skills:image_uninstall", kwargs={"space_id": world.space_a.id})
    client = world.client_for("alice")
    page = client.get(url, {"config": str(config.id), "skill": "pdf-tools"}).content.decode()
    assert "Uninstall" in page
    assert "stale" in page
    assert client.get(url, {"config": str(config.id), "skill": "nope"}).status_code == 404
    response = client.post(url, {"config": str(config.id), "skill": "pdf-tools"})
    job = AdminJob.objects.get(kind="skills.uninstall")
    assert response["Location"] == job.get_absolute_url()
    assert job.params["skill_name"] == "pdf-tools"


def test_cleanup_confirmation_lists_what_would_go(world: World, setup: Any) -> None:
    config, _, first, _ = setup
    url = reverse("skills:image_cleanup", kwargs={"space_id": world.space_a.id})
    page = world.client_for("alice").get(url, {"config": str(config.id)}).content.decode()
    assert f"Generation {first.generation} ({first.snapshot_id})" in page
    assert "no session uses it" not in page  # shown as the outcome instead
    assert "deleted, it becomes retired" in page


def test_fingerprint_mismatch_is_explained_on_the_page(world: World, setup: Any) -> None:
    config, _, _, _ = setup
    PlatformBackend.objects.filter(pk=config.backend_id).update(api_key_encrypted=encrypt("another-account"))
    page = world.client_for("carol").get(image_url(world)).content.decode()
    assert 'id="fingerprint-mismatch"' in page
    assert "sessions fall back to the base template" in page
    admin_page = world.client_for("alice").get(image_url(world)).content.decode()
    assert "Roll back…" not in admin_page  # no generation belongs to the new account


# --- Catalog links -----------------------------------------------------------------------


def test_skill_pages_link_to_the_spaces_holding_the_skill(world: World, setup: Any) -> None:
    _, version, _, _ = setup
    link = reverse("skills:image_detail", kwargs={"space_id": world.space_a.id})
    assert link in world.client_for("bob").get(reverse("skills:skill_list")).content.decode()
    assert link in world.client_for("bob").get(version.skill.get_absolute_url()).content.decode()
    # Skills are platform-wide; spaces are not: charlie does not learn of Space A.
    assert "Space A" not in world.client_for("charlie").get(reverse("skills:skill_list")).content.decode()
    found = spaces_with_skill([version.skill_id])
    assert [str(ref) for ref in found[version.skill_id]] == ["Space A"]


def test_install_into_a_space_offers_the_spaces_the_user_administers(world: World, setup: Any) -> None:
    config, version, _, _ = setup
    url = reverse("skills:version_install", kwargs={"version_id": version.id})
    alice = world.client_for("alice").get(url).content.decode()
    assert f'value="{world.space_a.id}:{config.id}"' in alice
    assert "Space B" not in alice
    assert reverse("skills:quick_install") in alice
    assert "administer no space" in world.client_for("carol").get(url).content.decode()


def test_the_image_page_preselects_a_version(world: World, setup: Any) -> None:
    other = make_version("csv-tools")
    page = world.client_for("alice").get(image_url(world), {"version": str(other.id)}).content.decode()
    assert f'<option value="{other.id}" selected' in page


def test_list_queries_stay_bounded_with_images(world: World, setup: Any, django_assert_max_num_queries: Any) -> None:
    for i in range(30):
        make_version(f"bulk-{i:03d}")
    client = world.client_for("bob")
    with django_assert_max_num_queries(6):
        assert client.get(reverse("skills:skill_list")).status_code == 200


# --- Services --------------------------------------------------------------------------------


def test_current_is_derived_from_the_pointer(world: World, setup: Any) -> None:
    config, _, first, second = setup
    assert current_image(world.space_a, config) == second
    assert second.is_current
    assert not first.is_current
    do_set_session_image(
        world.space_a, config, snapshot_id=first.snapshot_id, fingerprint=first.fingerprint, label="", actor=SYSTEM
    )
    assert current_image(world.space_a, config) == first
    assert first.is_current
    assert not second.is_current


def test_no_fingerprint_no_ready_record(world: World, setup: Any) -> None:
    config, _, _, _ = setup
    with pytest.raises(IntegrityError):
        SkillImage.objects.create(
            space=world.space_a, config=config, generation=9, snapshot_id="snap-x", status=SkillImageStatus.READY
        )


def test_a_version_in_a_current_image_cannot_be_deleted(world: World, setup: Any) -> None:
    _, version, _, _ = setup
    with pytest.raises(ServiceError, match="uninstall it there first"):
        do_delete_skill_version(version, actor=SYSTEM)
    response = world.client_for("root").post(
        reverse("skills:version_delete", kwargs={"version_id": version.id}), follow=True
    )
    assert "uninstall it there first" in response.content.decode()
    assert SkillVersion.objects.filter(pk=version.pk).exists()


@pytest.mark.parametrize("name", ["../etc", "a/b", "missing", ".hidden"])
def test_package_folder_must_be_a_folder_under_the_root(world: World, settings: Any, tmp_path: Any, name: str) -> None:
    (tmp_path / "wheels").mkdir()
    settings.SKILL_PACKAGE_SOURCES_ROOT = tmp_path
    config = make_config(world.space_a, pip_find_links=name)
    with pytest.raises(StepFailed, match="not a folder under"):
        package_sources(config)
    PlatformBackend.objects.filter(pk=config.backend_id).update(pip_find_links="wheels")
    config.refresh_from_db()
    assert package_sources(config).pip_folder == (tmp_path / "wheels").resolve()
