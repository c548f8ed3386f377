"""The platform's backend form shows only the chosen kind's fields (from the adapters'
KindDescription), with human labels and units, through the same by-kind mechanism as the
config form: without JavaScript a two-step form, with HTMX the fields swap; nothing is saved
until the kind's own fields are posted, and a bad one is a field error with nothing saved."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from console.crypto import decrypt
from console.models import AuditEvent
from sandboxes.backends import BACKEND_CLASSES, describe
from sandboxes.models import PlatformBackend
from sandboxes.pages.forms import KIND_BACKEND_FIELDS
from tests.factories import make_backend
from tests.personas import World

pytestmark = pytest.mark.django_db

CREATE = "sandboxes:backend_create"
ALWAYS = {"name", "kind", "endpoint", "allow_private_endpoints", "pip_index_url", "pip_find_links",
          "npm_registry_url", "max_cpus", "max_memory_mb", "spaces"}  # fmt: skip


def _field_names(html: str) -> set[str]:
    form = html.split('id="backend-form"', 1)[1]
    return set(re.findall(r'name="([a-z_]+)"', form)) - {"csrfmiddlewaretoken", "fields_for", "choose_kind"}


def _labels(html: str) -> dict[str, str]:
    return dict(re.findall(r'<label for="id_([a-z_]+)">([^<]+)</label>', html))


def _e2b(**extra: Any) -> dict[str, Any]:
    data = {
        "name": "cloud",
        "kind": "e2b",
        "fields_for": "e2b",
        "endpoint": "http://127.0.0.1:9",
        "domain": "e2b.example.com",
        "api_key": "e2b_key",
        "allow_private_endpoints": "on",
        "max_cpus": "4",
        "max_memory_mb": "8192",
    }
    data.update(extra)
    return data


def _docker(**extra: Any) -> dict[str, Any]:
    data = {"name": "engine", "kind": "docker", "fields_for": "docker", "endpoint": "", "max_cpus": "2",
            "max_memory_mb": "4096", "max_pids": "512"}  # fmt: skip
    data.update(extra)
    return data


@pytest.mark.parametrize("kind", sorted(BACKEND_CLASSES))
def test_each_kind_gets_its_own_fields_with_human_labels(world: World, kind: str) -> None:
    page = world.client_for("root").get(reverse(CREATE), {"kind": kind})
    assert page.status_code == 200
    html = page.content.decode()
    description = describe(kind)
    expected = ALWAYS | {field for field, flag in KIND_BACKEND_FIELDS.items() if getattr(description, flag)}
    assert _field_names(html) == expected
    assert f'data-kind-label="{description.label}"' in html
    assert description.endpoint_rule in html  # the endpoint's help is the kind's own
    labels = _labels(html)
    assert labels["max_memory_mb"] == "Most memory per sandbox (MiB)"
    assert labels["max_cpus"] == "Most CPU cores per sandbox"
    if "domain" in expected:
        assert labels["domain"] == "Sandbox domain"


def test_docker_has_no_remote_fields_and_e2b_no_tls_or_process_limit(world: World) -> None:
    root = world.client_for("root")
    docker = _field_names(root.get(reverse(CREATE), {"kind": "docker"}).content.decode())
    assert {"domain", "sandbox_url", "api_key", "allow_space_api_key", "workspace_host_root"}.isdisjoint(docker)
    assert {"tls_ca", "tls_cert", "tls_key", "max_pids"} <= docker
    e2b = _field_names(root.get(reverse(CREATE), {"kind": "e2b"}).content.decode())
    assert {"tls_ca", "tls_cert", "tls_key", "clear_tls", "max_pids", "workspace_host_root"}.isdisjoint(e2b)
    assert "workspace_host_root" in _field_names(root.get(reverse(CREATE), {"kind": "cube"}).content.decode())


def test_two_step_form_without_javascript(world: World) -> None:
    root = world.client_for("root")
    url = reverse(CREATE)
    first = root.get(url).content.decode()
    assert _field_names(first) == {"kind"}  # step 1: the kind alone
    assert "Step 1 of 2" in first
    assert 'name="choose_kind"' in first
    # Step 2 for E2B: its fields, what was typed kept, nothing saved.
    second = root.post(url, {"kind": "e2b", "choose_kind": "1", "name": "typed", "api_key": "secret-typed"})
    assert second.status_code == 200
    html = second.content.decode()
    assert {"domain", "api_key"} <= _field_names(html)
    assert 'name="fields_for" value="e2b"' in html
    assert 'value="typed"' in html
    assert "secret-typed" not in html  # a typed secret is never rendered back
    assert not PlatformBackend.objects.exists()
    # Switching to Docker with the select and posting (no JS): its fields first, no save.
    switched = root.post(url, {**_docker(name="typed"), "fields_for": "e2b"})
    assert switched.status_code == 200
    switched_html = switched.content.decode()
    assert "tls_cert" in _field_names(switched_html)
    assert "domain" not in _field_names(switched_html)
    assert "<noscript>" in switched_html
    assert not PlatformBackend.objects.exists()
    # Then the save.
    saved = root.post(url, _docker(spaces=[str(world.space_a.id)]))
    assert saved.status_code == 302
    backend = PlatformBackend.objects.get()
    assert (backend.kind, backend.max_pids) == ("docker", 512)
    assert list(backend.spaces.all()) == [world.space_a]
    assert AuditEvent.objects.filter(action="platform_backend.create").count() == 1


def test_htmx_swaps_the_fields_on_kind_change_keeping_what_was_typed(world: World) -> None:
    response = world.client_for("root").post(
        reverse(CREATE),
        {"kind": "cube", "choose_kind": "1", "name": "kept", "spaces": [str(world.space_a.id)]},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="backend-form",
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<div id="backend-form">')
    assert 'hx-trigger="change from:#id_kind"' in html
    assert "workspace_host_root" in _field_names(html)
    assert 'value="kept"' in html
    assert re.search(rf'value="{world.space_a.id}"[^>]*checked', html)  # a granted space stays ticked
    assert not PlatformBackend.objects.exists()


def test_an_e2b_backend_saves_with_its_fields_and_its_key_encrypted(world: World) -> None:
    response = world.client_for("root").post(reverse(CREATE), _e2b(sandbox_url="http://127.0.0.1:9/"))
    assert response.status_code == 302, response.context["form"].errors
    backend = PlatformBackend.objects.get()
    assert (backend.kind, backend.domain, backend.sandbox_url) == ("e2b", "e2b.example.com", "http://127.0.0.1:9/")
    assert decrypt(backend.api_key_encrypted) == "e2b_key"


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (_e2b(domain=""), "domain", "need their sandbox domain"),
        (_e2b(api_key=""), "api_key", "need an API key"),
        (_e2b(endpoint=""), "endpoint", "need their control-plane URL"),
        (_e2b(max_memory_mb="1"), "max_memory_mb", "greater than or equal to 64"),
        (_docker(max_pids="1"), "max_pids", "greater than or equal to 16"),
        (_docker(endpoint="https://docker.example.com"), "endpoint", "A Docker endpoint is empty"),
    ],
)
def test_bad_input_of_the_kinds_fields_is_a_field_error_and_saves_nothing(
    world: World, data: dict[str, Any], field: str, message: str
) -> None:
    response = world.client_for("root").post(reverse(CREATE), data)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(message in error for error in errors.get(field, [])), errors
    assert 'name="fields_for"' in response.content.decode()  # still the kind's step
    assert not PlatformBackend.objects.exists()
    assert not AuditEvent.objects.filter(action="platform_backend.create").exists()


def test_fields_of_another_kind_are_ignored_and_a_secret_refused(world: World) -> None:
    root = world.client_for("root")
    saved = root.post(reverse(CREATE), _docker(domain="evil.example", workspace_host_root="/", sandbox_url="http://x/"))
    assert saved.status_code == 302
    backend = PlatformBackend.objects.get()
    assert (backend.domain, backend.workspace_host_root, backend.sandbox_url) == ("", "", "")
    # A secret posted where the kind takes none is refused, never dropped silently nor echoed.
    refused = root.post(reverse(CREATE), _docker(name="other", api_key="sk-posted"))
    assert refused.status_code == 400
    assert "Docker backends take no API key" in refused.content.decode()
    assert "sk-posted" not in refused.content.decode()
    assert PlatformBackend.objects.count() == 1


def test_a_kind_that_does_not_exist_is_a_field_error(world: World) -> None:
    response = world.client_for("root").post(reverse(CREATE), _docker(kind="vmware", fields_for="vmware"))
    assert response.status_code == 400
    assert "kind" in response.context["form"].errors
    assert not PlatformBackend.objects.exists()


def test_edit_shows_the_backends_kind_then_switches_without_saving(world: World) -> None:
    backend = make_backend(world.space_a, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.com", api_key="e2b_key", allow_private_endpoints=True)  # fmt: skip
    root = world.client_for("root")
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    html = root.get(url).content.decode()
    assert {"domain", "api_key"} <= _field_names(html)
    assert "tls_cert" not in _field_names(html)
    assert 'value="e2b.example.com"' in html
    assert "e2b_key" not in html  # stored: shown as ***
    # To Docker: its fields first (the domain gone), nothing saved.
    switched = root.post(url, {**_docker(name="cloud"), "fields_for": "e2b", "spaces": [str(world.space_a.id)]})
    assert switched.status_code == 200
    assert "domain" not in _field_names(switched.content.decode())
    backend.refresh_from_db()
    assert (backend.kind, backend.domain) == ("e2b", "e2b.example.com")
    # Saved as Docker: the fields Docker does not take are cleared, not left behind.
    saved = root.post(url, {**_docker(name="cloud"), "spaces": [str(world.space_a.id)]})
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else ""
    backend.refresh_from_db()
    assert (backend.kind, backend.domain, backend.max_pids) == ("docker", "", 512)


def test_the_list_shows_a_process_limit_only_where_the_kind_enforces_one(world: World) -> None:
    make_backend(name="engine", max_pids=300)
    make_backend(
        name="cloud", kind="e2b", endpoint="https://api.e2b.example.com", domain="e2b.example.com", max_pids=300
    )
    html = world.client_for("root").get(reverse("sandboxes:backend_list")).content.decode()
    limits = re.findall(r'<td class="backend-limits">([^<]*)</td>', html)
    assert sorted(limits) == ["4.00 CPU, 8192&nbsp;MiB", "4.00 CPU, 8192&nbsp;MiB, 300 processes"]
