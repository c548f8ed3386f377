"""The sessions list and the config form in Chromium, against the live console (Daphne) and
the real Docker engine: two sessions found by label, paused in one action and resumed in
another (each through its confirmation page and one job followed in place); the list refreshing itself while the tab is
visible and not while hidden, a box ticked while a refresh was on the way staying on its own
row; CPU figures of the running rows; and the config form keeping a value typed while its
backend refresh was on the way.

Screenshots (1280x800 and 390x844, light and dark) go to var/test-artifacts/screenshots/."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse

from console.services import SYSTEM
from sandboxes.backends.base import SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_backend, make_config
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import log_in, shoot_all, wait_until
from tests.support.skill_install import clean_up

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker]

HIDE_TAB = """() => {
  Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
  document.dispatchEvent(new Event("visibilitychange"));
}"""
SHOW_TAB = """() => {
  Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "visible" });
  document.dispatchEvent(new Event("visibilitychange"));
}"""


@pytest.fixture
def two_sessions(
    world: World,
    docker_base_image: str,  # noqa: F811
    settings: Any,
    test_run_id: str,  # noqa: F811
) -> Iterator[list[Session]]:
    """Two running Docker sessions of space A labelled `bulk`, and one unlabelled; made
    before `daphne_url` forks (the child inherits the installation id)."""
    settings.CONSOLE_INSTALLATION_ID = installation = f"test-{test_run_id}-sessions-e2e"
    config = make_config(world.space_a, name="e2e sessions", default_template=docker_base_image, is_default=True)
    runtime = Runtime()
    sessions = [runtime.resolve(world.space_a, key, labels=["bulk"]).session for key in ("e2e-one", "e2e-two")]
    Session.objects.create(space=world.space_a, key="e2e-other", config=config)
    try:
        yield sessions
    finally:
        connection.close()
        clean_up(config, installation)


def engine_states(sessions: list[Session]) -> list[SandboxState]:
    backend = get_backend(sessions[0].config)
    return [backend.get(session.sandbox_id).state for session in sessions]


def row_state(page: Any, key: str) -> str:
    return str(page.get_attribute(f"tr[data-session='{key}']", "data-state"))


@pytest.mark.timeout(300)
def test_two_sessions_found_by_label_pause_and_resume_in_one_action_each(
    world: World, two_sessions: list[Session], daphne_url: str, page: Any
) -> None:
    log_in(page, daphne_url, "bob")
    page.goto(f"{daphne_url}/sessions/")
    page.fill("#id_label", "bulk")
    wait_until(page, "document.querySelectorAll('#session-results tr[data-session]').length === 2")
    assert "label=bulk" in page.url
    assert not page.is_visible("tr[data-session='e2e-other']")
    # The running rows' CPU and memory arrive after the page.
    for session in two_sessions:
        wait_until(page, f"document.getElementById('cpu-{session.id}').textContent.includes('%')", timeout=20_000)
        assert "B" in page.inner_text(f"#mem-{session.id}")
    shoot_all(page, "sessions-list")

    for action, word, state in (("pause", "Pause", SandboxState.PAUSED), ("resume", "Resume", SandboxState.RUNNING)):
        for session in two_sessions:
            page.check(f"#pick-{session.id}")
        page.click(f".bulk-actions button[value={action}]")
        page.wait_for_selector("#confirm-actions")
        heading = page.inner_text("#confirm-actions h1")
        assert heading == f"{word} 2 sessions?"
        assert page.locator("#will-happen li").count() == 2
        if action == "pause":
            shoot_all(page, "sessions-confirm", reload=False)
        page.click("#confirm-action")
        # One job does both; its progress and each session's outcome replace the confirmation.
        page.wait_for_selector("#confirm-actions #job-status .status-succeeded", timeout=60_000)
        said = page.inner_text("#confirm-actions")
        assert f"{word}: 2 sessions." in said
        assert "e2e-one: done" in said
        assert "e2e-two: done" in said
        if action == "pause":
            shoot_all(page, "sessions-job", reload=False)
        assert engine_states(two_sessions) == [state, state]
        page.click("#confirm-actions a:has-text('Back to the sessions')")
        page.wait_for_url(re.compile(r".*/sessions/\?.*label=bulk"))
        assert {row_state(page, "e2e-one"), row_state(page, "e2e-two")} == {str(state)}


@pytest.mark.timeout(300)
def test_the_list_refreshes_itself_only_while_the_tab_is_visible(
    world: World, two_sessions: list[Session], daphne_url: str, page: Any
) -> None:
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url) if "/sessions/?" in request.url else None)
    log_in(page, daphne_url, "bob")
    page.goto(f"{daphne_url}/sessions/?label=bulk")
    assert row_state(page, "e2e-one") == "running"
    Runtime().pause(two_sessions[0], actor=SYSTEM)  # elsewhere: the list shows it by itself
    wait_until(
        page, "document.querySelector(\"tr[data-session='e2e-one']\").dataset.state === 'paused'", timeout=25_000
    )
    assert page.inner_text("tr[data-session='e2e-one'] .state") == "Paused"
    # A ticked box holds the rows still: the user is choosing.
    page.check(f"#pick-{two_sessions[1].id}")
    ticked = len(fetched)
    page.wait_for_timeout(11_000)
    assert len(fetched) == ticked
    assert page.is_checked(f"#pick-{two_sessions[1].id}")
    page.uncheck(f"#pick-{two_sessions[1].id}")
    page.evaluate(HIDE_TAB)
    hidden = len(fetched)
    page.wait_for_timeout(21_000)
    assert len(fetched) == hidden, "the list was fetched while the tab was hidden"
    page.evaluate(SHOW_TAB)
    page.wait_for_timeout(1500)
    assert len(fetched) > hidden  # back in sight: fetched at once


@pytest.mark.timeout(300)
def test_the_config_form_keeps_what_was_typed_while_it_refreshed(
    world: World,
    daphne_url: str,
    page: Any,
    docker_base_image: str,  # noqa: F811
) -> None:
    config = make_config(world.space_a, name="typed", default_template=docker_base_image, cpus=1, memory_mb=1024)
    other = make_backend(world.space_a, name="Second engine")
    edit = reverse("sandboxes:config_edit", args=[config.id])
    held: list[Any] = []

    def hold_refresh(route: Any) -> None:
        if route.request.method == "POST" and route.request.headers.get("hx-request"):
            held.append(route)  # answered below, once the user has typed
        else:
            route.continue_()

    log_in(page, daphne_url, "alice")
    page.goto(f"{daphne_url}{edit}")
    page.route(re.compile(r".*/edit/$"), hold_refresh)
    page.select_option("#id_backend", str(other.pk))
    page.fill("#id_cpus", "-1")
    page.fill("#id_memory_mb", "512")
    page.focus("#id_memory_mb")
    for _ in range(50):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the backend change sent no refresh"
    held.pop().continue_()
    shown_for = "document.querySelector('#config-form input[name=fields_for]')"
    wait_until(page, f"{shown_for} !== null && {shown_for}.value === '{other.pk}'")
    page.unroute(re.compile(r".*/edit/$"))
    wait_until(page, "document.getElementById('id_cpus').value === '-1'", timeout=2000)
    assert page.input_value("#id_memory_mb") == "512"
    assert page.evaluate("document.activeElement && document.activeElement.name") == "memory_mb"
    # Saved as typed, -1 is a field error, not the stored value.
    page.click("#config-form button[type=submit]:not([name])")
    page.wait_for_selector("#config-form .field.has-error #id_cpus")
    assert "greater than or equal to 0.1" in page.inner_text("#config-form")
    assert page.input_value("#id_cpus") == "-1"
    assert page.input_value("#id_memory_mb") == "512"
    stored = SandboxConfig.objects.get(pk=config.pk)
    assert (stored.cpus, stored.memory_mb, stored.backend_id) == (1, 1024, config.backend_id)
    page.fill("#id_cpus", "0.5")
    page.click("#config-form button[type=submit]:not([name])")
    page.wait_for_url(re.compile(rf".*/{config.id}/$"))
    stored.refresh_from_db()
    assert (float(stored.cpus), stored.memory_mb, stored.backend_id) == (0.5, 512, other.pk)


@pytest.mark.timeout(120)
def test_a_box_ticked_while_the_list_refreshed_stays_on_its_own_row(world: World, daphne_url: str, page: Any) -> None:
    """The list's checkboxes share one name (`session`): the tick made during a refresh is
    put back on the box of the same session, never on the first row's (a bulk delete would
    then name a session the user did not pick)."""
    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    sessions = [
        Session.objects.create(space=world.space_a, key=f"tick-{n}", config=config, state="paused") for n in range(3)
    ]
    held: list[Any] = []

    def hold_refresh(route: Any) -> None:
        if route.request.headers.get("hx-request"):
            held.append(route)
        else:
            route.continue_()

    log_in(page, daphne_url, "bob")
    page.goto(f"{daphne_url}/sessions/")
    boxes = "Array.from(document.querySelectorAll('#session-results input[name=session]'))"
    assert page.evaluate(f"{boxes}.length") == 3
    page.evaluate("document.querySelector('#session-results table').dataset.old = '1'")
    page.route(re.compile(r".*/sessions/(\\?.*)?$"), hold_refresh)
    for _ in range(150):  # the list refreshes every 10 s
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the list sent no refresh"
    last = page.evaluate(f"{boxes}.map(box => box.value)")[-1]
    page.check(f"#pick-{last}")
    held.pop().continue_()
    wait_until(page, "!document.querySelector('#session-results table[data-old]')")
    page.unroute(re.compile(r".*/sessions/(\\?.*)?$"))
    ticked = page.evaluate(f"{boxes}.filter(box => box.checked).map(box => box.value)")
    assert ticked == [last]
    assert last in {str(session.id) for session in sessions}
