"""The platform's backend form shows only the chosen kind's fields (generated from the
settings its adapter declares), with human labels and units, through the same by-kind mechanism as the
config form: without JavaScript a two-step form, with HTMX the fields swap; nothing is saved
until the kind's own fields are posted, and a bad one is a field error with nothing saved."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from console.crypto import decrypt, encrypt
from console.models import AuditEvent
from sandboxes.backends import BACKEND_CLASSES, describe
from sandboxes.catalog.bridge import backend_config_for, get_backend
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import make_backend, make_config
from tests.personas import World
from tests.support.pem import CERT, KEY, KEY_BODY

pytestmark = pytest.mark.django_db

CREATE = "sandboxes:backend_create"
ALWAYS = {"name", "kind", "endpoint", "allow_private_endpoints", "pip_index_url", "pip_find_links",
          "npm_registry_url", "npm_folder", "apt_folder", "apt_url", "apt_suite", "apt_trusted", "max_cpus",
          "max_memory_mb", "max_pool_size", "spaces"}  # fmt: skip


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
    expected = ALWAYS | description.backend_names
    assert _field_names(html) == expected
    assert f'data-kind-label="{description.label}"' in html
    assert description.setting("endpoint").help in html  # the endpoint's help is the kind's own
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


# Forged and odd requests against the by-kind platform backend form and the config form: each test
# names what it attacks. No fakes needed: the endpoints are 127.0.0.1:9, where nothing listens.


def _cube(**extra: Any) -> dict[str, Any]:
    return _e2b(kind="cube", fields_for="cube", **extra)


def _tls_docker(world: World) -> PlatformBackend:
    backend = make_backend(world.space_a, name="tls engine", kind="docker", endpoint="tcp://127.0.0.1:9",
                           allow_private_endpoints=True)  # fmt: skip
    backend.tls_ca_encrypted = encrypt(CERT + "\n")
    backend.tls_cert_encrypted = encrypt(CERT + "\n")
    backend.tls_key_encrypted = encrypt(KEY + "\n")
    backend.save()
    return backend


# --- Secrets left behind after a kind switch -------------------------------------------------


def test_docker_with_tls_edited_into_e2b_drops_its_client_key(world: World) -> None:
    """The Docker TLS client key/cert/CA are Docker's: an E2B backend takes none (its form
    refuses them when posted), so after the switch none may stay stored, nor reach the E2B
    adapter's options (the bridge offers whatever is stored to every kind)."""
    backend = _tls_docker(world)
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    saved = world.client_for("root").post(url, _e2b(name="tls engine", spaces=[str(world.space_a.id)]))
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else saved
    backend.refresh_from_db()
    assert backend.kind == "e2b"
    assert (backend.tls_ca_encrypted, backend.tls_cert_encrypted, backend.tls_key_encrypted) == ("", "", "")
    config = make_config(world.space_a, backend=backend, default_template="base")
    options = backend_config_for(config).options
    assert not {"tls_ca", "tls_cert", "tls_key"} & set(options.as_mapping())  # type: ignore[union-attr]


def test_e2b_key_does_not_stay_behind_on_a_docker_backend(world: World) -> None:
    """Docker takes no API key (its form refuses one): after E2B -> Docker the E2B account's
    key must not stay stored, to be sent again later to whatever endpoint the row gets next."""
    backend = make_backend(world.space_a, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.com", api_key="e2b_key", allow_private_endpoints=True)  # fmt: skip
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    saved = world.client_for("root").post(url, _docker(name="cloud", spaces=[str(world.space_a.id)]))
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else saved
    backend.refresh_from_db()
    assert backend.kind == "docker"
    assert decrypt(backend.api_key_encrypted) == ""


# --- Configs of several spaces on a backend switched to another kind --------------------------


def test_kind_switch_leaves_no_config_with_the_old_kinds_protocol(world: World) -> None:
    """A config's recorded (connection test) or pinned protocol is its kind's: e2b-v2 on a
    backend that is now Cube makes every open of that config fail (the Cube adapter refuses
    the option), sessions and the connection test included, with nothing on any page saying
    why. The switch must clear what was detected and refuse (or clear) another kind's pin."""
    backend = make_backend(world.space_a, world.space_b, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.com", api_key="e2b_key", allow_private_endpoints=True)  # fmt: skip
    detected = make_config(world.space_a, backend=backend, default_template="base", backend_protocol="e2b-v2")
    make_config(world.space_b, backend=backend, default_template="base")
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    spaces = [str(world.space_a.id), str(world.space_b.id)]
    response = world.client_for("root").post(url, _cube(name="cloud", spaces=spaces))
    assert response.status_code == 302, response.context["form"].errors if response.context else response
    backend.refresh_from_db()
    assert backend.kind == "cube"
    detected.refresh_from_db()
    assert detected.backend_protocol == ""
    get_backend(detected)  # the config opens on its new kind (no RemoteError invalid)


def test_kind_switch_with_a_config_pinned_to_the_old_kinds_protocol_is_a_clear_refusal(world: World) -> None:
    backend = make_backend(world.space_a, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.com", api_key="e2b_key", allow_private_endpoints=True)  # fmt: skip
    pinned = make_config(world.space_a, backend=backend, default_template="base", protocol_pin="e2b-v1")
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    response = world.client_for("root").post(url, _cube(name="cloud", spaces=[str(world.space_a.id)]))
    backend.refresh_from_db()
    pinned.refresh_from_db()
    if response.status_code == 302:  # saved: then the pin must not be another kind's
        assert not pinned.protocol_pin.startswith("e2b-"), (backend.kind, pinned.protocol_pin)
    else:
        assert response.status_code == 400
        assert "protocol" in response.content.decode().lower()
        assert backend.kind == "e2b"


# --- Forged requests that held (kept as regression tests) ------------------------------------


@pytest.mark.parametrize("who", ["alice", "charlie", "bob", "anonymous"])
def test_the_platform_form_and_its_partial_are_404_to_everyone_else(world: World, who: str) -> None:
    backend = make_backend(world.space_a, name="engine")
    client = world.client_for(who)
    htmx = {"HX-Request": "true", "HX-Target": "backend-form"}
    # The same request from a platform admin is the partial (the headers do reach the view).
    partial = world.client_for("root").get(reverse(CREATE), {"kind": "e2b"}, headers=htmx)
    assert partial.content.decode().lstrip().startswith('<div id="backend-form">')
    for url in (reverse(CREATE), reverse("sandboxes:backend_edit", args=[backend.id])):
        get = client.get(url, {"kind": "e2b"}, headers=htmx)
        post = client.post(url, {**_e2b(name="engine"), "choose_kind": "1"}, headers=htmx)
        if who == "anonymous":
            assert get.status_code == post.status_code == 302  # to the login page
        else:
            assert get.status_code == post.status_code == 404
        assert b"backend-form" not in get.content + post.content
    saved = client.post(reverse("sandboxes:backend_edit", args=[backend.id]), _e2b(name="engine"))
    assert saved.status_code in (302, 404)
    backend.refresh_from_db()
    assert backend.kind == "docker"
    assert PlatformBackend.objects.count() == 1


def test_csrf_is_required(world: World) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.root)
    assert client.post(reverse(CREATE), _docker()).status_code == 403
    assert not PlatformBackend.objects.exists()


@pytest.mark.parametrize(
    "data",
    [
        {**_docker(), "kind": ""},
        {k: v for k, v in _docker().items() if k != "kind"},
        _docker(kind="vmware", fields_for="docker"),
        _docker(kind="docker\x00", fields_for="docker"),
        _docker(name="a\x00b"),
        _e2b(api_key="k\x00ey"),
        _docker(name="x" * 100_000),
        _e2b(endpoint="http://127.0.0.1:9/" + "a" * 600),
        _e2b(domain="d" * 300 + ".example"),
        _docker(max_pids="9" * 40),
        _docker(max_cpus="1e400"),
        _docker(max_memory_mb="-1"),
        _e2b(endpoint="http://user:pass@127.0.0.1:9"),
        _e2b(endpoint="http://127.0.0.1:9", allow_private_endpoints=""),
        _e2b(endpoint="http://169.254.169.254"),
        _e2b(sandbox_url="http://u:p@127.0.0.1:9"),
        _e2b(sandbox_url="http://[fe80::1]/"),
        _docker(endpoint="tcp://169.254.169.254:2376", allow_private_endpoints="on"),
        _docker(endpoint="ssh://root@169.254.169.254"),
        _docker(endpoint="tcp://0.0.0.0:2375", allow_private_endpoints="on"),
        _e2b(endpoint="http://[::ffff:169.254.169.254]"),
        _docker(tls_key=KEY, endpoint=""),  # TLS without tcp://
        _e2b(tls_key=KEY),  # a secret of another kind
        _e2b(tls_cert=CERT),
        _docker(api_key="sk-posted-secret"),
        {**_e2b(kind="docker"), "fields_for": "docker"},  # e2b's fields under docker: the key is refused
    ],
)
def test_odd_input_is_a_clear_error_and_saves_nothing(world: World, data: dict[str, Any]) -> None:
    response = world.client_for("root").post(reverse(CREATE), data)
    assert response.status_code in (200, 400), response.status_code
    if response.status_code == 200:  # a first step again, never a save
        assert "Step 1 of 2" in response.content.decode() or 'name="fields_for"' in response.content.decode()
    assert not PlatformBackend.objects.exists()
    html = response.content.decode()
    assert KEY_BODY not in html  # a posted secret is never rendered back
    assert "sk-posted-secret" not in html


def test_fields_of_kind_a_posted_with_kind_b_between_steps_save_nothing(world: World) -> None:
    """Step 1 shown for Docker, kind switched to E2B in the post: the E2B fields first."""
    response = world.client_for("root").post(reverse(CREATE), {**_docker(tls_key=KEY), "kind": "e2b"})
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="fields_for" value="e2b"' in html
    assert KEY_BODY not in html
    assert not PlatformBackend.objects.exists()


def test_double_submit_and_name_collision_are_field_errors(world: World) -> None:
    root = world.client_for("root")
    assert root.post(reverse(CREATE), _docker()).status_code == 302
    again = root.post(reverse(CREATE), _docker())
    assert again.status_code == 400
    assert "name" in again.context["form"].errors
    other = make_backend(name="other")
    edit = root.post(reverse("sandboxes:backend_edit", args=[other.id]), _docker(name="engine"))
    assert edit.status_code == 400
    assert "name" in edit.context["form"].errors
    assert PlatformBackend.objects.count() == 2


def test_config_form_by_kind_with_a_backend_not_granted(world: World) -> None:
    granted = make_backend(world.space_a, name="granted")
    hidden = make_backend(world.space_b, name="hidden e2b", kind="e2b", endpoint="http://127.0.0.1:9",
                          domain="e2b.example.com", api_key="e2b_key", allow_private_endpoints=True)  # fmt: skip
    alice = world.client_for("alice")
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    htmx = {"HX-Request": "true", "HX-Target": "config-form"}
    for response in (
        alice.get(url, {"backend": str(hidden.id)}, headers=htmx),
        alice.post(url, {"backend": str(hidden.id), "choose_backend": "1", "name": "x"}, headers=htmx),
        alice.post(
            url,
            {
                "backend": str(hidden.id),
                "fields_for": str(hidden.id),
                "name": "x",
                "default_template": "base",
                "cpus": "1",
                "memory_mb": "512",
            },
        ),
        alice.post(url, {"backend": str(hidden.id), "fields_for": str(granted.id), "name": "x"}),
        alice.post(url, {"backend": "not-a-uuid\x00", "name": "x"}),
    ):
        assert response.status_code in (200, 400)
        assert "hidden e2b" not in response.content.decode()
        assert 'id="id_protocol_pin"' not in response.content.decode()  # E2B's fields were never shown
    assert not SandboxConfig.objects.exists()


def test_kind_switch_while_the_old_account_is_down_and_sessions_are_recorded_live(world: World) -> None:
    """The live-sandbox check skips a config whose old account does not answer
    (platform.do_update_platform_backend: `except RemoteError: continue`), so with the E2B
    endpoint down for a moment the backend becomes Cube while sessions of two spaces are
    recorded running/paused on E2B sandboxes: those sandboxes are orphaned on the E2B account
    (never deleted, never idled) and the sessions point to a kind that cannot serve them."""
    from sandboxes.models import Session, SessionState

    backend = make_backend(world.space_a, world.space_b, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.com", api_key="e2b_key", allow_private_endpoints=True)  # fmt: skip
    for space, state in ((world.space_a, SessionState.RUNNING), (world.space_b, SessionState.PAUSED)):
        config = make_config(space, backend=backend, default_template="base")
        Session.objects.create(space=space, config=config, key=f"k-{space.slug}", sandbox_id="e2b-sbx", state=state)
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    spaces = [str(world.space_a.id), str(world.space_b.id)]
    response = world.client_for("root").post(url, _cube(name="cloud", spaces=spaces))
    backend.refresh_from_db()
    assert backend.kind == "e2b", "switched while sessions were recorded live on the unreachable old account"
    assert response.status_code == 400


def test_a_spaces_own_key_does_not_outlive_a_switch_to_a_kind_without_keys(world: World) -> None:
    """E2B with spaces' own keys -> Docker: the space's key must not stay stored on its config,
    to be used again (on whatever endpoint) once the row takes keys again."""
    backend = make_backend(world.space_a, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9",
                           domain="e2b.example.com", api_key="e2b_key", allow_space_api_key=True)  # fmt: skip
    config = make_config(world.space_a, backend=backend, default_template="base")
    SandboxConfig.objects.filter(pk=config.pk).update(api_key_encrypted=encrypt("space_own_key"))
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    saved = world.client_for("root").post(url, _docker(name="cloud", spaces=[str(world.space_a.id)]))
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else saved
    config.refresh_from_db()
    assert decrypt(config.api_key_encrypted) == ""


@pytest.mark.parametrize("url_field", ["pip_index_url", "npm_registry_url", "apt_url"])
def test_a_package_source_is_judged_by_the_private_switch_as_the_form_reads_it(world: World, url_field: str) -> None:
    # "false" is the checkbox unticked (Django's CheckboxInput), yet the URL check read the raw
    # post as true and let a private package source through on a backend without private endpoints.
    data = _docker(allow_private_endpoints="false", **{url_field: "http://127.0.0.1:1/simple/"})
    response = world.client_for("root").post(reverse(CREATE), data)
    assert response.status_code == 400
    assert url_field in response.context["form"].errors
    assert not PlatformBackend.objects.exists()


@pytest.mark.parametrize("folder_field", ["pip_find_links", "npm_folder", "apt_folder"])
def test_a_package_folder_is_a_plain_name_of_a_folder_under_the_sources_root(
    world: World, folder_field: str, settings: Any, tmp_path: Path
) -> None:
    settings.SKILL_PACKAGE_SOURCES_ROOT = tmp_path
    (tmp_path / "offline").mkdir()
    (tmp_path / "a-file").write_text("not a folder")
    client = world.client_for("root")
    for name, error in (
        ("../offline", "A folder name: letters, digits, '.', '_' and '-' (no paths)."),
        ("missing", f"There is no folder 'missing' under {tmp_path}."),
        ("a-file", f"There is no folder 'a-file' under {tmp_path}."),
    ):
        response = client.post(reverse(CREATE), _docker(**{folder_field: name}))
        assert response.status_code == 400
        assert response.context["form"].errors[folder_field] == [error]
    assert not PlatformBackend.objects.exists()
    saved = client.post(reverse(CREATE), _docker(**{folder_field: " offline "}))
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else saved
    assert getattr(PlatformBackend.objects.get(), folder_field) == "offline"


def test_an_apt_source_is_saved_and_its_bad_values_named(world: World, settings: Any, tmp_path: Path) -> None:
    settings.SKILL_PACKAGE_SOURCES_ROOT = tmp_path
    (tmp_path / "debian").mkdir()
    client = world.client_for("root")
    bad = _docker(apt_folder="../etc", apt_suite="bookworm; rm -rf /", apt_url="ftp://mirror.test/debian")
    response = client.post(reverse(CREATE), bad)
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert errors["apt_folder"] == ["A folder name: letters, digits, '.', '_' and '-' (no paths)."]
    assert errors["apt_suite"] == ["The suite, then its components, separated by spaces (e.g. 'bookworm main')."]
    assert errors["apt_url"] == ["An http(s) URL."]
    missing = client.post(reverse(CREATE), _docker(apt_folder="nothere"))
    assert missing.context["form"].errors["apt_folder"] == [f"There is no folder 'nothere' under {tmp_path}."]
    assert not PlatformBackend.objects.exists()

    saved = client.post(reverse(CREATE), _docker(apt_folder="debian", apt_suite="  bookworm   main "))
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else saved
    backend = PlatformBackend.objects.get()
    assert (backend.apt_folder, backend.apt_suite, backend.apt_url, backend.apt_trusted) == (
        "debian",
        "bookworm main",
        "",
        False,
    )


@pytest.mark.parametrize("url_field", ["pip_index_url", "npm_registry_url", "apt_url"])
@pytest.mark.parametrize("tail", ["\ndeb [trusted=yes] http://127.0.0.2/ ./", " [trusted=yes]", "\t./"])
def test_a_package_source_url_with_whitespace_inside_is_refused(world: World, url_field: str, tail: str) -> None:
    # A URL parser drops newlines and tabs before reading the host, so the endpoint check
    # passed; apt then got the rest as a second sources.list line (another, trusted source).
    data = _docker(allow_private_endpoints="on", **{url_field: f"http://127.0.0.1:1/debian{tail}"})
    response = world.client_for("root").post(reverse(CREATE), data)
    assert response.status_code == 400
    assert response.context["form"].errors[url_field] == ["A URL without spaces or control characters."]
    assert not PlatformBackend.objects.exists()


def test_the_warm_pool_limit_is_set_on_the_backend_form_and_kept_when_left_out(world: World) -> None:
    backend = make_backend(world.space_a, name="engine", kind="docker")
    root = world.client_for("root")
    url = reverse("sandboxes:backend_edit", args=[backend.id])
    assert 'name="max_pool_size"' in root.get(url).content.decode()
    saved = root.post(url, {**_docker(), "max_pool_size": "7", "spaces": [str(world.space_a.id)]})
    assert saved.status_code == 302, saved.context["form"].errors if saved.context else ""
    backend.refresh_from_db()
    assert backend.max_pool_size == 7
    # A post without it (an older form, a script) keeps the stored limit.
    kept = root.post(url, {**_docker(), "spaces": [str(world.space_a.id)]})
    assert kept.status_code == 302
    backend.refresh_from_db()
    assert backend.max_pool_size == 7
    too_big = root.post(url, {**_docker(), "max_pool_size": "5000", "spaces": [str(world.space_a.id)]})
    assert too_big.status_code == 400
    assert "max_pool_size" in too_big.context["form"].errors
    backend.refresh_from_db()
    assert backend.max_pool_size == 7
