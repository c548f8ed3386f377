"""Session pages for people: actions shown by state, copy buttons, starting a session from
the console, and the demo space's Docker config made by `register_local_engine`."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from console.models import AuditEvent, NetworkPolicy, Space
from console.services import SYSTEM, do_create_space
from sandboxes.management.commands.register_local_engine import DEMO_CONFIG, NAME
from sandboxes.models import PlatformBackend, SandboxConfig, Session, SessionState
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db


def _actions(html: str) -> set[str]:
    block = html.split('id="session-actions"', 1)[1].split("</div>", 1)[0]
    return set(re.findall(r'id="(action-\w+|open-terminal)"', block))


@pytest.mark.parametrize(
    ("state", "sandbox_id", "expected"),
    [
        (SessionState.RUNNING, "abc123", {"action-pause", "open-terminal"}),
        (SessionState.PAUSED, "abc123", {"action-resume"}),
        (SessionState.STOPPED, "abc123", {"action-start"}),
        (SessionState.NEW, "", {"action-start"}),
        (SessionState.GONE, "", {"action-start"}),
    ],
)
def test_actions_are_shown_by_state(world: World, state: str, sandbox_id: str, expected: set[str]) -> None:
    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    session = Session.objects.create(space=world.space_a, key="s-1", config=config, state=state, sandbox_id=sandbox_id)
    html = world.client_for("bob").get(session.get_absolute_url()).content.decode()
    assert _actions(html) == expected
    viewer = world.client_for("carol").get(session.get_absolute_url()).content.decode()
    assert 'id="session-actions"' not in viewer


def test_session_page_has_breadcrumbs_and_a_copy_button_for_its_key(world: World) -> None:
    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    session = Session.objects.create(space=world.space_a, key="copy-me", config=config)
    html = world.client_for("bob").get(session.get_absolute_url()).content.decode()
    assert '<nav class="breadcrumbs" aria-label="Breadcrumb">' in html
    assert '<li aria-current="page">copy-me</li>' in html
    assert 'data-copy="copy-me"' in html
    assert '<a class="skip-link" href="#main">' in html


def test_a_new_api_token_has_a_copy_button(world: World) -> None:
    url = reverse("sandboxes:token_list", args=[world.space_a.id])
    html = world.client_for("alice").post(url, {"name": "agent"}).content.decode()
    secret = re.search(r'id="new-token-secret">([^<]+)</pre>', html).group(1)  # type: ignore[union-attr]
    assert f'id="copy-new-token" data-copy="{secret}"' in html


def test_a_300_entry_allow_list_is_folded_with_its_count(world: World) -> None:
    entries = [f"host{i:03d}.example.com" for i in range(300)]
    NetworkPolicy.objects.update_or_create(
        space=world.space_a, defaults={"allow_internet_access": True, "allow_out": entries, "deny_out": ["0.0.0.0/0"]}
    )
    html = world.client_for("carol").get(world.space_a.get_absolute_url()).content.decode()
    assert "Outbound: on, only to the 300 entries of the allow list" in html
    assert ", ".join(entries[:3]) not in html  # no wall of text
    allow = html.split('<div class="long-list" data-count="300">', 1)[1].split("</div>", 1)[0]
    folded, rest = allow.split("<details", 1)
    assert folded.count("<li>") == 10
    assert "Show all 300" in rest
    assert rest.count("<li>") == 290


def test_starting_a_session_checks_the_key_and_the_role(world: World) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    url = reverse("sandboxes:session_start", args=[world.space_a.id])
    bad = world.client_for("bob").post(url, {"key": "../etc"}, follow=True)
    assert "A session key is 1-128 letters" in bad.content.decode()
    assert not Session.objects.exists()
    assert world.client_for("carol").post(url, {"key": "x"}).status_code == 403
    assert world.client_for("charlie").post(url, {"key": "x"}).status_code == 404
    assert world.client_for("bob").get(url).status_code == 405  # a GET never starts anything
    offline = world.client_for("bob").post(url, {"key": "offline"}, follow=True)
    assert "The backend said unavailable" in offline.content.decode()
    listing = world.client_for("bob").get(reverse("sandboxes:session_list")).content.decode()
    assert 'id="start-session"' in listing


@pytest.mark.docker
def test_starting_a_session_from_the_console(world: World, session_config: SandboxConfig) -> None:
    url = reverse("sandboxes:session_start", args=[world.space_a.id])
    response = world.client_for("bob").post(url, {"key": "tried-by-hand"})
    session = Session.objects.get(space=world.space_a, key="tried-by-hand")
    assert response.status_code == 302
    assert response["Location"] == session.get_absolute_url()
    assert session.state == SessionState.RUNNING
    assert session.sandbox_id
    assert AuditEvent.objects.filter(action="session.create", actor_name="bob").exists()
    html = world.client_for("bob").get(session.get_absolute_url()).content.decode()
    assert _actions(html) == {"action-pause", "open-terminal"}
    assert f'data-copy="{session.sandbox_id}"' in html


@pytest.fixture
def demo_space(db: None) -> Space:
    from tests.factories import make_user

    make_user("demo-admin", superuser=True)
    return do_create_space(name="Demo", slug="demo", description="", actor=SYSTEM)


@pytest.mark.docker
def test_register_local_engine_gives_the_demo_space_a_docker_config(demo_space: Space, docker_base_image: str) -> None:
    out = StringIO()
    call_command("register_local_engine", stdout=out)
    backend = PlatformBackend.objects.get(name=NAME)
    config = SandboxConfig.objects.get(space=demo_space)
    assert config.name == DEMO_CONFIG
    assert config.backend == backend
    assert config.is_default
    assert config.default_template == docker_base_image
    assert "Created the config" in out.getvalue()
    # Idempotent: a second run adds nothing.
    call_command("register_local_engine", stdout=StringIO())
    assert PlatformBackend.objects.count() == 1
    assert SandboxConfig.objects.count() == 1
    assert AuditEvent.objects.filter(action="sandbox_config.create").count() == 1


def test_register_local_engine_makes_no_config_when_no_engine_answers(
    demo_space: Space, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///tmp/no-such-docker-engine.sock")
    out = StringIO()
    call_command("register_local_engine", stdout=out)
    assert PlatformBackend.objects.filter(name=NAME).exists()
    assert not SandboxConfig.objects.exists()
    assert "does not answer" in out.getvalue()
