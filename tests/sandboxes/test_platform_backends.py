"""Platform-owned backends: platform admins register infrastructure and grant it; space
admins choose a granted backend and set only template, resources within limits and idle
behaviour. Each test is written to fail on a console where a config carries its own
endpoint, TLS, private opt-in, host root and package sources.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from console.crypto import decrypt, encrypt
from console.models import AuditEvent
from sandboxes.catalog.services import backend_config_for, config_fingerprint, open_backend
from sandboxes.models import PlatformBackend, SandboxConfig, SessionImage
from sandboxes.sessions.runtime import effective_template
from tests.factories import make_backend, make_config
from tests.personas import World
from tests.sandboxes.tls_engine import TlsEngine

pytestmark = pytest.mark.django_db

# Every infrastructure field a space admin could once set on a config, with hostile values.
FORGED_INFRASTRUCTURE = {
    "kind": "cube",
    "endpoint": "unix:///var/run/docker.sock",
    "domain": "evil.example",
    "sandbox_url": "http://127.0.0.1:1/",
    "allow_private_endpoints": "on",
    "workspace_host_root": "/",
    "pip_index_url": "http://127.0.0.1:1/simple/",
    "pip_find_links": "wheels",
    "npm_registry_url": "http://127.0.0.1:1/",
    "tls_cert": "-----BEGIN CERTIFICATE-----",
    "allow_space_api_key": "on",
    "max_cpus": "64",
}


def form(backend: PlatformBackend, **overrides: Any) -> dict[str, Any]:
    data = {
        "name": "main",
        "backend": str(backend.pk),
        "api_key": "",
        "default_template": "sandbox-console/base:latest",
        "cpus": "1",
        "memory_mb": "512",
        "pids_limit": "256",
        "idle_mode": "pause",
        "idle_timeout_s": "900",
        "persistent_workspace": "on",
    }
    data.update(overrides)
    return data


def infrastructure(backend: PlatformBackend) -> dict[str, Any]:
    return {field: getattr(backend, field) for field in ("kind", "endpoint", "domain", "sandbox_url",
            "allow_private_endpoints", "workspace_host_root", "pip_index_url", "pip_find_links",
            "npm_registry_url", "tls_cert_encrypted", "allow_space_api_key", "max_cpus")}  # fmt: skip


@pytest.fixture
def granted(world: World) -> PlatformBackend:
    backend: PlatformBackend = make_backend(
        world.space_a, name="shared engine", max_cpus=2, max_memory_mb=1024, max_pids=256
    )
    return backend


# --- What a space admin may set ----------------------------------------------------------


def test_a_space_admin_cannot_set_any_infrastructure_field(world: World, granted: PlatformBackend) -> None:
    client = world.client_for("alice")
    before = infrastructure(granted)
    response = client.post(
        reverse("sandboxes:config_create", args=[world.space_a.id]), form(granted, **FORGED_INFRASTRUCTURE)
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    config = SandboxConfig.objects.get(space=world.space_a)
    edit = client.post(
        reverse("sandboxes:config_edit", args=[config.id]),
        form(granted, name="renamed", is_default="on", **FORGED_INFRASTRUCTURE),
    )
    assert edit.status_code == 302
    config.refresh_from_db()
    granted.refresh_from_db()
    assert config.name == "renamed"
    assert infrastructure(granted) == before
    assert PlatformBackend.objects.count() == 1
    merged = backend_config_for(config)
    assert (merged.kind, merged.endpoint, merged.allow_private_endpoints) == ("docker", "", False)
    assert merged.options == {}
    assert (config.workspace_host_root, config.pip_index_url, config.npm_registry_url) == ("", "", "")


def test_a_backend_not_granted_to_the_space_cannot_be_chosen(world: World, granted: PlatformBackend) -> None:
    foreign = make_backend(world.space_b, name="space B's engine")
    ungranted = make_backend(name="nobody's engine")
    client = world.client_for("alice")
    create = reverse("sandboxes:config_create", args=[world.space_a.id])
    assert "space B" not in client.get(create).content.decode()
    for backend in (foreign, ungranted):
        response = client.post(create, form(backend))
        assert response.status_code == 400
        assert "backend" in response.context["form"].errors
    assert not SandboxConfig.objects.exists()
    config = make_config(world.space_a, backend=granted)
    response = client.post(reverse("sandboxes:config_edit", args=[config.id]), form(foreign, is_default="on"))
    assert response.status_code == 400
    config.refresh_from_db()
    assert config.backend == granted
    assert not AuditEvent.objects.filter(action__startswith="sandbox_config").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cpus", "2.5", "at most 2.00 CPU cores"),
        ("memory_mb", "1025", "at most 1024 MiB"),
        ("pids_limit", "257", "at most 256"),
    ],
)
def test_resources_stay_within_the_backends_limits(
    world: World, granted: PlatformBackend, field: str, value: str, message: str
) -> None:
    client = world.client_for("alice")
    create = reverse("sandboxes:config_create", args=[world.space_a.id])
    response = client.post(create, form(granted, **{field: value}))
    assert response.status_code == 400
    assert any(message in error for error in response.context["form"].errors[field])
    assert client.post(create, form(granted, cpus="2", memory_mb="1024", pids_limit="256")).status_code == 302
    config = SandboxConfig.objects.get()
    response = client.post(
        reverse("sandboxes:config_edit", args=[config.id]), form(granted, is_default="on", **{field: value})
    )
    assert response.status_code == 400
    config.refresh_from_db()
    assert (config.cpus, config.memory_mb, config.pids_limit) == (2, 1024, 256)


def test_an_own_api_key_only_where_the_platform_allows_it_and_never_to_a_private_endpoint(world: World) -> None:
    closed = make_backend(
        world.space_a,
        name="team e2b",
        kind="e2b",
        endpoint="http://127.0.0.1:9",
        domain="e2b.local",
        api_key="platform-key",
        allow_private_endpoints=True,
    )
    client = world.client_for("alice")
    create = reverse("sandboxes:config_create", args=[world.space_a.id])
    response = client.post(create, form(closed, api_key="space-key"))
    assert response.status_code == 400
    assert "does not let spaces bring their own key" in str(response.context["form"].errors["api_key"])
    assert "space-key" not in response.content.decode()  # a typed secret is never rendered back
    # A public endpoint (an address literal: nothing is resolved or sent) that allows own keys.
    open_ = make_backend(
        world.space_a,
        name="public e2b",
        kind="e2b",
        endpoint="https://93.184.216.34",
        domain="e2b.example",
        allow_space_api_key=True,
    )
    assert client.post(create, form(open_, api_key="space-key")).status_code == 302
    config = SandboxConfig.objects.get()
    assert "space-key" not in config.api_key_encrypted
    merged = backend_config_for(config)
    assert (merged.api_key, merged.allow_private_endpoints) == ("space-key", False)
    # The platform's own private backend: with its key, private stays allowed for it.
    platform = make_config(world.space_a, backend=closed, name="platform key")
    assert (backend_config_for(platform).api_key, backend_config_for(platform).allow_private_endpoints) == (
        "platform-key",
        True,
    )
    # The platform form refuses own keys together with private endpoints.
    root = world.client_for("root")
    response = root.post(
        reverse("sandboxes:backend_create"),
        backend_form(
            name="bad",
            kind="e2b",
            endpoint="http://127.0.0.1:9",
            domain="e2b.local",
            api_key="k",
            allow_private_endpoints="on",
            allow_space_api_key="on",
        ),
    )
    assert response.status_code == 400
    assert "allow_space_api_key" in response.context["form"].errors


# --- The platform's Backends section -----------------------------------------------------


def backend_form(**overrides: Any) -> dict[str, Any]:
    data = {
        "name": "engine",
        "kind": "docker",
        "endpoint": "",
        "domain": "",
        "sandbox_url": "",
        "api_key": "",
        "tls_ca": "",
        "tls_cert": "",
        "tls_key": "",
        "workspace_host_root": "",
        "pip_index_url": "",
        "pip_find_links": "",
        "npm_registry_url": "",
        "max_cpus": "4",
        "max_memory_mb": "8192",
        "max_pids": "4096",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("persona", ["alice", "bob", "carol", "charlie"])
def test_the_backends_section_is_for_platform_admins_only(world: World, granted: PlatformBackend, persona: str) -> None:
    client = world.client_for(persona)
    for url in (
        reverse("sandboxes:backend_list"),
        reverse("sandboxes:backend_create"),
        reverse("sandboxes:backend_edit", args=[granted.id]),
    ):
        assert client.get(url).status_code == 404
        assert (
            client.post(
                url, backend_form(name="mine", endpoint="unix:///etc", spaces=[str(world.space_a.id)])
            ).status_code
            == 404
        )
    assert list(PlatformBackend.objects.values_list("name", flat=True)) == ["shared engine"]
    assert 'href="/platform/backends/"' not in client.get(reverse("sandboxes:config_list")).content.decode()
    assert (
        'href="/platform/backends/"' in world.client_for("root").get(reverse("sandboxes:config_list")).content.decode()
    )


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"kind": "e2b"}, "endpoint", "need their control-plane URL"),
        ({"kind": "e2b", "endpoint": "https://api.example.com"}, "domain", "need their sandbox domain"),
        ({"endpoint": "http://docker.example.com"}, "endpoint", "A Docker endpoint is empty"),
        ({"domain": "e2b.app"}, "domain", "Docker backends have no sandbox domain"),
        (
            {
                "kind": "e2b",
                "endpoint": "http://169.254.169.254/",
                "domain": "e2b.app",
                "api_key": "k",
                "allow_private_endpoints": "on",
            },
            "endpoint",
            "never allowed",
        ),
        (
            {"kind": "e2b", "endpoint": "http://127.0.0.1:3000/", "domain": "e2b.app", "api_key": "k"},
            "endpoint",
            "allow private endpoints",
        ),
        ({"endpoint": "tcp://10.1.2.3:2375"}, "endpoint", "a private range"),
        ({"endpoint": "ssh://deploy@10.1.2.3"}, "endpoint", "a private range"),
        (
            {"endpoint": "tcp://127.0.0.1:2376", "allow_private_endpoints": "on", "tls_cert": "not pem"},
            "tls_cert",
            "PEM",
        ),
        (
            {"tls_cert": "-----BEGIN CERTIFICATE-----\nx", "tls_key": "-----BEGIN PRIVATE KEY-----\nx"},
            "tls_cert",
            "for Docker tcp://",
        ),
        ({"pip_index_url": "http://127.0.0.1:1/simple/"}, "pip_index_url", "allow private endpoints"),
        ({"workspace_host_root": "/srv/ws"}, "workspace_host_root", "Only Cube backends"),
        (
            {
                "kind": "cube",
                "endpoint": "http://127.0.0.1:9",
                "domain": "x.example.com",
                "api_key": "k",
                "allow_private_endpoints": "on",
                "workspace_host_root": "/srv/../etc",
            },
            "workspace_host_root",
            "without '.', '..'",
        ),
        ({"max_cpus": "0"}, "max_cpus", "greater than or equal to 0.1"),
    ],
)
def test_bad_backend_input_is_a_field_error_and_saves_nothing(
    world: World, overrides: dict[str, str], field: str, message: str
) -> None:
    response = world.client_for("root").post(reverse("sandboxes:backend_create"), backend_form(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(message in error for error in errors.get(field, [])), errors
    assert not PlatformBackend.objects.exists()


@pytest.fixture
def tls_engine() -> Iterator[TlsEngine]:
    engine = TlsEngine.start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.mark.docker
def test_a_platform_admin_registers_a_tls_docker_host_and_grants_it_to_a_space(
    world: World, tls_engine: TlsEngine
) -> None:
    root = world.client_for("root")
    data = backend_form(
        name="tls engine",
        endpoint=tls_engine.endpoint,
        allow_private_endpoints="on",
        tls_ca=tls_engine.ca_pem,
        tls_cert=tls_engine.client.cert,
        tls_key=tls_engine.client.key,
        spaces=[str(world.space_a.id)],
        max_cpus="2",
    )
    response = root.post(reverse("sandboxes:backend_create"), data)
    assert response.status_code == 302, response.context["form"].errors
    backend = PlatformBackend.objects.get(name="tls engine")
    assert list(backend.spaces.all()) == [world.space_a]
    # Stored encrypted, like API keys, and never shown again.
    secret_body = tls_engine.client.key.splitlines()[1]
    stored = PlatformBackend.objects.filter(pk=backend.pk).values()[0]
    assert not any(secret_body in str(value) for value in stored.values())
    assert decrypt(backend.tls_key_encrypted).strip() == tls_engine.client.key.strip()
    edit_page = root.get(reverse("sandboxes:backend_edit", args=[backend.id])).content.decode()
    assert secret_body not in edit_page
    assert "BEGIN CERTIFICATE" not in edit_page
    assert not any(secret_body in str(e.details) for e in AuditEvent.objects.all())
    # Space A's admin sees it, creates a config on it and reaches the engine through TLS.
    alice = world.client_for("alice")
    assert "tls engine" in alice.get(reverse("sandboxes:config_create", args=[world.space_a.id])).content.decode()
    assert (
        "tls engine"
        not in world.client_for("charlie")
        .get(reverse("sandboxes:config_create", args=[world.space_b.id]))
        .content.decode()
    )
    assert (
        alice.post(
            reverse("sandboxes:config_create", args=[world.space_a.id]), form(backend, name="remote")
        ).status_code
        == 302
    )
    config = SandboxConfig.objects.get(name="remote")
    with open_backend(config) as engine:
        health = engine.health()
    assert health.ok, health.detail
    assert health.version
    # Without the client certificate the engine refuses the handshake.
    plain = make_config(world.space_a, endpoint=tls_engine.endpoint, allow_private_endpoints=True)
    with open_backend(plain) as engine:
        assert not engine.health().ok
    # Saving the edit form without retyping keeps the stored certificate and key.
    keep = backend_form(
        name="tls engine",
        endpoint=tls_engine.endpoint,
        allow_private_endpoints="on",
        spaces=[str(world.space_a.id)],
        max_cpus="2",
    )
    assert root.post(reverse("sandboxes:backend_edit", args=[backend.id]), keep).status_code == 302
    backend.refresh_from_db()
    assert decrypt(backend.tls_key_encrypted).strip() == tls_engine.client.key.strip()
    # A grant cannot be withdrawn while the space has configs on it.
    revoke = {**keep, "spaces": []}
    response = root.post(reverse("sandboxes:backend_edit", args=[backend.id]), revoke)
    assert response.status_code == 400
    assert list(backend.spaces.all()) == [world.space_a]


# --- Migration ----------------------------------------------------------------------------

BEFORE = [("sandboxes", "0010_session_store")]
AFTER = [("sandboxes", "0011_platform_backends")]


def old_fingerprint(kind: str, endpoint: str, domain: str, key: str) -> str:
    return hashlib.sha256("\n".join([kind, endpoint, domain, key]).encode()).hexdigest()


@pytest.mark.django_db(transaction=True)
def test_the_data_migration_turns_each_infrastructure_tuple_into_one_granted_backend() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    Space = old.get_model("console", "Space")
    Config = old.get_model("sandboxes", "SandboxConfig")
    Image = old.get_model("sandboxes", "SessionImage")
    a = Space.objects.create(name="A", slug="a")
    b = Space.objects.create(name="B", slug="b")
    local_a = Config.objects.create(
        space=a, name="local", kind="docker", default_template="t", cpus=8, memory_mb=512, pids_limit=128
    )
    local_b = Config.objects.create(space=b, name="local", kind="docker", default_template="t", pids_limit=9000)
    e2b = Config.objects.create(
        space=a, name="e2b", kind="e2b", endpoint="http://127.0.0.1:9", domain="e2b.local",
        api_key_encrypted=encrypt("secret"), allow_private_endpoints=True, pip_index_url="http://127.0.0.1:1/simple/",
        default_template="base",
    )  # fmt: skip
    other_key = Config.objects.create(
        space=b, name="e2b", kind="e2b", endpoint="http://127.0.0.1:9", domain="e2b.local",
        api_key_encrypted=encrypt("another"), allow_private_endpoints=True, default_template="base",
    )  # fmt: skip
    fingerprint = old_fingerprint("e2b", "http://127.0.0.1:9", "e2b.local", "secret")
    Image.objects.create(space=a, config=e2b, snapshot_id="snap-kept", fingerprint=fingerprint)
    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)

    configs = {(c.space.slug, c.name): c for c in SandboxConfig.objects.select_related("space", "backend")}
    assert PlatformBackend.objects.count() == 3  # one local engine, one backend per E2B key
    local = configs["a", "local"].backend
    assert configs["b", "local"].backend == local
    assert set(local.spaces.values_list("slug", flat=True)) == {"a", "b"}
    assert (local.max_cpus, local.max_pids) == (8, 9000)  # limits never below existing configs
    migrated = configs["a", "e2b"]
    assert migrated.backend != configs["b", "e2b"].backend
    assert migrated.api_key_encrypted == ""
    assert decrypt(migrated.backend.api_key_encrypted) == "secret"
    assert (migrated.backend.allow_private_endpoints, migrated.backend.pip_index_url) == (
        True,
        "http://127.0.0.1:1/simple/",
    )
    assert list(migrated.backend.spaces.values_list("slug", flat=True)) == ["a"]
    merged = backend_config_for(migrated)
    assert (merged.kind, merged.endpoint, merged.domain, merged.api_key, merged.allow_private_endpoints) == (
        "e2b", "http://127.0.0.1:9", "e2b.local", "secret", True,
    )  # fmt: skip
    # Same fingerprint: the recorded skill image is still the one sessions start from.
    assert config_fingerprint(migrated) == fingerprint
    assert SessionImage.objects.get(config=migrated).snapshot_id == "snap-kept"
    assert effective_template(migrated.space, migrated).template_id == "snap-kept"
    assert config_fingerprint(configs["b", "e2b"]) == old_fingerprint(
        "e2b", "http://127.0.0.1:9", "e2b.local", "another"
    )
    assert {local_a.pk, local_b.pk, other_key.pk} <= set(configs_pk := [c.pk for c in configs.values()])  # noqa: F841
    # And back: each config gets its infrastructure again.
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    back = old.get_model("sandboxes", "SandboxConfig").objects.get(pk=e2b.pk)
    assert (back.endpoint, decrypt(back.api_key_encrypted), back.allow_private_endpoints) == (
        "http://127.0.0.1:9",
        "secret",
        True,
    )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
