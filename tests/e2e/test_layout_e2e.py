"""The layout in a real browser: no horizontal scroll at 390 px, dark mode through
prefers-color-scheme, copy buttons, the skip link. Screenshots of the pages looked at go to
var/screenshots/ (kept out of git) at 1280x800 and 390x844, light and dark."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from console.models import NetworkPolicy
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.conftest import docker_base_image, session_config, test_run_id  # noqa: F401 - fixtures
from tests.support.browser import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}

# How far the page scrolls sideways (0 when it fits), and the widest element that sticks out.
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  let worst = null;
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width && r.right > width + 1 && !el.closest('table.list, pre')) {
      if (!worst || r.right > worst.right) worst = {tag: el.tagName, cls: el.className, right: r.right};
    }
  }
  return {scroll: document.documentElement.scrollWidth - width, worst: worst};
}"""


def log_in(page: Any, base: str, who: str) -> None:
    page.goto(f"{base}/login/")
    page.fill("#id_username", who)
    page.fill("#id_password", f"pw-{who}")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def shoot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def check_pages(page: Any, base: str, paths: dict[str, str]) -> None:
    """Every page at both sizes and in both schemes: no sideways scroll; screenshots."""
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for size, (width, height) in SIZES.items():
            page.set_viewport_size({"width": width, "height": height})
            for name, path in paths.items():
                response = page.goto(f"{base}{path}")
                assert response is not None
                assert response.status < 500, (name, response.status)
                shoot(page, f"{name}-{size}-{scheme}")
                overflow = page.evaluate(OVERFLOW)
                assert overflow["scroll"] <= 0, f"{name} at {width}px scrolls sideways: {overflow}"


def test_pages_fit_a_phone_and_have_a_dark_mode(world: World, daphne_url: str, page: Any) -> None:
    config = make_config(world.space_a, name="offline", endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    session = Session.objects.create(
        space=world.space_a,
        key="a-rather-long-session-key-" + "x" * 60,
        config=config,
        state=SessionState.RUNNING,
        sandbox_id="f" * 64,
        has_persistent_workspace=True,
    )
    NetworkPolicy.objects.update_or_create(
        space=world.space_a,
        defaults={
            "allow_internet_access": True,
            "allow_out": [f"host{i:03d}.a-long-subdomain.example.com" for i in range(300)],
            "deny_out": ["0.0.0.0/0"],
        },
    )
    log_in(page, daphne_url, "alice")
    paths = {
        "dashboard": "/",
        "space": reverse("console:space_detail", args=[world.space_a.id]),
        "session": session.get_absolute_url(),
        "sessions": reverse("sandboxes:session_list"),
        "config": config.get_absolute_url(),
        "config-form": reverse("sandboxes:config_create", args=[world.space_a.id]),
        "jobs": reverse("console:job_list"),
        "tokens": reverse("sandboxes:token_list", args=[world.space_a.id]),
        "not-found": "/no/such/page/",
    }
    check_pages(page, daphne_url, paths)

    # The colours follow the scheme the browser asks for.
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{daphne_url}/")
    page.emulate_media(color_scheme="light")
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    card_light = page.evaluate("getComputedStyle(document.querySelector('.card')).backgroundColor")
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    card_dark = page.evaluate("getComputedStyle(document.querySelector('.card')).backgroundColor")
    assert light == "rgb(246, 247, 249)"
    assert dark == "rgb(12, 17, 29)"
    assert card_light == "rgb(255, 255, 255)"
    assert card_dark != card_light

    # The skip link is the first stop of the keyboard and lands on the content.
    page.goto(f"{daphne_url}/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.className") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("location.hash") == "#main"


def test_copy_buttons_copy(world: World, daphne_url: str, page: Any) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=daphne_url)
    log_in(page, daphne_url, "alice")
    page.goto(f"{daphne_url}{reverse('sandboxes:token_list', args=[world.space_a.id])}")
    page.fill("#id_name", "agent")
    page.click("form.inline button[type=submit]")
    secret = page.inner_text("#new-token-secret").strip()
    assert secret
    button = page.locator("#copy-new-token")
    assert button.is_visible()  # revealed by the script (hidden without JavaScript)
    button.click()
    wait_until(page, "document.querySelector('#copy-new-token').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 390, "height": 844})
    shoot(page, "new-token-phone-dark")


@pytest.mark.docker
@pytest.mark.slow
def test_the_binding_inspector_holds_a_real_sandbox_id(
    world: World,
    session_config: SandboxConfig,  # noqa: F811
    daphne_url: str,
    page: Any,
) -> None:
    session = Runtime().resolve(world.space_a, "inspector-" + "y" * 80).session
    log_in(page, daphne_url, "bob")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{daphne_url}{session.get_absolute_url()}")
    assert page.locator("#bound-sandbox-id").inner_text() == session.sandbox_id
    overflow = page.evaluate(
        "(() => { const c = document.querySelector('#binding-inspector'); return c.scrollWidth - c.clientWidth; })()"
    )
    assert overflow <= 0
    assert page.evaluate(OVERFLOW)["scroll"] <= 0
    assert page.locator("#action-pause").is_visible()
    assert page.locator("#action-resume").count() == 0
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        shoot(page, f"session-live-phone-{scheme}")


def test_config_form_swaps_the_kind_fields_in_place(world: World, daphne_url: str, page: Any) -> None:
    from tests.factories import make_backend

    docker = make_backend(world.space_a, name="local docker")
    e2b = make_backend(
        world.space_a,
        name="remote e2b",
        kind="e2b",
        endpoint="http://127.0.0.1:9",  # closed: nothing leaves the machine
        domain="sandbox.example.com",
        api_key="k",
        allow_private_endpoints=True,
    )
    log_in(page, daphne_url, "alice")
    page.goto(f"{daphne_url}{reverse('sandboxes:config_create', args=[world.space_a.id])}")
    assert page.locator("#id_name").count() == 0  # step 1: the backend alone
    page.evaluate("window.notReloaded = true")
    page.select_option("#id_backend", str(e2b.pk))
    page.wait_for_selector("#id_protocol_pin")
    assert page.locator("#id_pids_limit").count() == 0
    page.fill("#id_name", "typed before the switch")
    page.select_option("#id_backend", str(docker.pk))
    page.wait_for_selector("#id_pids_limit")
    assert page.locator("#id_protocol_pin").count() == 0
    assert page.input_value("#id_name") == "typed before the switch"
    assert page.evaluate("window.notReloaded === true")  # swapped by HTMX, not a new page
    assert page.inner_text("#config-kind") == "Settings for a Docker backend."
