"""The web terminal in a real browser: log in, open a session's terminal, type, resize."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from console.models import AuditEvent
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig, Session, Terminal
from sandboxes.sessions import store_select as binding
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import MemorySessionStore
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, session_config, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import wait_until
from tests.support.tuning import Tuned

ARTIFACTS = Path(__file__).resolve().parents[2] / "var" / "test-artifacts"
ARTIFACTS.mkdir(parents=True, exist_ok=True)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker, pytest.mark.slow]

BUFFER_TEXT = """() => {
  const buffer = window.consoleTerminal.term.buffer.active;
  const lines = [];
  for (let i = 0; i < buffer.length; i += 1) lines.push(buffer.getLine(i).translateToString(true));
  return lines.join("\\n");
}"""


def shells_in(session: Session) -> list[str]:
    result = Runtime().exec(session, ExecRequest(argv=("ps", "-eo", "args"), timeout_s=30))
    return [line for line in result.stdout.decode().splitlines() if line.strip() == "bash -l"]


def wait_for_text(page: Any, pattern: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = str(page.evaluate(BUFFER_TEXT))
        if re.search(pattern, text):
            return text
        assert time.monotonic() < deadline, f"{pattern!r} not in the terminal: {text[-500:]!r}"
        page.wait_for_timeout(100)


@pytest.fixture
def short_grace(tuned: Tuned, settings: Any) -> None:
    """Before `daphne_url`: the forked server inherits it. A closed page keeps its shell this long."""
    tuned({"terminal.reattach_s": 4})


def fresh_connection() -> None:
    """The ORM calls beside Playwright run on a connection of their own, which an earlier
    test's teardown may have ended (conftest `_end_other_sessions`): start a new one."""
    connection.close()


def log_in(page: Any, daphne_url: str) -> None:
    page.goto(f"{daphne_url}/login/")
    page.fill("#id_username", "bob")
    page.fill("#id_password", "pw-bob")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def wait_connected(page: Any) -> None:
    try:
        wait_until(page, "window.consoleTerminal && window.consoleTerminal.state() === 'connected'", timeout=60_000)
    except AssertionError:  # not a script error: that one is raised as it is
        raise AssertionError(f"not connected: {page.inner_text('#terminal-card')!r}") from None


def test_type_a_command_and_resize_in_chromium(
    world: World,
    session_config: SandboxConfig,  # noqa: F811
    short_grace: None,
    daphne_url: str,
    page: Any,
) -> None:
    binding.set_store(MemorySessionStore())  # this process's view, for the ps checks below
    session = get_or_create_session(world.space_a, "e2e-terminal")
    page.set_viewport_size({"width": 1200, "height": 800})
    log_in(page, daphne_url)
    page.goto(f"{daphne_url}/sessions/{session.id}/terminal/")
    wait_connected(page)
    page.click("#terminal")
    page.keyboard.type("echo hi-$((6*7))\n")
    wait_for_text(page, r"(?m)^hi-42\s*$")

    page.set_viewport_size({"width": 700, "height": 500})
    page.wait_for_timeout(500)  # fit runs on resize; the resize frame follows
    cols, rows = page.evaluate("[window.consoleTerminal.term.cols, window.consoleTerminal.term.rows]")
    assert cols < 120
    page.keyboard.type("clear; stty size\n")
    wait_for_text(page, rf"(?m)^{rows} {cols}\s*$")
    assert page.inner_text("#terminal-state").startswith("connected")
    assert not page.is_visible("#terminal-reconnect")

    session.refresh_from_db()
    assert shells_in(session)
    page.close()  # a reload cannot be told from leaving: the shell ends after the grace window
    deadline = time.monotonic() + 20
    while shells_in(session):
        assert time.monotonic() < deadline, "the shell outlived the tab"
        time.sleep(0.2)


CURSOR_ROW_BOTTOM = """() => {
  const t = window.consoleTerminal.term;
  const row = document.querySelectorAll("#terminal .xterm-rows > div")[t.buffer.active.cursorY];
  return [row.getBoundingClientRect().bottom, document.getElementById("terminal").getBoundingClientRect().bottom];
}"""


def test_a_reload_reattaches_the_same_shell_and_the_terminal_fits_800x600(
    world: World,
    session_config: SandboxConfig,  # noqa: F811
    daphne_url: str,
    page: Any,
) -> None:
    fresh_connection()
    binding.set_store(MemorySessionStore())
    session = get_or_create_session(world.space_a, "e2e-terminal-reload")
    page.set_viewport_size({"width": 800, "height": 600})
    log_in(page, daphne_url)
    page.goto(f"{daphne_url}/sessions/{session.id}/terminal/")
    wait_connected(page)
    page.click("#terminal")
    page.keyboard.type("export FOO=bar; echo marker-$((100+23))\n")
    wait_for_text(page, r"(?m)^marker-123\s*$")
    first_id = page.evaluate("window.consoleTerminal.terminalId()")
    # The prompt line and the whole terminal are inside the 800x600 window.
    page.screenshot(path=str(ARTIFACTS / "terminal-800x600.png"))
    cursor_bottom, terminal_bottom = page.evaluate(CURSOR_ROW_BOTTOM)
    assert cursor_bottom <= 600
    assert terminal_bottom <= 600
    assert page.evaluate("window.consoleTerminal.term.rows") >= 10

    page.reload()
    wait_connected(page)
    assert page.evaluate("window.consoleTerminal.terminalId()") == first_id
    assert "reattached" in page.inner_text("#terminal-state")
    wait_for_text(page, r"marker-123")  # the scrollback, before anything is typed
    page.click("#terminal")
    page.keyboard.type('echo "[$FOO]"\n')
    wait_for_text(page, r"(?m)^\[bar\]\s*$")
    cursor_bottom, terminal_bottom = page.evaluate(CURSOR_ROW_BOTTOM)
    assert cursor_bottom <= 600
    page.screenshot(path=str(ARTIFACTS / "terminal-800x600-reloaded.png"))
    terminal = Terminal.objects.get(pk=first_id)
    assert terminal.closed is None
    assert AuditEvent.objects.filter(action="terminal.open", target_id=first_id).count() == 1


def test_without_javascript_the_page_says_so(
    world: World,
    session_config: SandboxConfig,  # noqa: F811
    daphne_url: str,
    page: Any,
) -> None:
    fresh_connection()
    binding.set_store(MemorySessionStore())
    session = get_or_create_session(world.space_a, "e2e-terminal-nojs")
    context = page.context.browser.new_context(java_script_enabled=False)
    try:
        nojs = context.new_page()
        log_in(nojs, daphne_url)
        nojs.goto(f"{daphne_url}/sessions/{session.id}/terminal/")
        assert nojs.is_visible("#terminal-noscript")
        assert "needs JavaScript" in nojs.inner_text("#terminal-noscript")
        state = nojs.inner_text("#terminal-state")
        assert "connecting" not in state
        assert "needs JavaScript" in state
        assert not nojs.is_visible("#terminal-copy")
        nojs.screenshot(path=str(ARTIFACTS / "terminal-nojs.png"))
    finally:
        context.close()
    # With JavaScript the notice is not shown.
    log_in(page, daphne_url)
    page.goto(f"{daphne_url}/sessions/{session.id}/terminal/")
    wait_connected(page)
    assert not page.is_visible("#terminal-noscript")
    assert page.is_visible("#terminal-copy")
    assert not Terminal.objects.filter(session=session, closed__isnull=False).exists()
