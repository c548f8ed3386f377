"""The Content-Security-Policy in a real browser: every main page loads, runs its scripts and
swaps its fragments with no violation reported, and the policy does refuse what it should.

Chromium fires `securitypolicyviolation` for each thing the policy blocks (and, under a
report-only policy, would block); a listener installed before any page script collects them.
"""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from console import metrics
from console.activity import take_sample
from console.services import Actor
from console.users import do_create_user
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions import store_select as binding
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.store import MemorySessionStore
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, session_config, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

LISTEN = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push({
    directive: e.violatedDirective, blocked: e.blockedURI, sample: e.sample,
    source: e.sourceFile + ":" + e.lineNumber, page: location.pathname,
  });
});
"""


def log_in(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


class Watch:
    """The violations every page of this browser context reported, and the console's CSP
    messages (a violation on a page that was left before its event was read)."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.seen: list[Any] = []
        self.console: list[str] = []
        page.context.add_init_script(LISTEN)
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.console.append(message.text)

    def visit(self, url: str, ready: str = "body") -> Any:
        self.collect()
        response = self.page.goto(url)
        assert response is not None
        assert response.status == 200, (url, response.status)
        policy = response.headers.get("content-security-policy", "")
        assert "'nonce-" in policy, (url, policy)
        assert "'unsafe-eval'" not in policy
        self.page.wait_for_selector(ready)
        self.page.wait_for_load_state("networkidle")
        self.collect()
        return response

    def collect(self) -> None:
        # A page mid-navigation cannot be read: its events are read at the next call.
        with contextlib.suppress(Exception):
            self.seen.extend(self.page.evaluate("window.__cspViolations.splice(0)"))

    def assert_none(self) -> None:
        self.collect()
        assert not self.seen, self.seen
        assert not self.console, self.console


@pytest.fixture
def activity(world: World) -> None:
    now = timezone.now()
    for minutes in range(30, 0, -5):
        metrics.RESOLVE_SECONDS.labels(path="fast", outcome="bound").observe(0.02)
        take_sample(now - timedelta(minutes=minutes))


def test_the_main_pages_report_no_violation_and_htmx_still_swaps(
    world: World, activity: None, daphne_url: str, page: Any
) -> None:
    base = daphne_url
    config = make_config(world.space_a, name="pages", is_default=True)
    session = Session.objects.create(space=world.space_a, key="csp-session", config=config)
    issued = do_create_user(username="erin", email="", actor=Actor(user=world.root), base_url=base)
    watch = Watch(page)
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, base, "root")

    # The dashboard: uPlot draws its charts (scripts with the nonce, styles it sets through the DOM).
    watch.visit(f"{base}/", 'figure[data-chart="resolves"][data-drawn="true"]')
    watch.visit(f"{base}/platform/activity/", "figure[data-chart][data-drawn]")
    for path in (
        "/spaces/",
        f"/spaces/{world.space_a.id}/",
        f"/spaces/{world.space_a.id}/network/",
        f"/spaces/{world.space_a.id}/tokens/",
        "/sandboxes/",
        config.get_absolute_url(),
        "/skills/",
        "/sessions/",
        session.get_absolute_url(),
        "/jobs/",
        "/audit/",
        "/platform/users/",
        f"/platform/users/{world.bob.pk}/",
        f"/platform/users/{world.bob.pk}/deactivate/",
        "/platform/backends/",
    ):
        watch.visit(f"{base}{path}", "main")
    watch.assert_none()

    # HTMX swaps: the users search filters the list in place (no page load).
    watch.visit(f"{base}/platform/users/", "#user-results")
    page.evaluate("window.__notReloaded = true")
    page.fill("#id_q", "carol")
    wait_until(
        page,
        "document.querySelector('#user-results').innerText.includes('carol')"
        " && !document.querySelector('#user-results').innerText.includes('alice')",
        timeout=10_000,
    )
    assert page.evaluate("window.__notReloaded") is True
    assert "q=carol" in page.url  # hx-push-url

    # An inline script with the nonce runs: the invitation page's copy button shows itself.
    page.goto(f"{base}/platform/users/{issued.invitation.user.pk}/")
    page.click("button:has-text('New invitation link')")
    page.wait_for_selector("#invite-copy:not([hidden])", timeout=10_000)
    watch.assert_none()


def test_the_policy_refuses_what_it_should(world: World, daphne_url: str, page: Any) -> None:
    """Not a policy that allows all: a script without the nonce, an inline handler and an
    inline style are refused and reported."""
    watch = Watch(page)
    log_in(page, daphne_url, "root")
    watch.visit(f"{daphne_url}/spaces/", "main")
    page.evaluate(
        """() => {
        const el = document.createElement("div");
        el.innerHTML = '<img src="data:," onerror="window.__ran = true">';
        document.body.appendChild(el);
        const style = document.createElement("p");
        style.setAttribute("style", "color: red");
        document.body.appendChild(style);
      }"""
    )
    page.wait_for_timeout(300)
    watch.collect()
    directives = {v["directive"] for v in watch.seen}
    assert page.evaluate("window.__ran === true") is False
    assert any(d.startswith("script-src") for d in directives), watch.seen
    assert any(d.startswith("style-src") for d in directives), watch.seen


@pytest.mark.docker
@pytest.mark.slow
def test_the_terminal_page_reports_no_violation(
    world: World,
    session_config: SandboxConfig,  # noqa: F811
    daphne_url: str,
    page: Any,
) -> None:
    """Served on another name for the same server (127.0.0.1, not localhost): the policy's
    connect-src follows the host and port the page was asked for, and the terminal's
    websocket, opened there, connects."""
    binding.set_store(MemorySessionStore())
    session = get_or_create_session(world.space_a, "csp-terminal")
    base = daphne_url.replace("//localhost:", "//127.0.0.1:")
    origin = base.removeprefix("http://")
    sockets: list[str] = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    watch = Watch(page)
    page.set_viewport_size({"width": 1200, "height": 800})
    log_in(page, base, "bob")
    response = watch.visit(f"{base}/sessions/{session.id}/terminal/", "#terminal")
    directives = dict(d.split(" ", 1) for d in response.headers["content-security-policy"].split("; "))
    assert directives["connect-src"] == f"'self' ws://{origin} wss://{origin}"
    wait_until(page, "window.consoleTerminal && window.consoleTerminal.state() === 'connected'", timeout=60_000)
    assert [url.split("/ws/")[0] for url in sockets] == [f"ws://{origin}"]
    assert page.is_visible("#terminal-copy")  # shown by the script (the hidden attribute)
    assert not page.is_visible("#terminal-reconnect")
    page.click("#terminal")
    page.keyboard.type("echo csp-$((6*7))\n")
    wait_until(
        page,
        "(() => { const b = window.consoleTerminal.term.buffer.active; for (let i = 0; i < b.length; i++)"
        " if (b.getLine(i).translateToString(true).trim() === 'csp-42') return true; return false; })()",
        timeout=20_000,
    )
    watch.assert_none()


def test_the_teardown_unmanaged_and_terminal_ask_pages_report_no_violation(
    world: World, daphne_url: str, page: Any
) -> None:
    """The pages the deletes that tear down brought (confirm pages, a failed teardown's job and
    its "Delete again", the Unmanaged resources list and its confirm) and the terminal page's
    question on a stale session load under the policy with nothing refused."""
    from console.models import AdminJob, JobStatus
    from sandboxes.sessions.teardown import KIND_SESSION

    base = daphne_url
    config = make_config(world.space_a, name="teardown-pages", is_default=True)
    now = timezone.now()
    session = Session.objects.create(
        space=world.space_a, key="csp-teardown", config=config, stale_at=now, bound_at=now - timedelta(minutes=1)
    )
    failed = AdminJob.objects.create(
        kind=KIND_SESSION,
        space=world.space_a,
        created_by=world.root,
        params={"target": str(session.pk)},
        status=JobStatus.FAILED,
        error="Session csp-teardown was not deleted: could not delete sandbox x (unavailable: engine away)",
        log=[{"time": now.isoformat(), "message": "Could not delete sandbox x (unavailable: engine away)."}],
        finished=now,
    )
    watch = Watch(page)
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, base, "root")
    for path in (
        f"/spaces/{world.space_a.id}/delete/",
        f"/sandboxes/{config.id}/delete/",
        f"/sessions/{session.id}/actions/delete/",
        f"/jobs/{failed.id}/",
        "/platform/unmanaged/",
        "/platform/unmanaged/?" + "backend=x&kind=sandbox&ident=csp",
        "/platform/unmanaged/delete/?backend=x&kind=sandbox&ident=csp-ident",
        f"/sessions/{session.id}/terminal/",
    ):
        watch.visit(f"{base}{path}", "main")
    watch.visit(f"{base}/sessions/{session.id}/terminal/", "main")
    assert "Rebuild" in page.content()  # the question, not a terminal that rebuilt it
    watch.assert_none()

    # A running teardown's page polls its status card (HTMX) until the job is done.
    running = AdminJob.objects.create(
        kind=KIND_SESSION,
        space=world.space_a,
        created_by=world.root,
        params={"target": str(session.pk)},
        status=JobStatus.RUNNING,
        progress=40,
        log=[{"time": now.isoformat(), "message": "Deleted sandbox x."}],
    )
    watch.visit(f"{base}/jobs/{running.id}/", "#job-status[hx-get]")
    AdminJob.objects.filter(pk=running.pk).update(status=JobStatus.SUCCEEDED, progress=100, finished=timezone.now())
    page.wait_for_selector("#job-status:not([hx-get])", timeout=15_000)
    assert "Succeeded" in page.inner_text("#job-status")
    watch.assert_none()
