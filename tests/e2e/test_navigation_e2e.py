"""The top bar, the command palette, the shortcuts, the favicon and the times, in Chromium at
1280x800 and 390x844, light and dark: the bar fits (one line wide, folded narrow), the palette
finds only what the user may open, times read relative with the zone on hover, and axe-core
finds no serious violation. Screenshots go under the test artifacts folder."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sandboxes.models import Session
from tests.factories import make_config
from tests.personas import World
from tests.support.browser import SCREENSHOTS, assert_accessible, log_in, shoot_all, wait_until, with_axe

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
BAR_HEIGHT = "document.querySelector('.topbar').getBoundingClientRect().height"


@pytest.fixture
def sessions(world: World) -> dict[str, Session]:
    config_a = make_config(world.space_a, name="palette-config")
    config_b = make_config(world.space_b, name="palette-config-b")
    return {
        "a": Session.objects.create(space=world.space_a, config=config_a, key="palette-session-a"),
        "b": Session.objects.create(space=world.space_b, config=config_b, key="palette-session-b"),
    }


def palette_labels(page: Any) -> list[str]:
    return list(
        page.eval_on_selector_all("#palette-list [role=option] .palette-label", "els => els.map(e => e.textContent)")
    )


def search_in_palette(page: Any, text: str) -> list[str]:
    page.fill("#palette-input", text)
    wait_until(
        page,
        f"document.getElementById('palette-input').value === {text!r} && "
        "document.querySelector('.palette-status').textContent !== ''",
        timeout=5000,
    )
    page.wait_for_timeout(400)  # the debounce and the answer
    return palette_labels(page)


def test_the_bar_fits_at_both_widths_and_folds_on_a_phone(
    world: World, sessions: dict[str, Session], daphne_url: str, page: Any
) -> None:
    with_axe(page)
    log_in(page, daphne_url, "root")  # the most links: the platform's too
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto(f"{daphne_url}/")
        assert page.evaluate(BAR_HEIGHT) <= 60, "the top bar wraps at 1280 px"
        assert not page.is_visible("#nav-toggle")
        page.click("details.navgroup.navdrop summary")
        assert page.is_visible(".mainnav a[data-section=users]")
        page.screenshot(path=str(SCREENSHOTS / f"nav-platform-open-desktop-{scheme}.png"))
        assert_accessible(page, f"dashboard, platform menu open ({scheme})")
        page.keyboard.press("Escape")
        assert not page.is_visible(".mainnav a[data-section=users]")

        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        assert page.evaluate(BAR_HEIGHT) <= 60, "the folded bar takes one line at 390 px"
        assert page.is_visible("#nav-toggle")
        assert not page.is_visible(".mainnav")
        page.click("#nav-toggle")
        assert page.get_attribute("#nav-toggle", "aria-expanded") == "true"
        assert page.is_visible(".mainnav a[data-section=sessions]")
        assert page.is_visible("text=Work")
        assert page.is_visible("text=Setup")
        page.screenshot(path=str(SCREENSHOTS / f"nav-menu-open-phone-{scheme}.png"), full_page=True)
        assert_accessible(page, f"dashboard, menu open at 390 px ({scheme})")
        assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1280, "height": 800})
    shoot_all(page, "dashboard-nav")


def test_the_palette_jumps_to_a_session_and_never_shows_another_tenant(
    world: World, sessions: dict[str, Session], daphne_url: str, page: Any
) -> None:
    with_axe(page)
    log_in(page, daphne_url, "bob")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{daphne_url}/spaces/")
    page.keyboard.press("Control+k")
    assert page.is_visible("dialog.palette")
    assert page.evaluate("document.activeElement.id") == "palette-input"
    assert "palette-session-a" in search_in_palette(page, "palette-session")
    assert "palette-session-b" not in palette_labels(page)
    assert "Space B" not in search_in_palette(page, "Space")
    assert search_in_palette(page, str(sessions["b"].id)) == []  # a forged id finds nothing
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        search_in_palette(page, "palette")
        for size, (width, height) in SIZES.items():
            page.set_viewport_size({"width": width, "height": height})
            page.wait_for_timeout(200)
            page.screenshot(path=str(SCREENSHOTS / f"palette-{size}-{scheme}.png"))
        assert_accessible(page, f"palette open ({scheme})")
    page.emulate_media(color_scheme="light")
    page.set_viewport_size({"width": 1280, "height": 800})
    search_in_palette(page, "palette-session-a")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(re.escape(sessions["a"].get_absolute_url()) + "$"))

    # "/" opens it too, Esc closes it; "g" then "k" goes to the skills.
    page.goto(f"{daphne_url}/")
    page.keyboard.press("/")
    assert page.is_visible("dialog.palette")
    page.keyboard.press("Escape")
    assert not page.is_visible("dialog.palette")
    page.keyboard.press("g")
    page.keyboard.press("k")
    page.wait_for_url(re.compile(r".*/skills/$"))

    # The other tenant sees its own session and not bob's.
    page.context.clear_cookies()
    log_in(page, daphne_url, "charlie")
    page.keyboard.press("Control+k")
    labels = search_in_palette(page, "palette-session")
    assert "palette-session-b" in labels
    assert "palette-session-a" not in labels


def test_times_read_relative_with_the_zone_on_hover_and_utc_without_javascript(
    world: World, daphne_url: str, page: Any
) -> None:
    page.context.browser  # noqa: B018 - the same browser for the no-script context below
    log_in(page, daphne_url, "alice")
    time_node = "#main time.when"
    page.wait_for_selector(time_node)
    text = page.inner_text(time_node)
    assert re.search(r"ago|now|second|minute", text), text
    title = page.get_attribute(time_node, "title") or ""
    assert "UTC" in title, title
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", page.get_attribute(time_node, "datetime") or "")
    # No raw ISO string is shown anywhere on the page.
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", page.inner_text("body"))

    context = page.context.browser.new_context(java_script_enabled=False, timezone_id="Asia/Tokyo")
    try:
        nojs = context.new_page()
        log_in(nojs, daphne_url, "alice")
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC$", nojs.inner_text(time_node))
        assert nojs.is_visible(".mainnav a[data-section=sessions]")  # the groups stay open
        assert not nojs.is_visible("#nav-toggle")
        nojs.set_viewport_size({"width": 390, "height": 844})
        nojs.screenshot(path=str(SCREENSHOTS / "nav-nojs-phone-light.png"), full_page=True)
        assert nojs.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0
    finally:
        context.close()

    zoned = page.context.browser.new_context(timezone_id="Asia/Tokyo")
    try:
        tokyo = zoned.new_page()
        log_in(tokyo, daphne_url, "alice")
        assert re.search(r"GMT\+9|JST", tokyo.get_attribute(time_node, "title") or "")
    finally:
        zoned.close()


def test_the_favicon_answers_and_no_page_asks_for_a_missing_file(world: World, daphne_url: str, page: Any) -> None:
    missing: list[str] = []
    page.on("response", lambda response: missing.append(response.url) if response.status >= 400 else None)
    log_in(page, daphne_url, "bob")
    for path in ("/", "/spaces/", "/sessions/", "/search/?q=space"):
        page.goto(f"{daphne_url}{path}")
        page.wait_for_load_state("networkidle")
    assert missing == []
    icon = page.request.get(f"{daphne_url}/favicon.ico")
    assert icon.status == 200
    assert icon.headers["content-type"] == "image/svg+xml"
    assert icon.body().startswith(b"<svg")
    assert page.get_attribute("link[rel=icon]", "href", timeout=1000)


def test_search_page_and_shortcuts_are_accessible(
    world: World, sessions: dict[str, Session], daphne_url: str, page: Any
) -> None:
    with_axe(page)
    log_in(page, daphne_url, "bob")
    page.goto(f"{daphne_url}/search/?q=palette")
    assert page.is_visible("#search-results")
    assert page.is_visible("#shortcuts")
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for path in ("/search/?q=palette", "/", "/spaces/"):
            page.goto(f"{daphne_url}{path}")
            assert_accessible(page, f"{path} ({scheme})")
    page.emulate_media(color_scheme="light")
    page.goto(f"{daphne_url}/search/?q=palette")
    shoot_all(page, "search")
