"""Templates on a backend that keeps no labels (Cube, through the fake): whose build a
template is comes from the console's own records, not from labels.

One Cube account is granted to spaces A and B. Space A builds a template (the build job);
a platform admin builds a platform template. Each test is written to fail on a catalog
that takes every unlabelled template for the platform's.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.urls import reverse

from console.jobs import run_job, start_job
from console.models import AdminJob, JobStatus
from console.services import Actor
from sandboxes.backends.base import RemoteError
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.templates import load_catalog
from sandboxes.models import PlatformBackend, SandboxConfig, TemplateRecord
from tests.factories import make_backend, make_config
from tests.fakes.fixtures import FakeHandle
from tests.personas import World

pytestmark = [pytest.mark.django_db, pytest.mark.cube, pytest.mark.docker]


@dataclass
class Account:
    backend: PlatformBackend
    config_a: SandboxConfig
    config_b: SandboxConfig
    template_a: str
    template_platform: str


def _build(config: SandboxConfig, user: Any, name: str, image: str, *, platform: bool = False) -> str:
    """Through the build job, as the template page starts it (run here, not in a thread)."""
    job = start_job(
        "sandboxes.build_template",
        actor=Actor(user=user),
        space=config.space,
        params={"config_id": str(config.id), "name": name, "base_template_id": image, "platform_template": platform},
    )
    run_job(str(job.id))
    job = AdminJob.objects.get(pk=job.pk)
    assert job.status == JobStatus.SUCCEEDED, job.error
    return str(job.result["template_id"])


def _on_account(config: SandboxConfig) -> set[str]:
    backend = get_backend(config)
    templates = backend.templates()
    assert templates is not None
    return {t.template_id for t in templates.list()}


@pytest.fixture
def account(world: World, fake_cube: FakeHandle, docker_base_image: str) -> Iterator[Account]:
    backend = make_backend(
        world.space_a,
        world.space_b,
        # envd on loopback: never a DNS lookup of the domain
        **fake_cube.platform_fields(sandbox_url=fake_cube.proxy_url),
    )
    config_a = make_config(world.space_a, backend=backend, name="cube a", default_template="base")
    config_b = make_config(world.space_b, backend=backend, name="cube b", default_template="base")
    suffix = uuid.uuid4().hex[:6]
    made: list[str] = []
    try:
        made.append(_build(config_a, world.alice, f"a-{suffix}", docker_base_image))
        made.append(_build(config_a, world.root, f"p-{suffix}", docker_base_image, platform=True))
        yield Account(backend, config_a, config_b, made[0], made[1])
    finally:
        adapter = get_backend(config_a)
        templates = adapter.templates()
        assert templates is not None
        for template_id in made:
            with contextlib.suppress(RemoteError):
                templates.delete(template_id)


def test_a_spaces_build_is_its_own_and_hidden_from_the_other_space(world: World, account: Account) -> None:
    assert {account.template_a, account.template_platform} <= _on_account(account.config_b)  # one account
    page_b = world.client_for("charlie").get(reverse("sandboxes:template_list", args=[account.config_b.id]))
    listed_b = {t.template_id for t in page_b.context["catalog"].templates}
    assert account.template_a not in listed_b
    assert account.template_a not in page_b.content.decode()
    assert account.template_platform in listed_b
    assert account.template_platform not in page_b.context["catalog"].own_templates
    catalog_a = load_catalog(account.config_a)
    assert account.template_a in {t.template_id for t in catalog_a.templates}
    assert catalog_a.own_templates & {account.template_a, account.template_platform} == {account.template_a}
    # B's build pickers never offer A's build either.
    form = world.client_for("charlie").get(reverse("sandboxes:template_build", args=[account.config_b.id]))
    assert account.template_a not in {value for value, _ in form.context["form"].fields["base_template_id"].choices}


def test_another_spaces_build_cannot_be_deleted_nor_confirmed_from_the_other_space(
    world: World, account: Account
) -> None:
    url = reverse("sandboxes:template_delete", args=[account.config_b.id])
    charlie = world.client_for("charlie")
    assert charlie.get(url, {"id": account.template_a}).status_code == 404
    assert charlie.post(url, {"id": account.template_a}).status_code == 404
    assert account.template_a in _on_account(account.config_a)
    # The platform's build is offered to B, but only platform admins delete it.
    assert charlie.post(url, {"id": account.template_platform}).status_code == 403
    assert account.template_platform in _on_account(account.config_a)


def test_a_space_deletes_its_own_build_and_its_record_goes_with_it(world: World, account: Account) -> None:
    url = reverse("sandboxes:template_delete", args=[account.config_a.id])
    alice = world.client_for("alice")
    assert alice.get(url, {"id": account.template_a}).status_code == 200
    assert alice.post(url, {"id": account.template_a}).status_code == 302
    assert account.template_a not in _on_account(account.config_a)
    assert not TemplateRecord.objects.filter(template_id=account.template_a).exists()
    assert alice.post(url, {"id": account.template_platform}).status_code == 403


def test_another_spaces_build_cannot_become_a_default_template(world: World, account: Account) -> None:
    data = {
        "name": "sneaky",
        "backend": str(account.backend.pk),
        "default_template": account.template_a,
        "cpus": "1",
        "memory_mb": "256",
        "pids_limit": "128",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
    }
    charlie = world.client_for("charlie")
    response = charlie.post(reverse("sandboxes:config_create", args=[world.space_b.id]), data)
    assert response.status_code == 400
    assert "default_template" in response.context["form"].errors
    assert not SandboxConfig.objects.filter(name="sneaky").exists()
    edit = reverse("sandboxes:config_edit", args=[account.config_b.id])
    response = charlie.post(edit, {**data, "name": account.config_b.name})
    assert response.status_code == 400
    assert "default_template" in response.context["form"].errors
    account.config_b.refresh_from_db()
    assert account.config_b.default_template == "base"
    # The platform's build is a choice for B, and A's own build for A.
    ok = {**data, "name": "platform default", "default_template": account.template_platform}
    assert charlie.post(reverse("sandboxes:config_create", args=[world.space_b.id]), ok).status_code == 302
    mine = {**data, "name": "own default", "default_template": account.template_a}
    alice = world.client_for("alice")
    assert alice.post(reverse("sandboxes:config_create", args=[world.space_a.id]), mine).status_code == 302
