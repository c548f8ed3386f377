"""What the browser tests share: logging in, following a job page, the screenshots at both
sizes, light and dark (var/test-artifacts/screenshots/, or under $TEST_ARTIFACTS_DIR; kept out
of git), and the accessibility check (axe-core from npm)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or ROOT / "var" / "test-artifacts")
SCREENSHOTS = ARTIFACTS / "screenshots"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
SIDEWAYS = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def shoot_all(page: Any, name: str, *, reload: bool = True) -> None:
    """The page at both sizes, light and dark; none of them scrolls sideways. Reloaded per
    scheme and size, except where what is on the page must stay (a flash message, a form
    filled in)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for size, (width, height) in SIZES.items():
            page.set_viewport_size({"width": width, "height": height})
            if reload:
                page.reload()
                page.wait_for_load_state("networkidle")
            else:
                page.wait_for_timeout(100)
            page.screenshot(path=str(SCREENSHOTS / f"flow-{name}-{size}-{scheme}.png"), full_page=True)
            assert page.evaluate(SIDEWAYS) <= 0, f"{name} scrolls sideways at {width}px ({scheme})"
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1280, "height": 800})


def wait_until(page: Any, expression: str, timeout: float = 30_000, *, poll_ms: float = 100) -> Any:
    """Poll a JavaScript expression until it is truthy (its value) or `timeout` ms pass
    (AssertionError). In place of Playwright's `wait_for_function`, which evaluates a string
    with `new Function` inside the page, which the console's policy (no 'unsafe-eval')
    refuses; `page.evaluate` goes through the DevTools protocol, which the page's policy
    does not govern. A page that is navigating (a form posted, a logout) is read again."""
    deadline = time.monotonic() + timeout / 1000
    last: Any = None
    while True:
        try:
            last = page.evaluate(expression)
        except Exception as error:  # the page navigated mid-evaluation: read the next one
            text = str(error)
            if "context was destroyed" not in text and "navigat" not in text.lower():
                raise
            last = error
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout / 1000:g}s: {expression} (last: {last!r})")
        page.wait_for_timeout(poll_ms)


def log_in(page: Any, base: str, who: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", who)
    page.fill("#id_password", f"pw-{who}")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def wait_for_job(page: Any, timeout_s: float = 300) -> str:
    """On a job page: wait (HTMX polls it) until it finishes; its status word."""
    page.wait_for_selector("#job-status .status", timeout=10_000)
    # HTMX swaps the card's outerHTML: for a moment there is none.
    wait_until(
        page,
        "(() => { const card = document.querySelector('#job-status');"
        " return card !== null && !card.hasAttribute('hx-get'); })()",
        timeout=int(timeout_s * 1000),
    )
    return str(page.inner_text("#job-status .status")).strip()


def with_axe(page: Any) -> None:
    """Load axe-core into every document `page` opens (an init script goes through the
    DevTools protocol, which the page's Content-Security-Policy does not govern)."""
    if not AXE.exists():
        raise AssertionError(f"{AXE} is missing: run `npm ci`")
    page.add_init_script(path=str(AXE))


AXE_RUN = """() => axe.run(document, {resultTypes: ["violations"]}).then(result => result.violations.map(v => ({
  id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 5).map(n => n.target.join(" "))})))"""


def serious_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is now (after `with_axe`)."""
    found = page.evaluate(AXE_RUN)
    return [v for v in found if v["impact"] in ("serious", "critical")]


def assert_accessible(page: Any, name: str) -> None:
    found = serious_violations(page)
    assert not found, f"{name}: " + json.dumps(found, indent=1)


TERMINAL_TEXT = """() => {
  const buffer = window.consoleTerminal.term.buffer.active;
  const lines = [];
  for (let i = 0; i < buffer.length; i += 1) lines.push(buffer.getLine(i).translateToString(true));
  return lines.join("\\n");
}"""


def wait_for_terminal_text(page: Any, pattern: str, timeout_s: float = 20) -> str:
    """The active terminal's whole buffer (scrollback and screen) once `pattern` is in it."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = str(page.evaluate(TERMINAL_TEXT))
        if re.search(pattern, text):
            return text
        assert time.monotonic() < deadline, f"{pattern!r} not in the terminal: {text[-500:]!r}"
        page.wait_for_timeout(100)
