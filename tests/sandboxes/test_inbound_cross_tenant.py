"""Adversarial review (rev1): on the inbound host of its own (INBOUND_BASE_URL), every
sandbox of every space is served on ONE origin. A page in space B's sandbox is then
same-origin with space A's: its script reads A's pages with the visitor's A link cookie
(SameSite=Lax is no barrier within an origin) and A's localStorage. Real console, real
Docker sandboxes, Chromium; every request goes to 127.0.0.1/localhost."""

from __future__ import annotations

import os
import urllib.parse

import pytest

from tests.sandboxes.test_inbound_proxy import World, world  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.docker]

VICTIM_PAGE = "<!doctype html><script>localStorage.setItem('a-secret', 'a-storage-secret')</script><p>a</p>"
ATTACKER_PAGE = (
    "<!doctype html><script>"
    "window.seen = {storage: (() => { try { return localStorage.getItem('a-secret'); }"
    " catch (e) { return 'refused'; } })()};"
    "fetch(window.VICTIM, {credentials: 'include'}).then(r => r.text())"
    ".then(t => { window.seen.read = t.trim(); }).catch(() => { window.seen.read = 'refused'; });"
    "</script>"
)


@pytest.mark.xfail(
    strict=True,
    reason="rev1: one origin for all sandboxes on INBOUND_BASE_URL; needs a host per sandbox "
    "(e.g. <sandbox>-<port>.<inbound domain>) or CSP sandbox there too",
)
def test_a_page_in_another_spaces_sandbox_cannot_read_this_one(world: World) -> None:  # noqa: F811
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)", pytrace=False)
    for letter, body in (("a", VICTIM_PAGE), ("b", ATTACKER_PAGE)):
        api = world.api(letter)
        assert api.shell("web", "mkdir -p /workspace/x").status == 200
        put = api.call("PUT", "web", "files/content?path=x/page.html", raw=body.encode())
        assert put.status == 201, put.body
    origin = f"http://localhost:{world.port}"  # the inbound host of its own
    victim_path = f"/inbound/{world.sandboxes['a']}/8000/hello.txt"
    links = {}
    for letter in "ab":
        made = world.api(letter).call("POST", "web", "inbound/links", {"port": 8000, "ttl_s": 300})
        assert made.status == 201, made.body
        links[letter] = urllib.parse.urlsplit(made.body["url"])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            page = context.new_page()
            # The visitor uses A's app (a link A's member sent), then opens a link to B's.
            page.goto(f"{origin}{links['a'].path}?{links['a'].query}")
            page.goto(f"{origin}/inbound/{world.sandboxes['a']}/8000/x/page.html")
            page.wait_for_load_state("load")
            page.goto(f"{origin}{links['b'].path}?{links['b'].query}")
            page.add_init_script(f"window.VICTIM = {victim_path!r};")
            page.goto(f"{origin}/inbound/{world.sandboxes['b']}/8000/x/page.html")
            page.wait_for_function("window.seen && window.seen.read")
            seen = page.evaluate("window.seen")
            context.close()
        finally:
            browser.close()
    # Today both hold: B's script read A's page with the visitor's A cookie, and A's storage.
    leaked = {"read": seen["read"] == "hello-inbound-a", "storage": seen["storage"] == "a-storage-secret"}
    assert leaked == {"read": False, "storage": False}, seen


def test_a_link_with_its_parameter_name_percent_encoded_is_not_a_redirect_loop(world: World) -> None:  # noqa: F811
    """`?%5Fconsole_link=…` is the same parameter to the route's check (parse_qsl decodes it),
    but the step that leaves the link out compares raw bytes: the 303 keeps the link in the
    Location, the next request sets the cookie again and answers 303 again, for ever (and a
    link the route did not take is passed on to the sandbox's app)."""
    made = world.api("a").call("POST", "web", "inbound/links", {"port": 8000, "ttl_s": 120})
    assert made.status == 201, made.body
    link = urllib.parse.urlsplit(made.body["url"])
    encoded = link.query.replace("_console_link=", "%5Fconsole_link=", 1)
    first = world.request(f"{link.path}?{encoded}")
    assert first.status == 303
    cookie = (first.header("Set-Cookie") or "").split(";", 1)[0]
    second = world.request(first.header("Location") or "", headers={"Cookie": cookie})
    assert second.status == 200, (second.status, second.header("Location"))
