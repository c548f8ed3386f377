"""A space's catalog on a shared engine: the platform's templates and its own snapshots and
templates, never another space's or another installation's (real Docker).

Two spaces (A, B) of this installation and a second installation share one engine. Each
test is written to fail on a catalog that lists the engine's whole image store or passes a
posted id straight to the backend.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

from console.models import AdminJob, Space
from console.services import Actor
from sandboxes.backends.base import (
    META_INSTALLATION,
    META_SPACE,
    NetworkSpec,
    RemoteError,
    SandboxSpec,
    TemplateBuildSpec,
)
from sandboxes.catalog.bridge import config_fingerprint, get_backend
from sandboxes.catalog.services import build_template, do_set_session_image
from sandboxes.catalog.templates import load_catalog, owner_labels
from sandboxes.models import SandboxConfig, Session, SessionImage
from sandboxes.sessions.provisioning import effective_template
from skills.install.build import take_snapshot
from skills.models import SkillImage, SkillImageStatus
from tests.factories import make_config
from tests.personas import World, build_world

pytestmark = [pytest.mark.django_db, pytest.mark.docker]


@dataclass
class Engine:
    config_a: SandboxConfig
    config_b: SandboxConfig
    snap_a: str
    snap_a_spare: str
    snap_b: str
    snap_other_installation: str
    template_b: str
    template_platform: str
    template_other_installation: str


def _snapshot(config: SandboxConfig, sandbox_id: str, labels: dict[str, str]) -> str:
    backend = get_backend(config)
    snapshots = backend.snapshots()
    assert snapshots is not None
    return snapshots.create(sandbox_id, name="pytest-catalog", labels=labels).snapshot_id


@contextlib.contextmanager
def _made_on_engine(
    config_a: SandboxConfig, config_b: SandboxConfig, docker_base_image: str, test_run_id: str
) -> Iterator[Engine]:
    """One sandbox, four snapshots and three templates of the two configs; deleted at the end."""
    run = {"test-run": test_run_id}
    suffix = uuid.uuid4().hex[:8]
    backend = get_backend(config_a)
    sandbox = backend.create(
        SandboxSpec(
            template_id=docker_base_image,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata=run,
        )
    ).sandbox_id
    made: list[str] = []
    try:
        snap_a = _snapshot(config_a, sandbox, {**owner_labels(config_a), **run})
        made.append(snap_a)
        snap_a_spare = _snapshot(config_a, sandbox, {**owner_labels(config_a), **run})
        made.append(snap_a_spare)
        snap_b = _snapshot(config_b, sandbox, {**owner_labels(config_b), **run})
        made.append(snap_b)
        template_b = build_template(
            config_b,
            TemplateBuildSpec(
                name=f"{test_run_id}-{suffix}-b", base_template_id=docker_base_image, script="true", labels=run
            ),
        )
        made.append(template_b)
        backend = get_backend(config_a)
        templates = backend.templates()
        assert templates is not None
        # Built outside any space (as the platform does): a platform template.
        template_platform = templates.create(
            TemplateBuildSpec(
                name=f"{test_run_id}-{suffix}-p", base_template_id=docker_base_image, script="true", labels=run
            )
        ).template_id
        made.append(template_platform)
        # The same space id under another installation of the console on this engine.
        with override_settings(CONSOLE_INSTALLATION_ID=f"{settings.CONSOLE_INSTALLATION_ID}-other"):
            snap_other = _snapshot(config_a, sandbox, {**owner_labels(config_a), **run})
            made.append(snap_other)
            template_other = build_template(
                config_a,
                TemplateBuildSpec(
                    name=f"{test_run_id}-{suffix}-o", base_template_id=docker_base_image, script="true", labels=run
                ),
            )
            made.append(template_other)
        yield Engine(
            config_a, config_b, snap_a, snap_a_spare, snap_b, snap_other, template_b, template_platform, template_other
        )
    finally:
        backend = get_backend(config_a)
        backend.delete(sandbox)
        snapshots, templates = backend.snapshots(), backend.templates()
        assert snapshots is not None
        assert templates is not None
        for item in reversed(made):
            with contextlib.suppress(RemoteError):
                (snapshots if item.startswith("snap-") else templates).delete(item)


@dataclass
class Shared:
    world: World
    engine: Engine


@pytest.fixture(scope="module")
def shared(django_db_setup: None, django_db_blocker: Any, docker_base_image: str, test_run_id: str) -> Iterator[Shared]:
    """The personas, both configs and the engine's images, made once for the module.

    The rows live in a transaction that each test's own transaction nests in as a savepoint
    and that is rolled back after the last test (as Django's TestCase.setUpTestData); the
    images are deleted then. A test that deletes any of them takes `own_engine` instead.
    """
    with django_db_blocker.unblock(), transaction.atomic():
        world = build_world()
        config_a = make_config(world.space_a, name="a", default_template=docker_base_image)
        config_b = make_config(world.space_b, name="b", default_template=docker_base_image)
        with _made_on_engine(config_a, config_b, docker_base_image, test_run_id) as engine:
            yield Shared(world, engine)
        transaction.set_rollback(True)


@pytest.fixture
def world(shared: Shared, db: None) -> World:
    """The module's personas, read afresh: no test sees another's changes to the objects."""
    users = get_user_model().objects.in_bulk(
        [getattr(shared.world, name).pk for name in ("alice", "bob", "carol", "charlie", "root")]
    )
    spaces = Space.objects.in_bulk([shared.world.space_a.pk, shared.world.space_b.pk])
    return World(
        spaces[shared.world.space_a.pk],
        spaces[shared.world.space_b.pk],
        *(users[getattr(shared.world, name).pk] for name in ("alice", "bob", "carol", "charlie", "root")),
    )


@pytest.fixture
def engine(shared: Shared, world: World) -> Engine:
    """The module's snapshots and templates, for tests that only read them."""
    configs = SandboxConfig.objects.in_bulk([shared.engine.config_a.pk, shared.engine.config_b.pk])
    return replace(
        shared.engine, config_a=configs[shared.engine.config_a.pk], config_b=configs[shared.engine.config_b.pk]
    )


@pytest.fixture
def own_engine(engine: Engine, docker_base_image: str, test_run_id: str) -> Iterator[Engine]:
    """Snapshots and templates of the same configs made for one test, which deletes some."""
    with _made_on_engine(engine.config_a, engine.config_b, docker_base_image, test_run_id) as own:
        yield own


def _on_engine(config: SandboxConfig) -> tuple[set[str], set[str]]:
    backend = get_backend(config)
    snapshots, templates = backend.snapshots(), backend.templates()
    assert snapshots is not None
    assert templates is not None
    return {s.snapshot_id for s in snapshots.list()}, {t.template_id for t in templates.list()}


def test_each_space_lists_the_platform_templates_and_only_its_own_snapshots_and_templates(
    world: World, engine: Engine
) -> None:
    page_a = world.client_for("alice").get(reverse("sandboxes:template_list", args=[engine.config_a.id]))
    body_a = page_a.content.decode()
    assert {engine.snap_a, engine.snap_a_spare} <= {s.snapshot_id for s in page_a.context["catalog"].snapshots}
    assert engine.snap_b not in body_a
    assert engine.snap_other_installation not in body_a
    assert engine.template_b not in body_a
    assert engine.template_other_installation not in body_a
    assert engine.template_platform in body_a
    assert engine.config_a.default_template in body_a
    body_b = world.client_for("charlie").get(reverse("sandboxes:template_list", args=[engine.config_b.id])).content
    assert engine.snap_b in body_b.decode()
    assert engine.template_b in body_b.decode()
    assert engine.snap_a not in body_b.decode()
    assert engine.snap_other_installation not in body_b.decode()
    # The pickers offer the same: never another space's template.
    form = world.client_for("alice").get(reverse("sandboxes:config_edit", args=[engine.config_a.id])).context["form"]
    choices = {value for value, _ in form.fields["default_template"].choices}
    assert engine.template_platform in choices
    assert engine.template_b not in choices


def test_forged_deletes_of_another_tenants_snapshots_and_templates_are_404_and_keep_them(
    world: World, own_engine: Engine
) -> None:
    engine = own_engine
    alice = world.client_for("alice")
    snapshot_url = reverse("sandboxes:snapshot_delete", args=[engine.config_a.id])
    template_url = reverse("sandboxes:template_delete", args=[engine.config_a.id])
    for foreign in (engine.snap_b, engine.snap_other_installation):
        assert alice.get(snapshot_url, {"id": foreign}).status_code == 404
        assert alice.post(snapshot_url, {"id": foreign}).status_code == 404
        assert alice.post(snapshot_url, {"id": foreign, "force": "1"}).status_code in (403, 404)
    for foreign in (engine.template_b, engine.template_other_installation):
        assert alice.get(template_url, {"id": foreign}).status_code == 404
        assert alice.post(template_url, {"id": foreign}).status_code == 404
    # Through the other space's config: the space check answers first.
    assert (
        alice.post(reverse("sandboxes:snapshot_delete", args=[engine.config_b.id]), {"id": engine.snap_b}).status_code
        == 404
    )
    # A platform template: visible, but only platform admins delete it.
    assert alice.get(template_url, {"id": engine.template_platform}).status_code == 403
    assert alice.post(template_url, {"id": engine.template_platform}).status_code == 403
    snapshots, templates = _on_engine(engine.config_a)
    assert {engine.snap_b, engine.snap_other_installation} <= snapshots
    assert {engine.template_b, engine.template_platform, engine.template_other_installation} <= templates
    # Its own: deleted.
    assert alice.post(snapshot_url, {"id": engine.snap_a_spare}).status_code == 302
    charlie = world.client_for("charlie")
    template_url_b = reverse("sandboxes:template_delete", args=[engine.config_b.id])
    assert charlie.post(template_url_b, {"id": engine.template_b}).status_code == 302
    assert world.client_for("root").post(template_url, {"id": engine.template_platform}).status_code == 302
    snapshots, templates = _on_engine(engine.config_a)
    assert engine.snap_a_spare not in snapshots
    assert engine.template_b not in templates
    assert engine.template_platform not in templates


def test_a_snapshot_in_use_says_by_what_and_a_forced_delete_really_falls_back(world: World, own_engine: Engine) -> None:
    engine = own_engine
    config = engine.config_a
    fingerprint = config_fingerprint(config)
    do_set_session_image(
        world.space_a, config, snapshot_id=engine.snap_a, fingerprint=fingerprint, label="skills g1", actor=Actor()
    )
    generation = SkillImage.objects.create(
        space=world.space_a,
        config=config,
        generation=1,
        snapshot_id=engine.snap_a,
        fingerprint=fingerprint,
        status=SkillImageStatus.READY,
    )
    url = reverse("sandboxes:snapshot_delete", args=[config.id])
    alice = world.client_for("alice")
    listing = alice.get(reverse("sandboxes:template_list", args=[config.id])).content.decode()
    assert "skill image generation 1 on config a" in listing
    confirm = alice.get(url, {"id": engine.snap_a}).content.decode()
    assert "the current skill image of config a" in confirm
    assert 'id="delete-blocked"' in confirm
    response = alice.post(url, {"id": engine.snap_a}, follow=True)
    assert "is still used by the current skill image of config a" in response.content.decode()
    assert alice.post(url, {"id": engine.snap_a, "force": "1"}).status_code == 403
    assert engine.snap_a in _on_engine(config)[0]
    assert effective_template(world.space_a, config).template_id == engine.snap_a
    # A platform admin forces it: the skill image falls back to the default template, and says so.
    root = world.client_for("root")
    assert 'name="force" value="1"' in root.get(url, {"id": engine.snap_a}).content.decode()
    assert root.post(url, {"id": engine.snap_a, "force": "1"}).status_code == 302
    assert engine.snap_a not in _on_engine(config)[0]
    assert not SessionImage.objects.filter(config=config).exists()
    assert effective_template(world.space_a, config).template_id == config.default_template
    generation.refresh_from_db()
    assert generation.status == SkillImageStatus.RETIRED
    page = alice.get(reverse("skills:image_detail", args=[world.space_a.id]) + f"?config={config.id}").content.decode()
    assert "deleted by a platform admin" in page
    assert config.default_template in page


def test_a_snapshot_a_live_session_runs_from_cannot_be_deleted(world: World, engine: Engine) -> None:
    Session.objects.create(
        space=world.space_a, config=engine.config_a, key="busy", template_id=engine.snap_a_spare, sandbox_id="abc"
    )
    url = reverse("sandboxes:snapshot_delete", args=[engine.config_a.id])
    response = world.client_for("alice").post(url, {"id": engine.snap_a_spare}, follow=True)
    assert "is still used by live session busy" in response.content.decode()
    assert engine.snap_a_spare in _on_engine(engine.config_a)[0]


def test_skill_image_snapshots_carry_the_installation_and_the_space(
    world: World, engine: Engine, docker_base_image: str, test_run_id: str
) -> None:
    config = engine.config_b
    image = SkillImage.objects.create(space=world.space_b, config=config, generation=7)
    backend = get_backend(config)
    sandbox = backend.create(
        SandboxSpec(
            template_id=docker_base_image,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={"test-run": test_run_id},
        )
    ).sandbox_id
    try:
        snapshot_id = take_snapshot(backend, sandbox, config, image)
    finally:
        backend.delete(sandbox)
    try:
        listed_b = load_catalog(config).snapshots
        assert snapshot_id in {s.snapshot_id for s in listed_b}
        assert snapshot_id not in {s.snapshot_id for s in load_catalog(engine.config_a).snapshots}
        labels = next(s.labels for s in listed_b if s.snapshot_id == snapshot_id)
        assert labels[META_SPACE] == str(world.space_b.id)
        assert labels[META_INSTALLATION] == settings.CONSOLE_INSTALLATION_ID
    finally:
        backend = get_backend(config)
        snapshots = backend.snapshots()
        assert snapshots is not None
        snapshots.delete(snapshot_id)


def test_only_platform_admins_build_platform_templates(world: World, engine: Engine) -> None:
    url = reverse("sandboxes:template_build", args=[engine.config_a.id])
    data = {"name": "forged", "base_template_id": engine.config_a.default_template, "script": "true"}
    alice = world.client_for("alice")
    assert "platform_template" not in alice.get(url).context["form"].fields
    assert alice.post(url, {**data, "platform_template": "on"}).status_code == 302
    assert AdminJob.objects.get(params__name="forged").params["platform_template"] is False
    root = world.client_for("root")
    assert "platform_template" in root.get(url).context["form"].fields
    assert root.post(url, {**data, "name": "shared", "platform_template": "on"}).status_code == 302
    assert AdminJob.objects.get(params__name="shared").params["platform_template"] is True


def test_another_spaces_template_cannot_become_a_default_template(world: World, engine: Engine) -> None:
    alice = world.client_for("alice")
    data = {
        "name": "sneaky",
        "backend": str(engine.config_a.backend_id),
        "default_template": engine.template_b,
        "cpus": "1",
        "memory_mb": "256",
        "pids_limit": "128",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
    }
    response = alice.post(reverse("sandboxes:config_create", args=[world.space_a.id]), data)
    assert response.status_code == 400
    assert "default_template" in response.context["form"].errors
    assert not SandboxConfig.objects.filter(name="sneaky").exists()
    ok = {**data, "default_template": engine.template_platform}
    assert alice.post(reverse("sandboxes:config_create", args=[world.space_a.id]), ok).status_code == 302


def _image_id(config: SandboxConfig, reference: str) -> str:
    backend = get_backend(config)
    return str(backend.api.inspect_image(reference)["Id"])  # type: ignore[attr-defined]


def test_another_tenants_image_cannot_be_named_by_another_reference(world: World, engine: Engine) -> None:
    """The same image under another name: untagged repository, full or short image id, or
    a snapshot's image id without the snap- prefix. Each is another tenant's image."""
    alice = world.client_for("alice")
    snap_b_image = _image_id(engine.config_b, engine.snap_b.removeprefix("snap-"))
    template_b_image = _image_id(engine.config_b, engine.template_b)
    aliases = [
        engine.template_b.removesuffix(":latest"),
        template_b_image,
        template_b_image.removeprefix("sha256:")[:12],
        engine.template_other_installation.removesuffix(":latest"),
    ]
    base = {
        "backend": str(engine.config_a.backend_id),
        "cpus": "1",
        "memory_mb": "256",
        "pids_limit": "128",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
    }
    for n, alias in enumerate(aliases):
        response = alice.post(
            reverse("sandboxes:config_create", args=[world.space_a.id]),
            {**base, "name": f"alias{n}", "default_template": alias},
        )
        assert response.status_code == 400, alias
        assert "default_template" in response.context["form"].errors, alias
    assert not SandboxConfig.objects.filter(name__startswith="alias").exists()
    # A snapshot by its bare image id is no template: no sandbox starts from it (a snapshot
    # starts by its snap- id only, which the catalog checks).
    for alias in (snap_b_image, snap_b_image.removeprefix("sha256:")[:12]):
        backend = get_backend(engine.config_a)
        with pytest.raises(RemoteError, match="not found"):
            backend.create(
                SandboxSpec(
                    template_id=alias,
                    network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
                    metadata={"test-run": "alias"},
                )
            )


def test_a_snapshot_an_install_just_took_cannot_be_deleted_before_the_install_records_it(
    world: World, engine: Engine, docker_base_image: str, test_run_id: str
) -> None:
    """Between its snapshot step and its record step an install's snapshot is listed as the
    space's own, and no generation names it yet: deleting it then would leave the install to
    record a snapshot that is gone (the next session: snapshot not found)."""
    config = engine.config_a
    image = SkillImage.objects.create(
        space=world.space_a, config=config, generation=3, status=SkillImageStatus.BUILDING
    )
    backend = get_backend(config)
    sandbox = backend.create(
        SandboxSpec(
            template_id=docker_base_image,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={"test-run": test_run_id},
        )
    ).sandbox_id
    try:
        snapshot_id = take_snapshot(backend, sandbox, config, image)
    finally:
        backend.delete(sandbox)
    try:
        url = reverse("sandboxes:snapshot_delete", args=[config.id])
        alice = world.client_for("alice")
        assert "generation 3 (building)" in alice.get(url, {"id": snapshot_id}).content.decode()
        response = alice.post(url, {"id": snapshot_id}, follow=True)
        assert "is still used by" in response.content.decode()
        assert snapshot_id in _on_engine(config)[0]
    finally:
        backend = get_backend(config)
        snapshots = backend.snapshots()
        assert snapshots is not None
        snapshots.delete(snapshot_id)


def test_a_name_another_tenant_took_over_never_starts_a_sandbox_of_this_space(
    world: World, engine: Engine, docker_base_image: str, test_run_id: str
) -> None:
    """Space A's config names a template that is gone (deleted by the platform, or not built
    yet); space B then builds a template of that name. A's sessions must not start from B's
    image (B's code in A's sandboxes), though the name is the same."""
    from sandboxes.catalog.bridge import console_metadata

    name = f"{test_run_id}-{uuid.uuid4().hex[:8]}-taken"
    taken = build_template(
        engine.config_b,
        TemplateBuildSpec(
            name=name, base_template_id=docker_base_image, script="true", labels={"test-run": test_run_id}
        ),
    )
    try:
        spec = SandboxSpec(
            template_id=taken,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={**console_metadata(engine.config_a), "test-run": test_run_id},
        )
        backend = get_backend(engine.config_a)
        with pytest.raises(RemoteError, match="not found"):
            backend.delete(backend.create(spec).sandbox_id)
        # B's own sessions start from it, and A's from the platform's templates and its own.
        backend = get_backend(engine.config_b)
        backend.delete(backend.create(replace(spec, metadata=console_metadata(engine.config_b))).sandbox_id)
        backend = get_backend(engine.config_a)
        for template in (engine.template_platform, engine.snap_a):
            backend.delete(backend.create(replace(spec, template_id=template)).sandbox_id)
    finally:
        backend = get_backend(engine.config_b)
        templates = backend.templates()
        assert templates is not None
        templates.delete(taken)
