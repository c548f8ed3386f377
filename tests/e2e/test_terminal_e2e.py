"""The web terminal in a real browser: log in, open a session's terminal, type, resize."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions import store_select as binding
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import MemorySessionStore
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, session_config, test_run_id  # noqa: F401 - fixtures

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


def test_type_a_command_and_resize_in_chromium(
    world: World,
    session_config: SandboxConfig,  # noqa: F811
    daphne_url: str,
    page: Any,
) -> None:
    binding.set_store(MemorySessionStore())  # this process's view, for the ps checks below
    session = get_or_create_session(world.space_a, "e2e-terminal")
    page.set_viewport_size({"width": 1200, "height": 800})
    page.goto(f"{daphne_url}/login/")
    page.fill("#id_username", "bob")
    page.fill("#id_password", "pw-bob")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))

    page.goto(f"{daphne_url}/sessions/{session.id}/terminal/")
    try:
        page.wait_for_function(
            "window.consoleTerminal && window.consoleTerminal.state() === 'connected'", timeout=60_000
        )
    except Exception:
        raise AssertionError(f"not connected: {page.inner_text('#terminal-card')!r}") from None
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
    page.close()  # pagehide closes the socket normally: the shell ends at once
    deadline = time.monotonic() + 15
    while shells_in(session):
        assert time.monotonic() < deadline, "the shell outlived the tab"
        time.sleep(0.2)
