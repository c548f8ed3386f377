"""Platform-owned backends: platform admins register infrastructure and grant it; space
admins choose a granted backend and set only template, resources within limits and idle
behaviour. Each test is written to fail on a console where a config carries its own
endpoint, TLS, private opt-in, host root and package sources.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.urls import reverse

from console.crypto import decrypt, encrypt
from console.models import AuditEvent
from sandboxes.backends.cube.settings import CubeOptions
from sandboxes.backends.docker.settings import DockerOptions
from sandboxes.catalog.bridge import backend_config_for, config_fingerprint, get_backend
from sandboxes.catalog.tuning import CATALOG
from sandboxes.management.commands.register_local_engine import NAME as LOCAL_ENGINE
from sandboxes.models import PlatformBackend, SandboxConfig, SessionImage
from sandboxes.sessions.provisioning import effective_template
from tests.factories import config_form, make_backend, make_config
from tests.personas import World
from tests.support.pem import CERT, KEY
from tests.support.tls_engine import TlsEngine

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
    "npm_folder": "npm",
    "apt_url": "http://127.0.0.1:1/debian",
    "apt_folder": "debian",
    "tls_cert": "-----BEGIN CERTIFICATE-----",
    "allow_space_api_key": "on",
    "max_cpus": "64",
}


def infrastructure(backend: PlatformBackend) -> dict[str, Any]:
    return {field: getattr(backend, field) for field in ("kind", "endpoint", "domain", "sandbox_url",
            "allow_private_endpoints", "workspace_host_root", "pip_index_url", "pip_find_links",
            "npm_registry_url", "npm_folder", "apt_url", "apt_folder", "tls_cert_encrypted", "allow_space_api_key",
            "max_cpus")}  # fmt: skip


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
        reverse("sandboxes:config_create", args=[world.space_a.id]), config_form(granted, **FORGED_INFRASTRUCTURE)
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    config = SandboxConfig.objects.get(space=world.space_a)
    edit = client.post(
        reverse("sandboxes:config_edit", args=[config.id]),
        config_form(granted, name="renamed", is_default="on", **FORGED_INFRASTRUCTURE),
    )
    assert edit.status_code == 302
    config.refresh_from_db()
    granted.refresh_from_db()
    assert config.name == "renamed"
    assert infrastructure(granted) == before
    assert PlatformBackend.objects.count() == 1
    merged = backend_config_for(config)
    assert (merged.kind, merged.endpoint, merged.allow_private_endpoints) == ("docker", "", False)
    # Only what the console itself sets (where inbound URLs point, the operator's folder of
    # bounded disks, the egress resolver's settings), nothing the form carried.
    egress = {
        "dns_upstream": settings.EGRESS_DNS_UPSTREAM,
        "egress_state_dir": settings.EGRESS_STATE_DIR,
        "egress_log_max_bytes": str(CATALOG.egress_log_max_bytes),
    }
    assert merged.options == DockerOptions.parse(
        {
            "inbound_url": "/inbound/",
            "disk_dir": settings.WORKSPACE_DISK_DIR,
            "template_build_disk_mb": str(CATALOG.template_build_disk_mb),
            **{key: value for key, value in egress.items() if value},
        }
    )
    assert (config.workspace_host_root, config.pip_index_url, config.npm_registry_url) == ("", "", "")


def test_a_backend_not_granted_to_the_space_cannot_be_chosen(world: World, granted: PlatformBackend) -> None:
    foreign = make_backend(world.space_b, name="space B's engine")
    ungranted = make_backend(name="nobody's engine")
    client = world.client_for("alice")
    create = reverse("sandboxes:config_create", args=[world.space_a.id])
    assert "space B" not in client.get(create).content.decode()
    for backend in (foreign, ungranted):
        response = client.post(create, config_form(backend))
        assert response.status_code == 400
        assert "backend" in response.context["form"].errors
    assert not SandboxConfig.objects.exists()
    config = make_config(world.space_a, backend=granted)
    response = client.post(reverse("sandboxes:config_edit", args=[config.id]), config_form(foreign, is_default="on"))
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
    response = client.post(create, config_form(granted, **{field: value}))
    assert response.status_code == 400
    assert any(message in error for error in response.context["form"].errors[field])
    assert client.post(create, config_form(granted, cpus="2", memory_mb="1024", pids_limit="256")).status_code == 302
    config = SandboxConfig.objects.get()
    response = client.post(
        reverse("sandboxes:config_edit", args=[config.id]), config_form(granted, is_default="on", **{field: value})
    )
    assert response.status_code == 400
    config.refresh_from_db()
    assert (config.cpus, config.memory_mb, config.pids_limit) == (2, 1024, 256)


@pytest.fixture
def public_address() -> Iterator[str]:
    """A public IPv4 address local to this machine (on a veth pair of the test's own, both ends
    here), so a connection to it never leaves the machine; nothing listens (refused at once)."""
    import json
    import os
    import secrets
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("needs root to make a dummy interface")
    address, device = "93.184.216.34", f"sctpub{secrets.token_hex(2)}"

    def ip(*args: str) -> str:
        return subprocess.run(["ip", *args], capture_output=True, text=True, check=True, timeout=20).stdout

    ip("link", "add", device, "type", "veth", "peer", "name", device + "p")
    try:
        ip("addr", "add", f"{address}/32", "dev", device)
        ip("link", "set", device, "up")
        route = json.loads(ip("-j", "route", "get", address))[0]
        assert route.get("type") == "local", f"{address} is not local: {route}"
        yield address
    finally:
        subprocess.run(["ip", "link", "del", device], capture_output=True, check=False, timeout=20)


def test_an_own_api_key_only_where_the_platform_allows_it_and_never_to_a_private_endpoint(
    world: World, public_address: str
) -> None:
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
    response = client.post(create, config_form(closed, api_key="space-key"))
    assert response.status_code == 400
    # The field is not offered for this backend; a key posted anyway is refused all the same.
    assert "does not let spaces bring their own key" in str(response.context["form"].errors)
    assert "space-key" not in response.content.decode()  # a typed secret is never rendered back
    # A public endpoint that allows own keys. Saving lists the backend's templates, so the
    # public address is one of the test's own, local to this machine.
    open_ = make_backend(
        world.space_a,
        name="public e2b",
        kind="e2b",
        endpoint=f"https://{public_address}",
        domain="e2b.example",
        allow_space_api_key=True,
    )
    assert client.post(create, config_form(open_, api_key="space-key")).status_code == 302
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
        (
            {"kind": "e2b", "endpoint": "http://127.0.0.1:9", "allow_private_endpoints": "on"},
            "domain",
            "need their sandbox domain",
        ),
        ({"endpoint": "http://docker.example.com"}, "endpoint", "A Docker endpoint is empty"),
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
            {"tls_cert": CERT, "tls_key": KEY},
            "tls_cert",
            "for Docker tcp://",
        ),
        ({"pip_index_url": "http://127.0.0.1:1/simple/"}, "pip_index_url", "allow private endpoints"),
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
        (
            {
                "kind": "e2b",
                "endpoint": "http://127.0.0.1:9",
                "domain": "e2b.example",
                "api_key": "k",
                "allow_private_endpoints": "on",
                "sandbox_url": "http://[::1",
            },
            "sandbox_url",
            "not a URL",
        ),
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
            reverse("sandboxes:config_create", args=[world.space_a.id]), config_form(backend, name="remote")
        ).status_code
        == 302
    )
    config = SandboxConfig.objects.get(name="remote")
    engine = get_backend(config)
    health = engine.health()
    assert health.ok, health.detail
    assert health.version
    # Without the client certificate the engine refuses the handshake.
    plain = make_config(world.space_a, endpoint=tls_engine.endpoint, allow_private_endpoints=True)
    engine = get_backend(plain)
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
# Forward to the newest migration (0011's data step and everything after it), so the current
# models can read the result.
AFTER = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("sandboxes")


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


# --- Secrets typed into a form that fails validation -------------------------------------

TYPED_KEY = "-----BEGIN PRIVATE KEY-----\ntyped-secret-key-body\n-----END PRIVATE KEY-----"


def test_secrets_typed_into_a_failing_form_are_never_rendered_back(world: World) -> None:
    root = world.client_for("root")
    # Create: a TLS key with a bad endpoint.
    response = root.post(
        reverse("sandboxes:backend_create"),
        backend_form(endpoint="ftp://nowhere", tls_cert="-----BEGIN CERTIFICATE-----\nc\n", tls_key=TYPED_KEY),
    )
    assert response.status_code == 400
    assert "typed-secret-key-body" not in response.content.decode()
    # Edit of a backend holding a key: a new key typed with a bad field.
    backend = make_backend(
        world.space_a,
        api_key="stored-platform-key",
        kind="e2b",
        endpoint="http://127.0.0.1:9",
        domain="e2b.example",
        allow_space_api_key=True,
    )
    response = root.post(
        reverse("sandboxes:backend_edit", args=[backend.id]),
        backend_form(
            kind="e2b",
            endpoint="http://127.0.0.1:9",
            allow_private_endpoints="on",
            domain="not a domain",
            api_key="typed-platform-key",
            tls_key=TYPED_KEY,
        ),
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert "typed-platform-key" not in body
    assert "typed-secret-key-body" not in body
    assert "stored-platform-key" not in body
    # A space's own key on its config's edit form, with resources above the limit.
    config = make_config(world.space_a, backend=backend, name="own")
    config.api_key_encrypted = encrypt("stored-own-key")
    config.save()
    response = world.client_for("alice").post(
        reverse("sandboxes:config_edit", args=[config.id]),
        config_form(backend, name="own", api_key="typed-own-key", default_template="base", cpus="999"),
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert "typed-own-key" not in body
    assert "stored-own-key" not in body


# --- Concurrent edits --------------------------------------------------------------------


def _wait_for_lock_waiters(count: int, timeout: float = 10.0) -> None:
    import time

    import psycopg
    from django.conf import settings as django_settings

    db = django_settings.DATABASES["default"]
    deadline = time.monotonic() + timeout
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0] >= count:
                return
            time.sleep(0.02)
    raise AssertionError("the writers never met on a lock")


@pytest.mark.django_db(transaction=True)
def test_limits_lowered_while_a_space_saves_never_leave_a_config_above_them(world: World) -> None:
    """The platform lowers max_cpus to 1 while a space admin raises a config to 2 (allowed
    under the old limit): one of the two must lose, whatever the interleaving."""
    import threading

    import psycopg
    from django.conf import settings as django_settings
    from django.db import connections

    from console.services import Actor, ServiceError
    from sandboxes.catalog.platform import BACKEND_FIELDS, do_update_platform_backend
    from sandboxes.catalog.services import CONFIG_FIELDS, do_update_config

    backend = make_backend(world.space_a, name="limited", max_cpus=2, max_memory_mb=1024, max_pids=256)
    config = make_config(world.space_a, backend=backend, name="raced", cpus=1)
    db = django_settings.DATABASES["default"]
    errors: dict[str, BaseException] = {}

    def space_saves() -> None:
        try:
            mine = SandboxConfig.objects.select_related("space", "backend").get(pk=config.pk)
            mine.cpus = 2
            do_update_config(
                mine, data={k: getattr(mine, k) for k in CONFIG_FIELDS}, api_key=None, actor=Actor(world.alice)
            )
        except ServiceError as exc:
            errors["space"] = exc
        finally:
            connections.close_all()

    def platform_lowers() -> None:
        try:
            mine = PlatformBackend.objects.get(pk=backend.pk)
            data = {k: getattr(mine, k) for k in BACKEND_FIELDS} | {"max_cpus": 1}
            do_update_platform_backend(mine, data=data, secrets={}, spaces=[world.space_a], actor=Actor(world.root))
        except ServiceError as exc:
            errors["platform"] = exc
        finally:
            connections.close_all()

    # A third party holds the config row, so the space's save stops just before its write.
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]) as holder:
        holder.execute("SELECT 1 FROM sandboxes_sandboxconfig WHERE id = %s FOR UPDATE", [config.pk])
        space = threading.Thread(target=space_saves)
        space.start()
        _wait_for_lock_waiters(1)
        platform = threading.Thread(target=platform_lowers)
        platform.start()
        platform.join(timeout=2)
        holder.rollback()
    space.join(timeout=10)
    platform.join(timeout=10)
    assert not space.is_alive()
    assert not platform.is_alive()
    config.refresh_from_db()
    backend.refresh_from_db()
    assert config.cpus <= backend.max_cpus, (config.cpus, backend.max_cpus, errors)
    assert len(errors) == 1, errors


@pytest.mark.docker
def test_own_keys_switched_off_while_their_sandboxes_live_is_refused(world: World, public_address: str) -> None:
    """Switching "spaces may bring their own key" off moves configs with an own key to the
    platform's account: their live sandboxes (on the space's own account) would be orphaned."""
    from console.services import Actor, ServiceError
    from sandboxes.backends.base import NetworkSpec, SandboxSpec
    from sandboxes.catalog.bridge import console_metadata
    from sandboxes.catalog.platform import BACKEND_FIELDS, do_update_platform_backend
    from tests.fakes.e2b_server import FakeServer

    server = FakeServer("e2b", host=public_address, run_id="pytest-ownkey").start()
    try:
        endpoint = f"http://{public_address}:{server.port}"
        backend = make_backend(
            world.space_a,
            name="public fake",
            kind="e2b",
            endpoint=endpoint,
            domain="e2b.local",
            sandbox_url=endpoint,
            api_key="platform-key-the-fake-refuses",
            allow_space_api_key=True,
        )
        config = make_config(world.space_a, backend=backend, name="own key")
        config.api_key_encrypted = encrypt(server.api_key)
        config.save()
        engine = get_backend(config)
        sandbox = engine.create(
            SandboxSpec(
                template_id="base",
                network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
                metadata=console_metadata(config),
            )
        ).sandbox_id
        try:
            data = {k: getattr(backend, k) for k in BACKEND_FIELDS} | {"allow_space_api_key": False}
            with pytest.raises(ServiceError, match="live sandbox"):
                do_update_platform_backend(
                    PlatformBackend.objects.get(pk=backend.pk),
                    data=data,
                    secrets={},
                    spaces=[world.space_a],
                    actor=Actor(world.root),
                )
            assert PlatformBackend.objects.get(pk=backend.pk).allow_space_api_key
        finally:
            engine = get_backend(config)
            engine.delete(sandbox)
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_the_reverse_migration_keeps_each_config_on_the_account_it_uses() -> None:
    """Back to per-config infrastructure: a config's stale own key (its backend no longer lets
    spaces bring one) is not the key it uses; the platform's is, and stays."""
    from console.models import Space

    space = Space.objects.create(name="R", slug="r")
    closed = make_backend(space, name="closed", kind="e2b", endpoint="http://127.0.0.1:9", domain="e2b.local",
                          api_key="platform-key", allow_private_endpoints=True)  # fmt: skip
    stale = make_config(space, backend=closed, name="stale", default_template="base")
    SandboxConfig.objects.filter(pk=stale.pk).update(api_key_encrypted=encrypt("old-own-key"))
    stale.refresh_from_db()
    fingerprint = config_fingerprint(stale)
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        back = old.get_model("sandboxes", "SandboxConfig").objects.get(pk=stale.pk)
        assert decrypt(back.api_key_encrypted) == "platform-key"
        assert old_fingerprint(back.kind, back.endpoint, back.domain, "platform-key") == fingerprint
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_a_grant_withdrawn_while_a_space_creates_a_config_never_leaves_a_config_on_it(world: World) -> None:
    import threading

    import psycopg
    from django.conf import settings as django_settings
    from django.db import connections

    from console.services import Actor, ServiceError
    from sandboxes.catalog.platform import BACKEND_FIELDS, do_update_platform_backend
    from sandboxes.catalog.services import do_create_config

    backend = make_backend(world.space_a, name="withdrawn")
    existing = make_config(world.space_a, name="existing", is_default=True)  # on a backend of its own
    db = django_settings.DATABASES["default"]
    errors: dict[str, BaseException] = {}

    def space_creates() -> None:
        try:
            data = {
                "name": "late", "backend": PlatformBackend.objects.get(pk=backend.pk),
                "default_template": "sandbox-console/base:latest", "cpus": 1, "memory_mb": 256, "pids_limit": 128,
                "idle_mode": "pause", "idle_timeout_s": 900, "persistent_workspace": False, "is_default": False,
            }  # fmt: skip
            do_create_config(world.space_a, data=data, api_key="", actor=Actor(world.alice))
        except ServiceError as exc:
            errors["space"] = exc
        finally:
            connections.close_all()

    def platform_withdraws() -> None:
        try:
            mine = PlatformBackend.objects.get(pk=backend.pk)
            data = {k: getattr(mine, k) for k in BACKEND_FIELDS}
            do_update_platform_backend(mine, data=data, secrets={}, spaces=[], actor=Actor(world.root))
        except ServiceError as exc:
            errors["platform"] = exc
        finally:
            connections.close_all()

    # A third party holds the space's default config, so the create stops inside its transaction.
    with psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]) as holder:
        holder.execute("SELECT 1 FROM sandboxes_sandboxconfig WHERE id = %s FOR UPDATE", [existing.pk])
        space = threading.Thread(target=space_creates)
        space.start()
        _wait_for_lock_waiters(1)
        platform = threading.Thread(target=platform_withdraws)
        platform.start()
        platform.join(timeout=2)
        holder.rollback()
    space.join(timeout=10)
    platform.join(timeout=10)
    assert not space.is_alive()
    assert not platform.is_alive()
    on_it = SandboxConfig.objects.filter(backend=backend)
    granted = backend.spaces.filter(pk=world.space_a.pk).exists()
    assert granted or not on_it.exists(), errors
    assert len(errors) == 1, errors


def test_the_platforms_workspace_host_root_is_never_mounted_for_a_spaces_own_account(world: World) -> None:
    """Cube housekeeping sandboxes mount the whole workspace host root (every space's
    workspaces) and start from the config's template. On a space's own account that template
    is the space's own: the platform's root must not go there."""
    backend = make_backend(
        world.space_a,
        name="cube",
        kind="cube",
        endpoint="https://93.184.216.34",
        domain="cube.example",
        api_key="platform-key",
        allow_space_api_key=True,
        workspace_host_root="/srv/sandbox-workspaces",
    )
    platform = make_config(world.space_a, backend=backend, name="platform key", persistent_workspace=True)
    assert CubeOptions.parse(backend_config_for(platform).options).workspace_host_root == "/srv/sandbox-workspaces"
    own = make_config(world.space_a, backend=backend, name="own key", persistent_workspace=True)
    own.api_key_encrypted = encrypt("space-key")
    own.save()
    merged = backend_config_for(own)
    assert merged.api_key == "space-key"
    options = CubeOptions.parse(merged.options)
    assert (options.workspace_host_root, options.workspace_template, options.housekeeping_metadata) == ("", "", {})


def test_a_rerun_of_register_local_engine_gives_the_local_engine_the_folders_prepared_since(
    world: World, settings: Any, tmp_path: Path
) -> None:
    root = tmp_path / "package-sources"
    (root / "npm").mkdir(parents=True)
    settings.SKILL_PACKAGE_SOURCES_ROOT = root
    local = make_backend(world.space_a, name=LOCAL_ENGINE, apt_url="http://mirror.test/debian")
    call_command("register_local_engine", "--no-demo-config", stdout=StringIO())
    local.refresh_from_db()
    assert (local.npm_folder, local.apt_folder) == ("", "")  # the npm folder is not complete yet
    (root / "npm" / ".complete").write_text("docx\n")
    (root / "debian").mkdir()
    (root / "debian" / "Packages").write_text("")
    other = make_backend(world.space_a, name="Another engine")
    out = StringIO()
    call_command("register_local_engine", "--no-demo-config", stdout=out)
    local.refresh_from_db()
    other.refresh_from_db()
    assert local.npm_folder == "npm"
    assert local.apt_folder == ""  # the admin's apt mirror stays the source
    assert other.npm_folder == ""
    assert "package sources set (npm_folder)" in out.getvalue()
    event = AuditEvent.objects.get(action="platform_backend.update", target_id=str(local.id))
    assert event.details["after"] == {"npm_folder": "npm"}
    # Once set, a further run changes nothing.
    call_command("register_local_engine", "--no-demo-config", stdout=StringIO())
    assert AuditEvent.objects.filter(action="platform_backend.update").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_space_deleted_while_a_backend_is_granted_to_it_is_not_called_a_name_clash(world: World) -> None:
    """The grant's foreign key fails at commit (the space went meanwhile): the error says what
    happened, not that the name is taken, and nothing is saved."""
    from console.models import Space
    from console.services import Actor, ServiceError
    from sandboxes.catalog.platform import do_create_platform_backend

    gone = Space.objects.create(name="Gone")
    Space.objects.filter(pk=gone.pk).delete()  # `gone` is the page's stale copy
    data = {"name": "fresh name", "kind": "docker"}
    with pytest.raises(ServiceError) as raised:
        do_create_platform_backend(data=data, secrets={}, spaces=[world.space_a, gone], actor=Actor(world.root))
    assert "name" not in (raised.value.field_errors or {}), raised.value.field_errors
    assert "changed while" in str(raised.value)
    assert not PlatformBackend.objects.filter(name="fresh name").exists()
