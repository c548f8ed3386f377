"""The main flows end to end in Chromium, against the live console (Daphne) and the
real Docker engine: a new space admin logs in and follows the dashboard's getting-started path
(config, connection test, skill, session, terminal), which checks itself off; on the way the
network policy form refuses a bad entry and warns about what the Docker config cannot honour;
an agent API call with a token made on the tokens page;
the session page's files, artifacts and live resources; vim, resize, reload-reattach and logout in the
terminal; an outsider gets 404; the dashboard charts drawn. One Docker session serves every
session flow (2 cores).

Screenshots (1280x800 and 390x844, light and dark) go to var/test-artifacts/screenshots/,
kept out of git.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from console import metrics
from console.activity import take_sample
from console.models import NetworkPolicy
from sandboxes.backends.base import META_INSTALLATION
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import BackgroundCommand, CommandStatus, SandboxConfig, Session, Terminal
from tests.factories import make_backend, make_config
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import ROOT, SCREENSHOTS, log_in, shoot_all, wait_for_job, wait_until
from tests.support.skill_install import clean_up, examples_source  # noqa: F401 - fixture
from tests.support.tuning import Tuned

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker, pytest.mark.slow]


BUFFER_TEXT = """() => {
  const buffer = window.consoleTerminal.term.buffer.active;
  const lines = [];
  for (let i = 0; i < buffer.length; i += 1) lines.push(buffer.getLine(i).translateToString(true));
  return lines.join("\\n");
}"""
INKED_PIXELS = """(selector) => {
  const canvas = document.querySelector(selector + " canvas");
  if (!canvas || !canvas.width || !canvas.height) return 0;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked += 1;
  return inked;
}"""


def step_done(page: Any, base: str, key: str) -> bool:
    page.goto(f"{base}/")
    return str(page.get_attribute(f"#step-{key}", "data-done")) == "true"


def wait_for_text(page: Any, pattern: str, timeout_s: float = 20) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = str(page.evaluate(BUFFER_TEXT))
        if re.search(pattern, text):
            return text
        assert time.monotonic() < deadline, f"{pattern!r} not in the terminal: {text[-800:]!r}"
        page.wait_for_timeout(100)


def wait_connected(page: Any) -> None:
    try:
        wait_until(page, "window.consoleTerminal && window.consoleTerminal.state() === 'connected'", timeout=60_000)
    except AssertionError:  # not a script error: that one is raised as it is
        raise AssertionError(f"not connected: {page.inner_text('#terminal-card')!r}") from None


@pytest.fixture
def live(
    tuned: Tuned,
    world: World,
    docker_base_image: str,  # noqa: F811
    examples_source: Path,  # noqa: F811
    settings: Any,
    test_run_id: str,  # noqa: F811
) -> Iterator[dict[str, Any]]:
    """Before `daphne_url` (the forked server inherits these settings): space A is granted the
    local Docker engine, with the examples' wheels as its pip source; on teardown everything
    this run made on the engine goes."""
    settings.CONSOLE_INSTALLATION_ID = installation = f"test-{test_run_id}-flows"
    tuned({"terminal.reattach_s": 30})
    backend = make_backend(world.space_a, name="Local Docker", pip_find_links=examples_source.name)
    try:
        yield {"backend": backend, "image": docker_base_image}
    finally:
        connection.close()
        for config in SandboxConfig.objects.filter(space=world.space_a, backend__kind="docker"):
            clean_up(config, installation)
            delete_snapshots(config, installation)


def delete_snapshots(config: SandboxConfig, installation: str) -> None:
    """The skill image's snapshots carry the installation as a label of their own
    (`console-installation`; their `console.meta.*` copy is blanked), which clean_up misses."""
    snapshots = get_backend(config).snapshots()
    assert snapshots is not None
    ours = [s for s in snapshots.list() if s.labels.get(META_INSTALLATION) == installation]
    for snapshot in sorted(ours, key=lambda s: s.created_at or 0, reverse=True):  # children first
        snapshots.delete(snapshot.snapshot_id)


@pytest.mark.timeout(900)  # the whole first-run path, an image build among it, on 2 cores
def test_a_new_admin_goes_from_login_to_a_terminal(
    world: World, live: dict[str, Any], daphne_url: str, page: Any
) -> None:
    base = daphne_url
    space = world.space_a
    page.set_viewport_size({"width": 1280, "height": 800})

    # Log in; the getting-started path has nothing done and points to the config form.
    log_in(page, base, "alice")
    assert page.is_visible("#getting-started")
    for key in ("config", "test", "skill", "session", "terminal"):
        assert page.get_attribute(f"#step-{key}", "data-done") == "false", key
    assert "0 of 5 done" in page.inner_text("#getting-started")
    shoot_all(page, "dashboard-first-run")
    page.click("#step-config a")
    page.wait_for_url(re.compile(rf".*/spaces/{space.id}/sandboxes/new/"))

    # A Docker config, through the two-step form (the backend's kind decides the fields).
    page.select_option("#id_backend", str(live["backend"].pk))
    page.wait_for_selector("#config-kind")
    assert "Docker" in page.inner_text("#config-kind")
    page.fill("#id_name", "first")
    template = page.locator("#id_default_template")
    if template.evaluate("el => el.tagName") == "SELECT":
        template.select_option(live["image"])
    else:
        template.fill(live["image"])
    if page.is_visible("#id_is_default") and not page.is_checked("#id_is_default"):
        page.check("#id_is_default")
    page.click("#config-form button[type=submit]:has-text('Save')")
    page.wait_for_url(re.compile(r".*/sandboxes/[0-9a-f-]{36}/$"))
    config = SandboxConfig.objects.get(space=space, name="first")
    assert config.default_template == live["image"]
    assert step_done(page, base, "config")

    # Test connection: a job, followed on its page until it succeeds.
    page.goto(f"{base}{config.get_absolute_url()}")
    page.click("form[action$='/test/'] button")
    page.wait_for_url(re.compile(r".*/jobs/[0-9a-f-]{36}/$"))
    status = wait_for_job(page, timeout_s=120)
    assert status == "Succeeded", page.inner_text("#job-status")
    assert step_done(page, base, "test")

    # The network policy: a bad entry is a field error, nothing saved.
    page.goto(f"{base}/spaces/{space.id}/network/")
    shoot_all(page, "policy-form")
    page.check("#id_allow_internet_access")
    page.fill("#id_allow_out", "not a host!!")
    page.click("#network-policy-form button[type=submit]")
    page.wait_for_selector("#network-policy-form .has-error .error")
    assert "not a host!!" in page.inner_text("#network-policy-form .has-error")
    assert NetworkPolicy.objects.get(space=space).allow_out == []
    shoot_all(page, "policy-error", reload=False)
    # A second config, on an E2B backend (never contacted here): E2B cannot enforce domain deny
    # entries. Such an entry is saved, with a warning naming that config and not Docker's.
    make_config(space, name="cloud", kind="e2b", endpoint="http://127.0.0.1:9", api_key="e2b_test")
    page.fill("#id_allow_out", "")
    page.fill("#id_deny_out", "blocked.example")
    page.click("#network-policy-form button[type=submit]")
    page.wait_for_url(re.compile(rf".*/spaces/{space.id}/(#.*)?$"))
    warning = page.inner_text(".message-warning")
    assert "cloud" in warning
    assert "domain deny" in warning
    assert "first" not in warning
    assert NetworkPolicy.objects.get(space=space).deny_out == ["blocked.example"]
    shoot_all(page, "policy-warning", reload=False)
    # Back to no outbound access for the session below (the form unchecked).
    page.goto(f"{base}/spaces/{space.id}/network/")
    page.uncheck("#id_allow_internet_access")
    page.fill("#id_deny_out", "")
    page.click("#network-policy-form button[type=submit]")
    page.wait_for_url(re.compile(rf".*/spaces/{space.id}/(#.*)?$"))
    assert NetworkPolicy.objects.get(space=space).allow_internet_access is False

    # Skills: the catalog is the platform's. A platform admin (root, in a context of its own)
    # imports the bundled examples from the empty catalog; alice installs text-stats.
    assert step_done(page, base, "skill") is False
    page.goto(f"{base}/skills/")
    assert not page.is_visible("button:has-text('Import the bundled examples')")
    root_context = page.context.browser.new_context()
    try:
        admin = root_context.new_page()
        log_in(admin, base, "root")
        admin.goto(f"{base}/skills/")
        admin.click("button:has-text('Import the bundled examples')")
        admin.wait_for_selector("#skill-results >> text=text-stats")
        assert "csv-summary" in admin.inner_text("#skill-results")
    finally:
        root_context.close()
    page.goto(f"{base}/skills/")
    page.click("a:has-text('text-stats')")
    # One step from the skill's page: choose the space's config, install, follow the job in place.
    page.select_option("#quick-install-target", f"{space.id}:{config.id}")
    page.click("#quick-install button[type=submit]")
    page.wait_for_selector("#quick-install-result #job-status .status", timeout=20_000)
    status = wait_for_job(page, timeout_s=300)
    assert status == "Succeeded", page.inner_text("#job-status")
    assert step_done(page, base, "skill")

    # A session from the Sessions page's form: one Docker sandbox for the rest of the test.
    page.click("#step-session a")
    page.wait_for_selector("#start-session")
    if not page.is_visible(".start-session-form"):
        page.click("#start-session summary")
    page.fill(".start-session-form input[name=key]", "flows-e2e")
    page.click(".start-session-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/sessions/[0-9a-f-]{36}/$"), timeout=120_000)
    session = Session.objects.get(space=space, key="flows-e2e")
    assert session.sandbox_id
    assert step_done(page, base, "session")
    session_url = f"{base}{session.get_absolute_url()}"

    # An agent's API call on the same session, with a token made on the tokens page.
    page.goto(f"{base}/spaces/{space.id}/tokens/")
    page.fill("#id_name", "flows-agent")
    page.click("form.inline button[type=submit]:has-text('Create token')")
    secret = page.inner_text("#new-token-secret").strip()
    assert secret.startswith("sck_")
    api = f"{base}/api/v1/spaces/{space.id}/sessions/flows-e2e/exec"
    refused = page.request.post(api, data={"shell": "true"}, headers={"Authorization": "Bearer sck_wrong"})
    assert refused.status == 401
    answer = page.request.post(
        api,
        data={"shell": "mkdir -p /workspace/output && echo from-the-api | tee /workspace/output/api.txt"},
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert answer.status == 200, answer.text()
    assert answer.json()["exit_code"] == 0
    assert answer.json()["stdout"] == "from-the-api\n"

    # Files: upload into input/, browse it, download it back.
    page.goto(session_url)
    upload = ROOT / "var" / "test-artifacts" / "flows-upload.txt"
    upload.parent.mkdir(parents=True, exist_ok=True)
    upload.write_text("words for text-stats\n")
    page.set_input_files("#id_file", str(upload))
    page.click("#files form[enctype] button[type=submit]")
    page.goto(f"{session_url}?browse=1&path=input")
    page.wait_for_selector("#files table.list")
    assert "flows-upload.txt" in page.inner_text("#files table.list")
    with page.expect_download() as download:
        page.click("#files tr[data-name='flows-upload.txt'] a:has-text('Download')")
    assert Path(download.value.path()).read_text() == "words for text-stats\n"

    # A background command writes into output/ (the installed skill runs); artifacts collected.
    page.goto(session_url)
    page.fill(
        "#id_shell",
        "mkdir -p /workspace/output && /opt/skills/text-stats/scripts/text-stats.sh"
        " /workspace/input/flows-upload.txt > /workspace/output/stats.json",
    )
    page.click("#commands form button[type=submit]")
    deadline = time.monotonic() + 60
    while True:
        page.goto(session_url)
        if "Running" not in page.inner_text("#commands"):
            break
        assert time.monotonic() < deadline, page.inner_text("#commands")
        page.wait_for_timeout(500)
    command = BackgroundCommand.objects.get(session=session)
    assert (command.status, command.exit_code) == (CommandStatus.EXITED, 0), page.inner_text("#commands")
    page.click("#artifacts form button[type=submit]")
    page.goto(session_url)
    page.wait_for_selector("#artifacts table.list")
    assert "stats.json" in page.inner_text("#artifacts")
    assert "api.txt" in page.inner_text("#artifacts")
    with page.expect_download() as download:
        page.click("#artifacts a:has-text('stats.json')")
    assert '"words": 3' in Path(download.value.path()).read_text().replace(":3", ": 3")
    assert page.is_visible("#egress")
    # Live resources of the sandbox (Docker stats), polled by HTMX.
    assert page.get_attribute("#live-stats", "data-status") == "running", page.inner_text("#live-stats")
    assert re.match(r"[0-9.]+ %", page.inner_text('#live-stats [data-stat="cpu"]'))
    assert re.search(r"[0-9.]+\s(bytes|KB|MB|GB)", page.inner_text('#live-stats [data-stat="memory"]'))
    shoot_all(page, "session")

    # The terminal: vim, resize, reload-reattach, then logout.
    page.click("#open-terminal")
    wait_connected(page)
    page.click("#terminal")
    page.keyboard.type("export MARK=kept; vim -u NONE /workspace/notes.txt\n")
    wait_for_text(page, r"~\s*\n~", timeout_s=30)  # vim's empty-buffer tildes
    page.keyboard.type("ihello from vim")
    page.keyboard.press("Escape")
    page.keyboard.type(":wq\n")
    page.keyboard.type("clear; cat /workspace/notes.txt\n")
    wait_for_text(page, r"(?m)^hello from vim\s*$")
    page.set_viewport_size({"width": 800, "height": 600})
    page.wait_for_timeout(500)
    cols, rows = page.evaluate("[window.consoleTerminal.term.cols, window.consoleTerminal.term.rows]")
    page.keyboard.type("clear; stty size\n")
    wait_for_text(page, rf"(?m)^{rows} {cols}\s*$")
    first_id = page.evaluate("window.consoleTerminal.terminalId()")
    page.reload()
    wait_connected(page)
    assert page.evaluate("window.consoleTerminal.terminalId()") == first_id
    assert "reattached" in page.inner_text("#terminal-state")
    wait_for_text(page, rf"(?m)^{rows} {cols}\s*$")  # the scrollback, before anything is typed
    page.click("#terminal")
    page.keyboard.type('echo "[$MARK]"\n')
    wait_for_text(page, r"(?m)^\[kept\]\s*$")
    page.screenshot(path=str(SCREENSHOTS / "flow-terminal-800x600.png"))
    page.keyboard.type("logout\n")
    wait_until(page, "window.consoleTerminal.state() !== 'connected'", timeout=20_000)
    deadline = time.monotonic() + 20
    while Terminal.objects.get(pk=first_id).closed is None:
        assert time.monotonic() < deadline, "the terminal row was not closed after logout"
        time.sleep(0.2)
    page.set_viewport_size({"width": 1280, "height": 800})

    # The whole path is checked off.
    page.goto(f"{base}/")
    for key in ("config", "test", "skill", "session", "terminal"):
        assert page.get_attribute(f"#step-{key}", "data-done") == "true", key
    assert "5 of 5 done" in page.inner_text("#getting-started")
    shoot_all(page, "dashboard")

    # An outsider (admin of another space) gets 404 for this session, its terminal and the policy.
    page.context.clear_cookies()
    log_in(page, base, "charlie")
    for path in (session.get_absolute_url(), f"/sessions/{session.id}/terminal/", f"/spaces/{space.id}/network/"):
        response = page.goto(f"{base}{path}")
        assert response is not None
        assert response.status == 404, path


def test_the_dashboard_draws_its_charts(world: World, daphne_url: str, page: Any) -> None:
    """A platform admin's dashboard: activity.js draws every chart from the JSON series (or
    marks it empty); screenshots at both sizes, light and dark."""
    now = timezone.now()
    for minutes in range(30, 0, -5):
        metrics.RESOLVE_SECONDS.labels(path="fast", outcome="bound").observe(0.02)
        take_sample(now - timedelta(minutes=minutes))
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, daphne_url, "root")
    page.wait_for_selector('figure[data-chart="resolves"][data-drawn="true"]', timeout=15_000)
    figures = page.locator("figure[data-chart]")
    assert figures.count() >= 3
    for index in range(figures.count()):
        assert figures.nth(index).get_attribute("data-drawn") in ("true", "empty")
    assert page.evaluate(INKED_PIXELS, 'figure[data-chart="resolves"]') > 500
    shoot_all(page, "dashboard-charts")
