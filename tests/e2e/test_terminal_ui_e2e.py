"""The terminal page in Chromium: it fills the window, keeps thousands of lines of scrollback
(searchable), changes font size, fills the screen, opens several named shells in tabs, copies
and pastes with the keyboard, and says in words how each shell ended (exited, session
deleted, logged out). Screenshots at both sizes, light and dark; axe-core finds no serious
violation."""

from __future__ import annotations

import re
from typing import Any

import pytest

from console.services import SYSTEM
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions import store_select as binding
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.teardown import delete_session
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, session_config, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import (
    SCREENSHOTS,
    TERMINAL_TEXT,
    assert_accessible,
    wait_for_terminal_text,
    wait_until,
    with_axe,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker, pytest.mark.slow]


def wait_for_text(page: Any, pattern: str, timeout_s: float = 30) -> str:
    return wait_for_terminal_text(page, pattern, timeout_s)


def log_in(page: Any, base: str, who: str = "bob") -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", who)
    page.fill("#id_password", f"pw-{who}")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def wait_state(page: Any, state: str, timeout: float = 60_000) -> None:
    try:
        wait_until(page, f"window.consoleTerminal && window.consoleTerminal.state() === {state!r}", timeout=timeout)
    except AssertionError:
        raise AssertionError(f"not {state}: {page.inner_text('#terminal-card')!r}") from None


def open_terminal(page: Any, base: str, session: Session) -> None:
    page.goto(f"{base}/sessions/{session.id}/terminal/")
    wait_state(page, "connected")


def shoot(page: Any, name: str) -> None:
    """The page as it is, at both sizes, light and dark (no reload: the shells stay)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for size, (width, height) in {"desktop": (1280, 800), "phone": (390, 844)}.items():
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(300)
            page.screenshot(path=str(SCREENSHOTS / f"terminal-{name}-{size}-{scheme}.png"))
            sideways = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert sideways <= 0, f"{name} scrolls sideways at {width}px ({scheme})"
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.wait_for_timeout(300)


@pytest.fixture
def session(world: World, session_config: SandboxConfig) -> Session:  # noqa: F811
    # The store the forked Daphne makes from the settings (Redis when REDIS_URL is set, else
    # the database): the lifecycle lock a delete here holds is the one its terminal waits on,
    # so it can tell "session deleted" from "the sandbox is gone".
    binding.set_store(binding.store_from_settings())
    return get_or_create_session(world.space_a, "e2e-terminal-ui")


def test_fills_the_window_scrolls_back_searches_resizes_text_and_fills_the_screen(
    world: World, session: Session, daphne_url: str, page: Any
) -> None:
    page.set_viewport_size({"width": 1280, "height": 800})
    with_axe(page)
    log_in(page, daphne_url)
    open_terminal(page, daphne_url, session)
    # The terminal starts high on the page and ends above the window's bottom.
    top, bottom = page.evaluate(
        "(() => { const r = document.getElementById('terminal').getBoundingClientRect(); return [r.top, r.bottom]; })()"
    )
    assert top < 200, top
    assert bottom <= 800
    assert page.evaluate("window.consoleTerminal.term.rows") >= 30

    page.click("#terminal")
    page.keyboard.type("seq -f 'line-%g' 1 3000\n")
    wait_for_text(page, r"(?m)^line-3000\s*$")
    wait_for_text(page, r"(?m)^line-1\s*$")
    # Lines tmux dropped for a slow client come back once the burst is over (the history
    # rebuild): every one of the 3,000 is in the scrollback a moment later.
    wait_until(page, f"(({TERMINAL_TEXT})()).split('line-').length - 1 >= 3000", timeout=20_000)
    # The wheel scrolls back through xterm.js's own scrollback.
    before = page.evaluate("window.consoleTerminal.term.buffer.active.viewportY")
    page.mouse.move(640, 400)
    page.mouse.wheel(0, -3000)
    wait_until(page, f"window.consoleTerminal.term.buffer.active.viewportY < {before}", timeout=5000)

    # Search: Ctrl+Shift+F, a word, Enter selects the match.
    page.click("#terminal")
    page.keyboard.press("Control+Shift+F")
    assert page.is_visible("#terminal-search-input")
    page.fill("#terminal-search-input", "line-1234")
    page.keyboard.press("Enter")
    wait_until(page, "window.consoleTerminal.term.getSelection() === 'line-1234'", timeout=5000)
    page.fill("#terminal-search-input", "no-such-words")
    page.keyboard.press("Enter")
    assert page.inner_text("#terminal-search-result") == "not found"
    page.keyboard.press("Escape")
    assert not page.is_visible("#terminal-search")

    # Font size: the buttons and Ctrl +/-; a larger font means fewer columns.
    cols, size = page.evaluate("[window.consoleTerminal.term.cols, window.consoleTerminal.fontSize()]")
    page.click("#terminal-font-up")
    page.click("#terminal-font-up")
    wait_until(page, f"window.consoleTerminal.term.cols < {cols}", timeout=5000)
    assert page.evaluate("window.consoleTerminal.fontSize()") == size + 2
    page.click("#terminal")
    page.keyboard.press("Control+Minus")
    assert page.evaluate("window.consoleTerminal.fontSize()") == size + 1
    page.click("#terminal-font-down")

    # Full screen: the terminal takes the whole window, and gives it back.
    rows = page.evaluate("window.consoleTerminal.term.rows")
    page.click("#terminal-fullscreen")
    wait_until(page, "document.getElementById('terminal-card').classList.contains('terminal-full')", timeout=5000)
    wait_until(page, f"window.consoleTerminal.term.rows > {rows}", timeout=5000)
    page.screenshot(path=str(SCREENSHOTS / "terminal-fullscreen-desktop-light.png"))
    page.click("#terminal-fullscreen")
    wait_until(page, "!document.getElementById('terminal-card').classList.contains('terminal-full')", timeout=5000)

    assert_accessible(page, "terminal page")
    shoot(page, "scrollback")


def test_keyboard_copy_and_paste(world: World, session: Session, daphne_url: str, page: Any) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne_url)
    log_in(page, daphne_url)
    open_terminal(page, daphne_url, session)
    page.click("#terminal")
    page.keyboard.type("echo copy-$((40+2))-me\n")
    wait_for_text(page, r"(?m)^copy-42-me\s*$")
    # Select the output line, copy it with Ctrl+Shift+C.
    page.evaluate(
        """(() => { const t = window.consoleTerminal.term; const b = t.buffer.active;
        for (let i = b.length - 1; i >= 0; i -= 1) {
          if (b.getLine(i).translateToString(true) === 'copy-42-me') { t.select(0, i, 10); return; } } })()"""
    )
    page.keyboard.press("Control+Shift+C")
    wait_until(page, "navigator.clipboard.readText().then(t => t === 'copy-42-me')", timeout=5000)
    # Paste it back with Ctrl+Shift+V: the shell gets it as typed.
    page.evaluate("navigator.clipboard.writeText('echo pasted-$((5*5))')")
    page.click("#terminal")
    page.keyboard.press("Control+Shift+V")
    page.keyboard.press("Enter")
    wait_for_text(page, r"(?m)^pasted-25\s*$")


def test_named_tabs_and_the_words_for_how_each_shell_ended(
    world: World, session: Session, daphne_url: str, page: Any
) -> None:
    with_axe(page)
    log_in(page, daphne_url)
    open_terminal(page, daphne_url, session)
    page.click("#terminal-new-tab")
    wait_until(page, "window.consoleTerminal.tabs().length === 2", timeout=5000)
    wait_state(page, "connected")
    tabs = page.evaluate("window.consoleTerminal.tabs()")
    assert [tab["name"] for tab in tabs] == ["Shell 1", "Shell 2"]
    assert tabs[0]["terminalId"] != tabs[1]["terminalId"]
    # Rename the second: double-click, a name.
    page.once("dialog", lambda dialog: dialog.accept("build"))
    page.dblclick("#terminal-tabs [role=tab][aria-selected=true]")
    wait_until(page, "window.consoleTerminal.tabs()[1].name === 'build'", timeout=5000)
    # Each tab is its own shell.
    page.click("#terminal")
    page.keyboard.type("echo in-build-$((1+1))\n")
    wait_for_text(page, r"(?m)^in-build-2\s*$")
    page.click("#terminal-tabs [role=tab] >> text=Shell 1")
    wait_until(
        page,
        "window.consoleTerminal.tabs()[0].name === 'Shell 1' && "
        "document.querySelector('#terminal-tabs [role=tab][aria-selected=true]').textContent.includes('Shell 1')",
        timeout=5000,
    )
    assert "in-build-2" not in page.evaluate(TERMINAL_TEXT)
    # A reload brings both tabs back, with their names and shells.
    page.reload()
    wait_until(
        page,
        "window.consoleTerminal && window.consoleTerminal.tabs().length === 2 && "
        "window.consoleTerminal.tabs().every(t => t.state === 'connected')",
        timeout=60_000,
    )
    assert [tab["name"] for tab in page.evaluate("window.consoleTerminal.tabs()")] == ["Shell 1", "build"]
    assert page.is_visible("#terminal-mode")
    assert_accessible(page, "terminal tabs")
    shoot(page, "tabs")

    # The shell exits: "ended: the shell exited", and a new shell is offered.
    page.click("#terminal-tabs [role=tab] >> text=build")
    page.click("#terminal")
    page.keyboard.type("exit\n")
    wait_state(page, "ended", timeout=20_000)
    assert "the shell exited" in page.inner_text("#terminal-state")
    assert page.inner_text("#terminal-reconnect") == "Start a new shell"
    assert not page.is_visible("#terminal-mode")
    assert not page.is_visible("#terminal-login")

    # The session is deleted: "session deleted", no reconnect, a way to the sessions.
    page.click("#terminal-tabs [role=tab] >> text=Shell 1")
    delete_session(Session.objects.get(pk=session.pk), actor=SYSTEM)
    wait_state(page, "session deleted", timeout=60_000)
    assert not page.is_visible("#terminal-reconnect")
    assert page.is_visible("#terminal-sessions")
    assert "exited" not in page.inner_text("#terminal-state")
    shoot(page, "session-deleted")


def test_after_logout_the_terminal_says_logged_out_and_offers_to_log_in(
    world: World, session: Session, daphne_url: str, page: Any
) -> None:
    log_in(page, daphne_url)
    open_terminal(page, daphne_url, session)
    assert page.is_visible("#terminal-mode")
    other = page.context.new_page()
    other.goto(f"{daphne_url}/")
    other.click("details.usermenu summary")
    other.click("#logout")
    other.wait_for_url(re.compile(r".*/login/.*|.*/logout/.*|.*/$"))
    wait_state(page, "logged out", timeout=30_000)
    assert page.is_visible("#terminal-login")
    assert not page.is_visible("#terminal-reconnect")
    assert not page.is_visible("#terminal-mode")  # no longer "writable"
    assert page.evaluate("window.consoleTerminal.term.options.disableStdin") is True
    page.screenshot(path=str(SCREENSHOTS / "terminal-logged-out-desktop-light.png"))
