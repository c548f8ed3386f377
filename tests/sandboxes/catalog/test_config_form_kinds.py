"""The config form shows only the chosen kind's fields (generated from the settings its adapter declares),
with human labels; without JavaScript it is a two-step form, with HTMX the fields swap; the
template picker (create and edit) lists templates only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from console.models import AuditEvent
from sandboxes.backends import BACKEND_CLASSES, describe
from sandboxes.catalog.forms import SandboxConfigForm
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import make_backend, make_config
from tests.personas import World

pytestmark = pytest.mark.django_db

# Remote kinds point at a closed loopback port: their templates cannot be listed, nothing leaves.
CLOSED = "http://127.0.0.1:9"


def _backend(world: World, kind: str, **extra: Any) -> PlatformBackend:
    values: dict[str, Any] = {"name": f"{kind} backend", "kind": kind}
    schema = describe(kind)
    if schema.setting("endpoint").required:
        values.update(endpoint=CLOSED, allow_private_endpoints=True)
    if schema.takes("domain"):
        values["domain"] = "sandbox.example.com"
    values.update(extra)
    backend: PlatformBackend = make_backend(world.space_a, api_key="k" if schema.takes("api_key") else "", **values)
    return backend


def _field_names(html: str) -> set[str]:
    form = html.split('id="config-form"', 1)[1]
    return set(re.findall(r'name="([a-z_]+)"', form)) - {"csrfmiddlewaretoken", "fields_for", "choose_backend"}


def _labels(html: str) -> dict[str, str]:
    return dict(re.findall(r'<label for="id_([a-z_]+)">([^<]+)</label>', html))


ALWAYS = {"name", "backend", "default_template", "cpus", "memory_mb", "idle_mode", "idle_timeout_s",
          "persistent_workspace", "is_default"}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(BACKEND_CLASSES))
def test_each_kind_gets_its_own_fields(world: World, kind: str) -> None:
    backend = _backend(world, kind, allow_space_api_key=describe(kind).takes("api_key"))
    page = world.client_for("alice").get(reverse("sandboxes:config_create", args=[world.space_a.id]))
    assert page.status_code == 200
    html = page.content.decode()
    description = describe(kind)
    expected = ALWAYS | description.config_names
    assert _field_names(html) == expected
    assert f'data-kind-label="{description.label}"' in html
    labels = _labels(html)
    assert labels["cpus"] == "CPUs"
    assert labels["memory_mb"] == "Memory (MB)"
    assert labels["idle_timeout_s"] == "Idle timeout (seconds)"
    if "protocol_pin" in expected:
        offered = re.findall(r'<option value="([^"]*)"', html.split('name="protocol_pin"', 1)[1].split("</select>")[0])
        assert offered[0] == ""
        assert offered[1:]
        assert all(value.startswith(f"{backend.kind}-") for value in offered[1:])


def test_docker_has_no_remote_fields_and_e2b_no_process_limit(world: World) -> None:
    _backend(world, "docker")
    html = world.client_for("alice").get(reverse("sandboxes:config_create", args=[world.space_a.id])).content.decode()
    assert "api_key" not in _field_names(html)
    assert "protocol_pin" not in _field_names(html)
    assert "pids_limit" in _field_names(html)


def test_own_api_key_only_where_the_platform_allows_it(world: World) -> None:
    _backend(world, "e2b", allow_space_api_key=False)
    html = world.client_for("alice").get(reverse("sandboxes:config_create", args=[world.space_a.id])).content.decode()
    assert "api_key" not in _field_names(html)
    assert "protocol_pin" in _field_names(html)


def _post_data(backend: PlatformBackend, **extra: str) -> dict[str, str]:
    data = {
        "name": "main",
        "backend": str(backend.pk),
        "fields_for": str(backend.pk),
        "default_template": "sandbox-console/base:latest",
        "cpus": "1",
        "memory_mb": "512",
        "pids_limit": "256",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
    }
    data.update(extra)
    return data


def test_two_step_form_without_javascript(world: World) -> None:
    docker = _backend(world, "docker")
    e2b = _backend(world, "e2b")
    client = world.client_for("alice")
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    first = client.get(url).content.decode()
    assert _field_names(first) == {"backend"}  # step 1: the backend alone
    assert "Step 1 of 2" in first
    assert 'name="choose_backend"' in first
    # Step 2 for E2B: its fields, nothing saved.
    second = client.post(url, {"backend": str(e2b.pk), "choose_backend": "1", "name": "typed"})
    assert second.status_code == 200
    html = second.content.decode()
    assert "protocol_pin" in _field_names(html)
    assert "pids_limit" not in _field_names(html)
    assert f'name="fields_for" value="{e2b.pk}"' in html
    assert 'value="typed"' in html  # what was typed is kept
    assert not SandboxConfig.objects.exists()
    # Switching to Docker with the select and posting (no JS): its fields first, no save.
    switched = client.post(url, _post_data(docker, fields_for=str(e2b.pk)))
    assert switched.status_code == 200
    assert "pids_limit" in _field_names(switched.content.decode())
    assert "<noscript>" in switched.content.decode()
    assert not SandboxConfig.objects.exists()
    # Then the save.
    saved = client.post(url, _post_data(docker))
    assert saved.status_code == 302
    config = SandboxConfig.objects.get()
    assert config.backend == docker
    assert config.pids_limit == 256
    assert AuditEvent.objects.filter(action="sandbox_config.create").count() == 1


def test_htmx_swaps_the_fields_on_backend_change(world: World) -> None:
    _backend(world, "docker")
    cube = _backend(world, "cube")
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    response = world.client_for("alice").post(
        url,
        {"backend": str(cube.pk), "choose_backend": "1", "name": "x"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="config-form",
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<div id="config-form">')
    assert "protocol_pin" in _field_names(html)
    assert 'hx-trigger="change from:#id_backend"' in html
    assert not SandboxConfig.objects.exists()


def test_a_posted_field_of_another_kind_is_ignored_and_a_key_refused(world: World) -> None:
    docker = _backend(world, "docker")
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    response = world.client_for("alice").post(url, _post_data(docker, protocol_pin="cube-0.4"))
    assert response.status_code == 302
    config = SandboxConfig.objects.get()
    assert config.protocol_pin == ""
    # A secret posted where no key field is offered is refused, never dropped silently.
    refused = world.client_for("alice").post(url, _post_data(docker, name="other", api_key="sk-x"))
    assert refused.status_code == 400
    assert "sk-x" not in refused.content.decode()
    assert SandboxConfig.objects.count() == 1


def test_a_protocol_of_another_kind_is_refused(world: World) -> None:
    e2b = _backend(world, "e2b")
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    response = world.client_for("alice").post(url, _post_data(e2b, protocol_pin="cube-0.4"))
    assert response.status_code == 400
    assert "protocol_pin" in response.context["form"].errors
    assert not SandboxConfig.objects.exists()


def test_edit_switches_kind_without_saving_then_saves(world: World) -> None:
    e2b = _backend(world, "e2b")
    config = make_config(world.space_a, backend=e2b, name="remote", protocol_pin="e2b-v1")
    docker = _backend(world, "docker")
    client = world.client_for("alice")
    url = reverse("sandboxes:config_edit", args=[config.id])
    assert "protocol_pin" in _field_names(client.get(url).content.decode())
    switched = client.post(url, _post_data(docker, name="remote", fields_for=str(e2b.pk)))
    assert switched.status_code == 200
    assert "pids_limit" in _field_names(switched.content.decode())
    config.refresh_from_db()
    assert config.backend == e2b
    saved = client.post(url, _post_data(docker, name="remote"))
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else ""
    config.refresh_from_db()
    assert config.backend == docker
    assert config.protocol_pin == ""  # Docker speaks no versioned protocol


def test_template_picker_lists_templates_never_snapshots(world: World) -> None:
    docker = _backend(world, "docker")
    form = SandboxConfigForm(
        space=world.space_a, backend=docker, template_choices=["sandbox-console/base:latest", "snap-0123abcd", "tpl-2"]
    )
    choices = [value for value, _ in form.fields["default_template"].choices]  # type: ignore[attr-defined]
    assert choices == ["sandbox-console/base:latest", "tpl-2"]
    # A posted snapshot id is named as such.
    bound = SandboxConfigForm(
        _post_data(docker, default_template="snap-0123abcd"),
        space=world.space_a,
        backend=docker,
        template_choices=["sandbox-console/base:latest", "snap-0123abcd"],
    )
    assert not bound.is_valid()
    assert "are not templates" in bound.errors["default_template"][0]


@pytest.mark.docker
def test_create_offers_the_engine_templates_in_a_picker(world: World, docker_base_image: str) -> None:
    _backend(world, "docker")
    html = world.client_for("alice").get(reverse("sandboxes:config_create", args=[world.space_a.id])).content.decode()
    picker = html.split('name="default_template"', 1)[1].split("</select>", 1)[0]
    options = re.findall(r'<option value="([^"]*)"', picker)
    assert docker_base_image in options
    assert not any(option.startswith("snap-") for option in options)


def test_the_config_page_shows_a_process_limit_only_where_the_kind_enforces_one(world: World) -> None:
    docker = make_config(world.space_a, backend=_backend(world, "docker"), name="local", pids_limit=300)
    remote = make_config(world.space_a, backend=_backend(world, "e2b"), name="remote", pids_limit=300)
    client = world.client_for("alice")
    assert "300 processes" in client.get(docker.get_absolute_url()).content.decode()
    assert (
        "processes" not in client.get(remote.get_absolute_url()).content.decode().split('id="config-resources"')[1][:80]
    )
