"""Sandbox configs, the template catalog and the capability matrix, against the real engine."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.urls import reverse

from console.crypto import encrypt
from console.jobs import run_job
from console.models import AdminJob, AuditEvent, JobStatus, NetworkPolicy
from sandboxes.backends.base import META_CONFIG, META_INSTALLATION, ListQuery, NetworkSpec, RemoteError, SandboxSpec
from sandboxes.backends.docker.egress.proxy import squid_available
from sandboxes.backends.docker.settings import DockerOptions
from sandboxes.catalog import bridge
from sandboxes.catalog.bridge import console_metadata, get_backend
from sandboxes.catalog.templates import owner_labels
from sandboxes.catalog.tuning import CATALOG
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import config_form, make_backend, make_config
from tests.personas import World
from tests.support.pem import CERT

pytestmark = pytest.mark.django_db


@pytest.fixture
def local_backend(world: World) -> PlatformBackend:
    """The local Docker engine, granted to space A (as a platform admin would)."""
    backend: PlatformBackend = make_backend(world.space_a, name="local engine")
    return backend


def config_form_data(on: PlatformBackend | None = None, **overrides: Any) -> dict[str, Any]:
    return config_form(on or PlatformBackend.objects.get(name="local engine"), **overrides)


# --- Access ------------------------------------------------------------------------------


def config_urls(config: SandboxConfig) -> dict[str, str]:
    return {
        "detail": reverse("sandboxes:config_detail", args=[config.id]),
        "edit": reverse("sandboxes:config_edit", args=[config.id]),
        "delete": reverse("sandboxes:config_delete", args=[config.id]),
        "test": reverse("sandboxes:config_test", args=[config.id]),
        "templates": reverse("sandboxes:template_list", args=[config.id]),
        "template_build": reverse("sandboxes:template_build", args=[config.id]),
        "template_delete": reverse("sandboxes:template_delete", args=[config.id]) + "?id=x",
        "snapshot_delete": reverse("sandboxes:snapshot_delete", args=[config.id]) + "?id=snap-x",
    }


@pytest.fixture
def unreachable_config(world: World) -> SandboxConfig:
    """A config whose engine does not answer: access checks must not depend on the backend."""
    config: SandboxConfig = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock")
    return config


@pytest.mark.parametrize("view", ["detail", "edit", "delete", "templates", "template_build", "template_delete"])
def test_outsider_gets_404_on_every_config_page(world: World, unreachable_config: SandboxConfig, view: str) -> None:
    assert world.client_for("charlie").get(config_urls(unreachable_config)[view]).status_code == 404
    # Read-only pages (detail, templates) answer POST with 405 before any lookup, revealing nothing.
    assert world.client_for("charlie").post(config_urls(unreachable_config)[view]).status_code in (404, 405)


@pytest.mark.parametrize("persona", ["bob", "carol"])
@pytest.mark.parametrize("view", ["edit", "delete", "test", "template_build", "template_delete", "snapshot_delete"])
def test_members_and_viewers_cannot_change_configs(
    world: World, unreachable_config: SandboxConfig, persona: str, view: str
) -> None:
    before = (AuditEvent.objects.count(), AdminJob.objects.count())
    assert world.client_for(persona).post(config_urls(unreachable_config)[view]).status_code == 403
    assert (AuditEvent.objects.count(), AdminJob.objects.count()) == before


def test_anonymous_is_sent_to_login(unreachable_config: SandboxConfig) -> None:
    from django.test import Client

    response = Client().get(config_urls(unreachable_config)["detail"])
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_config_create_is_for_space_admins(world: World, local_backend: PlatformBackend) -> None:
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    assert world.client_for("charlie").get(url).status_code == 404
    assert world.client_for("bob").post(url, config_form_data()).status_code == 403
    assert not SandboxConfig.objects.exists()


def test_config_list_is_scoped(world: World, unreachable_config: SandboxConfig) -> None:
    make_config(world.space_b, name="b-secret")
    body = world.client_for("carol").get(reverse("sandboxes:config_list")).content.decode()
    assert unreachable_config.name in body
    assert "b-secret" not in body
    matrix = world.client_for("charlie").get(reverse("sandboxes:capability_matrix")).content.decode()
    assert "b-secret" in matrix
    assert unreachable_config.name not in matrix


# --- Validation and secrets --------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"default_template": "snap-0123abcd"}, "default_template", "are not templates"),
        ({"cpus": "0"}, "cpus", "greater than or equal to 0.1"),
        ({"memory_mb": "8"}, "memory_mb", "greater than or equal to 64"),
        ({"idle_timeout_s": "5"}, "idle_timeout_s", "greater than or equal to 60"),
        ({"name": "  "}, "name", "required"),
        ({"backend": ""}, "backend", "required"),
        ({"backend": "not-a-uuid"}, "backend", "is not a valid UUID"),
        # A protocol pin is not on a Docker config's form (tests/sandboxes/catalog/test_config_form_kinds.py).
    ],
)
def test_bad_config_input_is_a_field_error_and_saves_nothing(
    world: World, local_backend: PlatformBackend, overrides: dict[str, str], field: str, message: str
) -> None:
    response = world.client_for("alice").post(
        reverse("sandboxes:config_create", args=[world.space_a.id]), config_form_data(None, **overrides)
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert any(message in error for error in errors.get(field, [])), errors
    assert not SandboxConfig.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="sandbox_config").exists()


def test_a_cube_config_without_host_root_says_its_workspace_is_unsupported(world: World) -> None:
    config = make_config(world.space_a, kind="cube", endpoint="https://api.example.com", domain="x.example.com")
    detail = world.client_for("carol").get(config.get_absolute_url()).content.decode()
    assert 'id="workspace-unsupported"' in detail
    assert "without a workspace host root" in detail


def test_duplicate_config_name_in_a_space_is_a_field_error(world: World, local_backend: PlatformBackend) -> None:
    make_config(world.space_a, name="main", backend=local_backend)
    response = world.client_for("alice").post(
        reverse("sandboxes:config_create", args=[world.space_a.id]), config_form_data(name="main")
    )
    assert response.status_code == 400
    assert SandboxConfig.objects.count() == 1


# --- Against the real Docker engine ------------------------------------------------------


@pytest.fixture
def docker_config(world: World, docker_base_image: str, local_backend: PlatformBackend) -> SandboxConfig:
    config: SandboxConfig = make_config(
        world.space_a, name="local docker", default_template=docker_base_image, backend=local_backend
    )
    return config


def run_queued_job() -> AdminJob:
    job = AdminJob.objects.filter(status=JobStatus.QUEUED).latest("created")
    run_job(str(job.id))
    job.refresh_from_db()
    return job


@pytest.mark.docker
def test_test_connection_runs_each_step_and_records_the_version(world: World, docker_config: SandboxConfig) -> None:
    response = world.client_for("alice").post(reverse("sandboxes:config_test", args=[docker_config.id]))
    assert response.status_code == 302
    job = run_queued_job()
    assert job.status == JobStatus.SUCCEEDED, job.error
    steps = job.result["steps"]
    assert [s["name"] for s in steps] == [
        "health",
        "persistent workspace",
        "create",
        "exec",
        "delete",
        "network policy",
    ]
    assert all(s["ok"] and s["ms"] > 0 for s in steps)
    assert steps[1]["detail"].startswith("named volumes (")
    assert "uid 1000" in steps[3]["detail"]
    docker_config.refresh_from_db()
    assert docker_config.backend_version.startswith("Docker ")
    assert AuditEvent.objects.filter(action="job.start", details__kind="sandboxes.test_connection").count() == 1
    job_page = world.client_for("alice").get(job.get_absolute_url()).content.decode()
    assert (
        '<table class="list compact"><thead><tr><th>Name</th><th>OK</th><th>Detail</th><th>Time (ms)</th>' in job_page
    )
    page = world.client_for("alice").get(docker_config.get_absolute_url()).content.decode()
    assert "health" in page
    assert "Succeeded" in page


@pytest.mark.docker
def test_unknown_template_fails_the_create_step_with_a_clear_message(
    world: World, docker_config: SandboxConfig
) -> None:
    SandboxConfig.objects.filter(pk=docker_config.pk).update(default_template="sandbox-console/nope:latest")
    world.client_for("alice").post(reverse("sandboxes:config_test", args=[docker_config.id]))
    job = run_queued_job()
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("step create failed: not_found")
    assert "sandbox-console/nope:latest" in job.error


@pytest.mark.docker
def test_an_engine_that_does_not_answer_is_a_message_not_a_500(world: World, unreachable_config: SandboxConfig) -> None:
    client = world.client_for("alice")
    page = client.get(reverse("sandboxes:template_list", args=[unreachable_config.id]))
    assert page.status_code == 200
    assert "The backend said unavailable" in page.content.decode()
    client.post(reverse("sandboxes:config_test", args=[unreachable_config.id]))
    job = run_queued_job()
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("step health failed: unavailable")
    edit = client.get(reverse("sandboxes:config_edit", args=[unreachable_config.id]))
    assert edit.status_code == 200  # the picker falls back to a text field


@pytest.fixture
def live_sandbox(docker_config: SandboxConfig, test_run_id: str) -> Iterator[str]:
    backend = get_backend(docker_config)
    info = backend.create(
        SandboxSpec(
            template_id=docker_config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata=console_metadata(docker_config, **{"test-run": test_run_id}),
        )
    )
    try:
        yield info.sandbox_id
    finally:
        backend.delete(info.sandbox_id)


@pytest.mark.docker
def test_snapshots_are_listed_apart_and_never_offered_as_templates(
    world: World, docker_config: SandboxConfig, live_sandbox: str, test_run_id: str
) -> None:
    backend = get_backend(docker_config)
    snapshots = backend.snapshots()
    assert snapshots is not None
    # Labelled with the space as the console labels its own snapshots (sandboxes.catalog).
    labels = {**owner_labels(docker_config), "test-run": test_run_id}
    snapshot = snapshots.create(live_sandbox, name="pytest", labels=labels)
    client = world.client_for("alice")
    page = client.get(reverse("sandboxes:template_list", args=[docker_config.id]))
    templates_html = page.content.decode().split('id="snapshots"')[0]
    snapshots_html = page.content.decode().split('id="snapshots"')[1]
    assert docker_config.default_template in templates_html
    assert snapshot.snapshot_id not in templates_html
    assert snapshot.snapshot_id in snapshots_html
    form = client.get(reverse("sandboxes:config_edit", args=[docker_config.id])).context["form"]
    choices = [value for value, _ in form.fields["default_template"].choices]
    assert docker_config.default_template in choices
    assert not any(choice.startswith("snap-") for choice in choices)
    build_form = client.get(reverse("sandboxes:template_build", args=[docker_config.id])).context["form"]
    assert not any(str(v).startswith("snap-") for v, _ in build_form.fields["base_template_id"].choices)
    # Even posted by hand, a snapshot id is refused as the default template.
    data = config_form_data(name=docker_config.name, default_template=snapshot.snapshot_id)
    response = client.post(reverse("sandboxes:config_edit", args=[docker_config.id]), data)
    assert response.status_code == 400


@pytest.mark.docker
def test_identity_fields_are_frozen_while_sandboxes_live(
    world: World, docker_config: SandboxConfig, live_sandbox: str
) -> None:
    client = world.client_for("alice")
    url = reverse("sandboxes:config_edit", args=[docker_config.id])
    other = make_backend(world.space_a, name="other engine", endpoint="unix:///var/run/other.sock")
    data = config_form_data(other, name=docker_config.name)
    response = client.post(url, data)
    assert response.status_code == 400
    assert "1 live sandbox(es) use this config" in response.content.decode()
    docker_config.refresh_from_db()
    assert docker_config.backend == docker_config.backend.__class__.objects.get(name="local engine")
    # Non-identity fields still change while sandboxes live.
    assert client.post(url, config_form_data(name=docker_config.name, memory_mb="768")).status_code == 302
    backend = get_backend(docker_config)
    listed = list(
        backend.iter_sandboxes(
            ListQuery(
                metadata={META_CONFIG: str(docker_config.id), META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}
            )
        )
    )
    assert [s.sandbox_id for s in listed] == [live_sandbox]


@pytest.mark.docker
def test_capabilities_come_from_the_accessors_and_unsupported_policy_is_said(
    world: World, docker_config: SandboxConfig
) -> None:
    # Docker honours allow/deny lists and inbound; HTTP rules where squid runs (docs/network.md).
    NetworkPolicy.objects.filter(space=world.space_a).update(
        allow_internet_access=True,
        deny_out=["198.51.100.0/24"],
        allow_out=["pypi.org"],
        l7_rules=[{"domain": "pypi.org", "methods": ["GET"], "path_prefix": "/simple/", "action": "allow"}],
    )
    client = world.client_for("carol")
    matrix = client.get(reverse("sandboxes:capability_matrix")).content.decode()
    assert 'data-capability="files">✓' in matrix
    assert 'data-capability="inbound">✓' in matrix  # the console serves Docker ports (docs/inbound.md)
    detail = client.get(docker_config.get_absolute_url()).content.decode()
    assert 'id="workspace-unsupported"' not in detail  # Docker keeps /workspace on a volume
    if squid_available():  # the HTTP rules go through the console's squid
        assert "cannot honour part of Space A" not in detail
        assert "HTTP (L7) rule(s)" not in detail
    else:
        assert "cannot honour part of Space A" in detail
        assert "1 HTTP (L7) rule(s)" in detail
    assert "CIDR deny entries (198.51.100.0/24)" not in detail  # honoured on Docker now
    assert "domain allow entries (pypi.org)" not in detail


def test_first_config_is_the_default_and_another_can_take_over(world: World, local_backend: PlatformBackend) -> None:
    client = world.client_for("alice")
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    assert client.post(url, config_form_data(name="first")).status_code == 302
    assert client.post(url, config_form_data(name="second")).status_code == 302
    first, second = SandboxConfig.objects.get(name="first"), SandboxConfig.objects.get(name="second")
    assert (first.is_default, second.is_default) == (True, False)
    edit = reverse("sandboxes:config_edit", args=[second.id])
    assert client.post(edit, config_form_data(name="second", is_default="on")).status_code == 302
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.is_default, second.is_default) == (False, True)


def test_the_operators_upstream_resolver_reaches_the_docker_adapter(
    world: World, local_backend: PlatformBackend, settings: Any
) -> None:
    config = make_config(world.space_a, name="resolver")
    settings.EGRESS_DNS_UPSTREAM = "127.0.0.1#5353"
    settings.EGRESS_STATE_DIR = "/run/elsewhere"
    backend = get_backend(config)
    options = DockerOptions.parse(backend.config.options)
    assert options.dns_upstream == "127.0.0.1#5353"
    assert options.egress_state_dir == "/run/elsewhere"
    assert options.egress_log_max_bytes == CATALOG.egress_log_max_bytes
    settings.EGRESS_DNS_UPSTREAM = "not an address"
    bridge._backends.clear()  # settings are read when a backend is built
    with pytest.raises(RemoteError, match="dns_upstream"):
        get_backend(config)


def test_an_older_copy_of_a_config_takes_the_edited_adapter_and_evicts_nothing(world: World) -> None:
    # A long call (an exec, a terminal, a command's pump) holds the config it loaded before an
    # admin's edit; its next backend call must use the saved settings, and never close and
    # replace the adapter built for them with one of the old settings.
    config = make_config(world.space_a, name="edited", idle_mode="pause")
    held = SandboxConfig.objects.select_related("backend").get(pk=config.pk)
    assert get_backend(held).config.idle_mode == "pause"
    config.idle_mode = "stop"
    config.save()
    edited = get_backend(config)
    assert edited.config.idle_mode == "stop"
    assert get_backend(held) is edited
    assert get_backend(config) is edited
    # An edit of its platform backend likewise.
    config.backend.tls_ca_encrypted = encrypt(CERT + "\n")
    config.backend.save()
    again = get_backend(SandboxConfig.objects.select_related("backend").get(pk=config.pk))
    assert DockerOptions.parse(again.config.options).tls_ca.startswith("-----BEGIN CERTIFICATE-----")
    assert get_backend(held) is again
    assert get_backend(config) is again


def test_an_edit_saved_by_a_clock_behind_still_replaces_the_adapter(world: World) -> None:
    # Two hosts' clocks disagree: the edit's `updated` is earlier than the kept adapter's row.
    config = make_config(world.space_a, name="skewed", idle_mode="pause")
    first = get_backend(config)
    assert first.config.idle_mode == "pause"
    behind = config.updated - timedelta(minutes=5)
    SandboxConfig.objects.filter(pk=config.pk).update(idle_mode="stop", updated=behind)
    edited = SandboxConfig.objects.select_related("backend").get(pk=config.pk)

    current = get_backend(edited)

    assert current is not first
    assert current.config.idle_mode == "stop"
    assert get_backend(config) is current  # the copy from before the edit, too
    # A second edit, further behind, likewise.
    SandboxConfig.objects.filter(pk=config.pk).update(idle_mode="pause", updated=behind - timedelta(minutes=5))
    again = get_backend(SandboxConfig.objects.select_related("backend").get(pk=config.pk))
    assert again is not current
    assert again.config.idle_mode == "pause"


def test_a_config_moved_to_a_backend_of_another_kind_forgets_the_old_kinds_protocol(world: World) -> None:
    # The protocol recorded by the old kind's server (e2b-v1) went to the Cube adapter, which
    # refuses it: every call on the moved config failed, Test connection included.
    common: dict[str, Any] = {"endpoint": "http://127.0.0.1:9", "domain": "sandbox.example.test", "api_key": "k",
                              "allow_private_endpoints": True}  # fmt: skip
    e2b = make_backend(world.space_a, name="e2b backend", kind="e2b", **common)
    cube = make_backend(world.space_a, name="cube backend", kind="cube", **common)
    config = make_config(world.space_a, backend=e2b, name="moved", default_template="base")
    SandboxConfig.objects.filter(pk=config.pk).update(backend_protocol="e2b-v1", backend_version="E2B API at …")
    url = reverse("sandboxes:config_edit", args=[config.id])
    data = config_form(cube, name="moved", default_template="base", disk_mb="1024", fields_for=str(cube.pk))
    response = world.client_for("alice").post(url, data)
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    moved = SandboxConfig.objects.select_related("backend").get(pk=config.pk)
    assert (moved.backend, moved.backend_protocol, moved.backend_version) == (cube, "", "")
    assert get_backend(moved).kind == "cube"  # builds: the release is probed when needed
