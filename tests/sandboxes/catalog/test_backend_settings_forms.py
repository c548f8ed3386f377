"""The platform-backend and config forms generated from the settings each backend declares:
one field per declared setting (its label, unit and help, a secret as a secret), the
adapter's own validation as field errors with nothing saved, secrets never rendered back and
kept by ***, and rows stored before the settings were declared still loading."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse
from django.utils.html import escape

from console.crypto import decrypt, encrypt
from console.models import AuditEvent
from console.services import encrypted_fields
from sandboxes.backends import BACKEND_CLASSES, all_settings, describe
from sandboxes.backends.e2b.settings import E2BOptions
from sandboxes.backends.settings import Scope, SettingType
from sandboxes.catalog.bridge import backend_config_for, get_backend
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import make_backend, make_config
from tests.personas import World
from tests.support.pem import CERT, CERT_BODY, KEY, KEY_BODY, self_signed

pytestmark = pytest.mark.django_db

CREATE = "sandboxes:backend_create"


def _field(html: str, name: str) -> str:
    """The rendered element of field `name` (input, textarea or select)."""
    match = re.search(rf'<(input|textarea|select)[^>]*name="{name}"[^>]*>(.*?</\1>)?', html, re.S)
    assert match, name
    return match.group(0)


def _tls_docker(world: World) -> PlatformBackend:
    backend: PlatformBackend = make_backend(
        world.space_a, name="tls engine", endpoint="tcp://127.0.0.1:9", allow_private_endpoints=True
    )
    backend.tls_ca_encrypted = encrypt(CERT + "\n")
    backend.tls_cert_encrypted = encrypt(CERT + "\n")
    backend.tls_key_encrypted = encrypt(KEY + "\n")
    backend.save()
    return backend


def _docker_post(**extra: Any) -> dict[str, Any]:
    data = {"name": "tls engine", "kind": "docker", "fields_for": "docker", "endpoint": "tcp://127.0.0.1:9",
            "allow_private_endpoints": "on", "max_cpus": "2", "max_memory_mb": "4096", "max_pids": "512"}  # fmt: skip
    data.update(extra)
    return data


@pytest.mark.parametrize("kind", sorted(BACKEND_CLASSES))
def test_the_backend_form_has_one_field_per_declared_setting_with_its_label_unit_and_help(
    world: World, kind: str
) -> None:
    html = world.client_for("root").get(reverse(CREATE), {"kind": kind}).content.decode()
    for setting in describe(kind).of(Scope.BACKEND):
        element = _field(html, setting.name)
        assert f'<label for="id_{setting.name}">{setting.label_with_unit}</label>' in html
        assert escape(setting.help) in html
        if setting.secret:
            assert element.startswith("<textarea" if setting.type == SettingType.PEM else '<input type="password"')
        elif setting.type == SettingType.INT:
            assert 'type="number"' in element
            assert f'min="{setting.minimum}"' in element


@pytest.mark.parametrize("kind", sorted(BACKEND_CLASSES))
def test_the_config_form_has_one_field_per_declared_config_setting(world: World, kind: str) -> None:
    backend = make_backend(world.space_a, name=f"{kind} backend", kind=kind, endpoint="http://127.0.0.1:9",
                           domain="sandbox.example.test", api_key="k", allow_private_endpoints=True,
                           allow_space_api_key=True)  # fmt: skip
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    html = world.client_for("alice").get(url, {"backend": str(backend.id)}).content.decode()
    for setting in describe(kind).of(Scope.CONFIG):
        _field(html, setting.name)
        assert f'<label for="id_{setting.name}">{setting.label_with_unit}</label>' in html
        if setting.type == SettingType.CHOICE:
            offered = re.findall(r'<option value="([^"]*)"', _field(html, setting.name))
            assert offered == [value for value, _ in setting.choices]


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (_docker_post(tls_cert="not pem", tls_key=KEY), "tls_cert", "Paste the PEM text (-----BEGIN CERTIFICATE"),
        (_docker_post(endpoint="", tls_cert=CERT, tls_key=KEY), "tls_cert", "for Docker tcp:// endpoints"),
        (_docker_post(tls_cert=CERT), "tls_key", "needs its key"),
        (_docker_post(endpoint="unix:///etc/passwd"), "endpoint", "a regular file"),
        (_docker_post(max_disk_mb="1"), "max_disk_mb", "greater than or equal to 64"),
        (
            {
                "name": "c",
                "kind": "cube",
                "fields_for": "cube",
                "endpoint": "http://127.0.0.1:9",
                "domain": "c.example.test",
                "api_key": "k",
                "allow_private_endpoints": "on",
                "max_cpus": "1",
                "max_memory_mb": "512",
                "workspace_host_root": "/srv/../etc",
            },
            "workspace_host_root",
            "The workspace host root must be",
        ),
        (
            {
                "name": "e",
                "kind": "e2b",
                "fields_for": "e2b",
                "endpoint": "http://127.0.0.1:9",
                "domain": "e.example.test",
                "api_key": "k" * 513,
                "allow_private_endpoints": "on",
                "max_cpus": "1",
                "max_memory_mb": "512",
            },
            "api_key",
            "The API key is at most 512 characters; this one has 513.",
        ),
        (
            _docker_post(tls_cert=CERT, tls_key="-----BEGIN PRIVATE KEY-----\nMIIEfake\n-----END PRIVATE KEY-----"),
            "tls_key",
            "not a private key that parses",
        ),
    ],
)
def test_bad_settings_are_the_adapters_own_field_errors_and_nothing_is_saved(
    world: World, data: dict[str, Any], field: str, message: str
) -> None:
    response = world.client_for("root").post(reverse(CREATE), data)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(message in error for error in errors.get(field, [])), errors
    assert not PlatformBackend.objects.exists()
    assert KEY_BODY not in response.content.decode()


def test_a_setting_is_saved_in_the_spelling_its_kind_gives_it(world: World) -> None:
    data = {"name": "cloud", "kind": "e2b", "fields_for": "e2b", "endpoint": "http://127.0.0.1:9",
            "domain": "E2B.Example.Test.", "api_key": "k", "allow_private_endpoints": "on", "max_cpus": "1",
            "max_memory_mb": "512"}  # fmt: skip
    response = world.client_for("root").post(reverse(CREATE), data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    assert PlatformBackend.objects.get().domain == "e2b.example.test"


def test_a_bad_edit_writes_nothing_of_it(world: World) -> None:
    backend = _tls_docker(world)
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    before = PlatformBackend.objects.filter(pk=backend.pk).values().get()
    response = world.client_for("root").post(
        url, _docker_post(name="renamed", max_pids="2048", tls_key="not a key", spaces=[str(world.space_a.id)])
    )
    assert response.status_code == 400
    assert PlatformBackend.objects.filter(pk=backend.pk).values().get() == before
    assert not AuditEvent.objects.filter(action="platform_backend.update").exists()


def test_stored_tls_material_shows_as_stars_and_stars_or_nothing_keep_it(world: World) -> None:
    backend = _tls_docker(world)
    root = world.client_for("root")
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    html = root.get(url).content.decode()
    assert KEY_BODY not in html
    assert CERT_BODY not in html
    for name in ("tls_ca", "tls_cert", "tls_key"):
        assert re.search(rf'<textarea[^>]*name="{name}"[^>]*>\s*\*\*\*</textarea>', html), name
    spaces = [str(world.space_a.id)]
    kept = root.post(url, _docker_post(tls_ca="***", tls_cert="***", tls_key="", max_pids="1024", spaces=spaces))
    assert kept.status_code == 302, kept.context["form"].errors if kept.context else kept
    backend.refresh_from_db()
    assert backend.max_pids == 1024
    assert decrypt(backend.tls_key_encrypted) == KEY + "\n"
    assert decrypt(backend.tls_cert_encrypted) == CERT + "\n"
    # A new pair replaces the stored one; the audit row names what changed, never the material.
    new_key = self_signed("other.test")[1]
    replaced = root.post(url, _docker_post(tls_cert=CERT, tls_key=new_key, spaces=spaces))
    assert replaced.status_code == 302
    backend.refresh_from_db()
    assert decrypt(backend.tls_key_encrypted) == new_key + "\n"
    audit = AuditEvent.objects.filter(action="platform_backend.update").order_by("-time").first()
    assert audit is not None
    assert "tls_key" in audit.details["changed"]
    assert new_key.splitlines()[1] not in str(audit.details)
    # The switch that clears them.
    cleared = root.post(url, _docker_post(clear_tls="on", spaces=spaces))
    assert cleared.status_code == 302
    backend.refresh_from_db()
    assert (backend.tls_ca_encrypted, backend.tls_cert_encrypted, backend.tls_key_encrypted) == ("", "", "")


def test_a_stored_api_key_shows_as_stars_and_stars_keep_it_on_the_config_and_the_backend(world: World) -> None:
    backend = make_backend(world.space_a, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.test", api_key="platform-key-1", allow_space_api_key=True)  # fmt: skip
    # The space's own key on its config: shown as ***, never rendered.
    config = make_config(world.space_a, backend=backend, default_template="base")
    SandboxConfig.objects.filter(pk=config.pk).update(api_key_encrypted=encrypt("space-key-1"))
    page = world.client_for("alice").get(reverse("sandboxes:config_edit", args=[config.id])).content.decode()
    assert "space-key-1" not in page
    assert 'value="***"' in _field(page, "api_key")
    # The platform's key on the backend: the same; posting *** back keeps it.
    root = world.client_for("root")
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    html = root.get(url).content.decode()
    assert "platform-key-1" not in html
    assert 'value="***"' in _field(html, "api_key")
    data = {"name": "cloud", "kind": "e2b", "fields_for": "e2b", "endpoint": "http://127.0.0.1:9",
            "domain": "e2b.example.test", "api_key": "***", "allow_private_endpoints": "on", "max_cpus": "4",
            "max_memory_mb": "8192", "spaces": [str(world.space_a.id)]}  # fmt: skip
    response = root.post(url, data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    backend.refresh_from_db()
    assert (backend.allow_private_endpoints, decrypt(backend.api_key_encrypted)) == (True, "platform-key-1")
    replaced = root.post(url, {**data, "api_key": "platform-key-2"})
    assert replaced.status_code == 302
    backend.refresh_from_db()
    assert decrypt(backend.api_key_encrypted) == "platform-key-2"


def test_every_declared_secret_is_stored_encrypted_and_so_rotated() -> None:
    """Each secret a kind declares lives in `<name>_encrypted` on its scope's model, which the
    key rotation (`console.services.encrypted_fields`) re-encrypts."""
    rotated = {(model, field) for model, field in encrypted_fields()}
    models = {Scope.BACKEND: PlatformBackend, Scope.CONFIG: SandboxConfig}
    for scope, model in models.items():
        for name, declared in all_settings(scope).items():
            if declared[0][1].secret:
                assert (model, f"{name}_encrypted") in rotated, (scope, name)


def test_rows_stored_before_the_settings_were_declared_still_load(world: World) -> None:
    """Rows the earlier forms wrote, leftovers of another kind included (a Docker row still
    holding an E2B domain, data-plane URL and key), open as their kind, the edit page offers
    only the kind's settings, and the options the old string bag carried parse to the typed
    options the bridge now builds."""
    leftovers = {"domain": "e2b.example.test", "sandbox_url": "http://127.0.0.1:9/", "workspace_host_root": "/srv/w"}
    docker = make_backend(world.space_a, name="old engine", api_key="left-behind", **leftovers)
    config = make_config(world.space_a, backend=docker, default_template="base", protocol_pin="")
    assert get_backend(config).kind == "docker"
    html = world.client_for("root").get(reverse("sandboxes:backend_edit", args=[docker.id])).content.decode()
    assert "left-behind" not in html
    assert 'name="domain"' not in html
    e2b = make_backend(world.space_a, name="old cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                       domain="e2b.example.test", sandbox_url="http://127.0.0.1:9/", api_key="k",
                       allow_private_endpoints=True)  # fmt: skip
    pinned = make_config(world.space_a, backend=e2b, default_template="base", protocol_pin="e2b-v1", idle_timeout_s=900)
    old_bag = {"sandbox_url": "http://127.0.0.1:9/", "inbound_url": "/inbound/", "sandbox_timeout": "900",
               "protocol": "e2b-v1", "protocol_pinned": "1"}  # fmt: skip
    assert backend_config_for(pinned).options == E2BOptions.parse(old_bag)
    assert get_backend(pinned).protocol_pinned is True  # type: ignore[attr-defined]
    page = world.client_for("alice").get(pinned.get_absolute_url())
    assert page.status_code == 200
    assert "<code>e2b-v1</code> (pinned)" in page.content.decode()
