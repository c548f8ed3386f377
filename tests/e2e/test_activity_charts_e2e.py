"""The dashboard's activity charts in a real browser: uPlot draws them from the JSON series,
and the tables (the fallback without JavaScript) fold away once a chart is drawn."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from console import metrics
from console.activity import take_sample
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, session_config, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

# Non-blank pixels of a figure's canvas: the chart drew lines and axes, not an empty box.
INKED_PIXELS = """(selector) => {
  const canvas = document.querySelector(selector + " canvas");
  if (!canvas || !canvas.width || !canvas.height) return 0;
  const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let inked = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked += 1;
  return inked;
}"""


def log_in(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def test_the_dashboard_charts_are_drawn_from_the_series(world: World, daphne_url: str, page: Any) -> None:
    now = timezone.now()
    for minutes in range(30, 0, -5):
        for _ in range(minutes // 5):
            metrics.RESOLVE_SECONDS.labels(path="fast", outcome="bound").observe(0.02)
        metrics.BACKEND_ERRORS.labels(backend_kind="docker", operation="get", error="unavailable").inc()
        take_sample(now - timedelta(minutes=minutes))
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, daphne_url, "root")
    page.wait_for_selector('figure[data-chart="resolves"][data-drawn="true"]', timeout=15000)
    for chart in ("sessions", "resolves", "errors"):
        selector = f'figure[data-chart="{chart}"]'
        assert page.get_attribute(selector, "data-drawn") in ("true", "empty")
    for chart in ("resolves", "errors"):
        selector = f'figure[data-chart="{chart}"]'
        assert page.evaluate(INKED_PIXELS, selector) > 500, chart
        # Drawn: its table folded away (still there, one click away).
        assert page.evaluate(f"document.querySelector('{selector} details').open") is False
    legend = page.inner_text('figure[data-chart="resolves"] .u-legend')
    assert "bound" in legend
    # The OS switches to dark mid-page: the charts redraw in the page's new colours.
    figure = 'figure[data-chart="resolves"]'
    ink = f"document.querySelector('{figure}').getAttribute('data-ink')"
    page_ink = f"getComputedStyle(document.querySelector('{figure}')).color"
    page.emulate_media(color_scheme="light")
    wait_until(page, f"{ink} === {page_ink}")
    light = page.evaluate(ink)
    page.emulate_media(color_scheme="dark")
    wait_until(page, f"{ink} !== {light!r} && {ink} === {page_ink}", timeout=5000)
    dark = page.evaluate(ink)
    assert dark != light
    assert page.evaluate(INKED_PIXELS, figure) > 500  # drawn again, not left blank
    assert page.locator(f"{figure} canvas").count() == 1  # replaced, not stacked
    page.emulate_media(color_scheme="light")
    wait_until(page, f"{ink} === {light!r}", timeout=5000)
    out = Path(os.environ.get("E2E_ARTIFACTS", "var/e2e-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "dashboard-charts-1280.png"), full_page=True)
    # The page of its own draws the full set.
    page.goto(f"{daphne_url}/platform/activity/?window=1h")
    page.wait_for_selector('figure[data-chart="reaper"][data-drawn]', timeout=15000)
    assert page.locator("figure[data-chart][data-drawn]").count() == 6
    assert page.evaluate(INKED_PIXELS, 'figure[data-chart="latency"]') > 500
    page.emulate_media(color_scheme="dark")
    wait_until(
        page,
        "(() => { const f = document.querySelector('figure[data-chart=\"latency\"]');"
        " return f.getAttribute('data-ink') === getComputedStyle(f).color; })()",
        timeout=5000,
    )
    page.emulate_media(color_scheme="light")
    page.screenshot(path=str(out / "activity-1280.png"), full_page=True)


@pytest.fixture
def stats_session(world: World, session_config: SandboxConfig) -> Session:  # noqa: F811
    # Before the browser starts: ORM calls made under Playwright get a connection of their own.
    return Runtime().resolve(world.space_a, "e2e-stats").session


@pytest.mark.docker
@pytest.mark.slow
def test_the_session_page_polls_its_sandbox_resources(stats_session: Session, daphne_url: str, page: Any) -> None:
    session = stats_session
    page.set_viewport_size({"width": 1280, "height": 800})
    log_in(page, daphne_url, "bob")
    page.goto(f"{daphne_url}{session.get_absolute_url()}")
    assert page.get_attribute("#live-stats", "data-status") == "running"
    assert re.match(r"[0-9.]+ %", page.inner_text('#live-stats [data-stat="cpu"]'))
    first_url = page.get_attribute("#live-stats", "hx-get")
    # HTMX swaps in a fresh reading (its poll URL carries the new reading's time).
    with page.expect_response(lambda r: "/stats/" in r.url and r.status == 200, timeout=15000):
        pass
    wait_until(page, f"document.querySelector('#live-stats').getAttribute('hx-get') !== {first_url!r}")
    assert re.search(r"[0-9.]+\s(bytes|KB|MB|GB)", page.inner_text('#live-stats [data-stat="memory"]'))
    out = Path(os.environ.get("E2E_ARTIFACTS", "var/e2e-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    page.locator("#live-stats").screenshot(path=str(out / "session-live-stats.png"))
