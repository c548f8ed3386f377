"""The walk a new space admin takes, in one Chromium session against the live console (Daphne)
and the real Docker engine, without docs: log in, find two sessions by label, pause both and
resume both in one action each (one job each, followed in place), open a shell and scroll back
2,000 lines, preview /workspace/output/report.txt from the file manager, and reach a session
and a page by the command palette. Each step is shot at 1280x800 and 390x844, light and dark,
under var/test-artifacts/screenshots/ (or $TEST_ARTIFACTS_DIR), never in git."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from console.models import Role
from sandboxes.backends.base import SandboxState
from sandboxes.models import Session
from sandboxes.sessions.runtime import Runtime
from tests.e2e.test_navigation_e2e import search_in_palette
from tests.e2e.test_sessions_e2e import engine_states
from tests.factories import add_member, make_config, make_user
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import TERMINAL_TEXT, log_in, shoot_all, wait_for_terminal_text, wait_until
from tests.support.skill_install import clean_up

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker, pytest.mark.slow]

REPORT = "quarterly figures: all green"


@pytest.fixture
def walk_sessions(
    world: World,
    docker_base_image: str,  # noqa: F811
    settings: Any,
    test_run_id: str,  # noqa: F811
) -> Iterator[list[Session]]:
    """A new admin of space A, and two running sessions labelled `walk` (made before Daphne
    forks), one holding /workspace/output/report.txt."""
    settings.CONSOLE_INSTALLATION_ID = installation = f"test-{test_run_id}-walk-e2e"
    add_member(world.space_a, make_user("nadia", email="nadia@example.test"), Role.ADMIN)
    config = make_config(world.space_a, name="walk", default_template=docker_base_image, is_default=True)
    runtime = Runtime()
    sessions = [runtime.resolve(world.space_a, key, labels=["walk"]).session for key in ("walk-one", "walk-two")]
    from sandboxes.backends.base import ExecRequest

    made = runtime.exec(sessions[0], ExecRequest(shell=f"mkdir -p output && printf '{REPORT}\\n' > output/report.txt"))
    assert made.exit_code == 0, made.stderr
    try:
        yield sessions
    finally:
        connection.close()
        clean_up(config, installation)


def act_on_both(page: Any, sessions: list[Session], action: str, word: str) -> None:
    for session in sessions:
        page.check(f"#pick-{session.id}")
    page.click(f".bulk-actions button[value={action}]")
    page.wait_for_selector("#confirm-actions")
    assert page.inner_text("#confirm-actions h1") == f"{word} 2 sessions?"
    page.click("#confirm-action")
    finished = "#confirm-actions #job-status :is(.status-succeeded, .status-failed, .status-cancelled)"
    page.wait_for_selector(finished, timeout=90_000)
    said = page.inner_text("#confirm-actions")
    assert page.is_visible("#confirm-actions #job-status .status-succeeded"), said
    assert "walk-one: done" in said
    assert "walk-two: done" in said
    shoot_all(page, f"walk-{action}-job", reload=False)
    page.click("#confirm-actions a:has-text('Back to the sessions')")
    page.wait_for_url(re.compile(r".*/sessions/\?.*label=walk"))


@pytest.mark.timeout(600)
def test_a_new_admin_walks_from_login_to_a_shell_and_back(
    world: World, walk_sessions: list[Session], daphne_url: str, page: Any
) -> None:
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, daphne_url, "nadia")
    shoot_all(page, "walk-dashboard")

    # Find the two sessions by label.
    page.goto(f"{daphne_url}/sessions/")
    page.fill("#id_label", "walk")
    wait_until(page, "document.querySelectorAll('#session-results tr[data-session]').length === 2")
    shoot_all(page, "walk-sessions-by-label", reload=False)

    # Pause both in one action, then resume both in one action.
    act_on_both(page, walk_sessions, "pause", "Pause")
    assert engine_states(walk_sessions) == [SandboxState.PAUSED, SandboxState.PAUSED]
    act_on_both(page, walk_sessions, "resume", "Resume")
    assert engine_states(walk_sessions) == [SandboxState.RUNNING, SandboxState.RUNNING]

    # Preview the report from the session page's file manager.
    one = walk_sessions[0]
    page.goto(f"{daphne_url}{one.get_absolute_url()}?browse=1&path=output#files")
    page.click("#file-list a:has-text('report.txt')")
    page.wait_for_selector("#preview-text")
    assert REPORT in page.inner_text("#preview-text")
    shoot_all(page, "walk-report-preview")

    # A shell, and 2,000 lines back in its scrollback.
    page.goto(f"{daphne_url}{one.get_absolute_url()}")
    page.click("#open-terminal")
    wait_until(page, "window.consoleTerminal && window.consoleTerminal.state() === 'connected'", timeout=60_000)
    page.click("#terminal")
    page.keyboard.type("seq -f 'walk-%g' 1 2500\n")
    wait_for_terminal_text(page, r"(?m)^walk-2500\s*$", 60)
    wait_until(page, f"(({TERMINAL_TEXT})()).split('walk-').length - 1 >= 2500", timeout=30_000)
    viewport_y = "window.consoleTerminal.term.buffer.active.viewportY"
    bottom = page.evaluate(viewport_y)
    page.hover("#terminal")
    page.mouse.wheel(0, -1500)  # the wheel scrolls back a little…
    wait_until(page, f"{viewport_y} < {bottom}", timeout=5000)
    for _ in range(200):  # …and Shift+PageUp a page at a time, 2,000 lines back
        page.keyboard.press("Shift+PageUp")
        if page.evaluate(viewport_y) <= bottom - 2000:
            break
    top = page.evaluate(viewport_y)
    assert top <= bottom - 2000, (bottom, top)
    shown = page.evaluate(
        "(() => { const b = window.consoleTerminal.term.buffer.active;"
        " return b.getLine(b.viewportY + 2).translateToString(true); })()"
    )
    assert shown.startswith("walk-"), shown
    shoot_all(page, "walk-terminal-scrolled-back", reload=False)

    # The palette: a session by its key, then a page by its name.
    page.goto(f"{daphne_url}/")
    page.keyboard.press("Control+k")
    assert page.is_visible("dialog.palette")
    assert "walk-two" in search_in_palette(page, "walk-two")
    shoot_all(page, "walk-palette", reload=False)
    page.set_viewport_size({"width": 1280, "height": 800})
    search_in_palette(page, "walk-two")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(re.escape(walk_sessions[1].get_absolute_url()) + "$"))
    page.keyboard.press("Control+k")
    assert "Skills" in search_in_palette(page, "Skills")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r".*/skills/$"))
