"""Config of each kind + test connection, in Chromium against the live console (Daphne): a
platform admin registers an E2B and a Cube backend through the backend form (its fields
swap with the kind), a space admin makes a config on each through the config form (the
kind's fields) and follows its Test connection job to Succeeded; a backend with a wrong API
key fails its test with a clear message, never a 500. The E2B and Cube servers are the
protocol-faithful fakes (tests/fakes/) on 127.0.0.1, reached by the live server.

Screenshots (1280x800 and 390x844, light and dark) go to var/test-artifacts/screenshots/.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from console.models import AdminJob
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import make_backend
from tests.fakes.fixtures import FakeHandle
from tests.personas import World
from tests.support.browser import log_in, shoot_all, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.docker, pytest.mark.e2b, pytest.mark.cube,
              pytest.mark.slow]  # fmt: skip

# The range of a date cell's text: one client rect per line it takes.
LINES_OF = """(selector) => {
  const cell = document.querySelector(selector);
  const range = document.createRange();
  range.selectNodeContents(cell);
  // Distinct lines: an element inside (the `|when` filter's <time>) has a box of its own.
  const tops = Array.from(range.getClientRects()).filter((r) => r.width > 0).map((r) => Math.round(r.top));
  return new Set(tops).size;
}"""


def register_backend(page: Any, base: str, fake: FakeHandle, *, name: str, kind: str, space_id: str) -> None:
    """As a platform admin: the backend form, kind first (HTMX swaps in its fields)."""
    page.goto(f"{base}{reverse('sandboxes:backend_create')}")
    assert page.locator("#id_name").count() == 0  # step 1: the kind alone
    page.select_option("#id_kind", kind)
    page.wait_for_selector("#id_domain")
    assert page.locator("#id_tls_cert").count() == 0  # Docker's TLS fields are not a remote kind's
    assert page.locator("#id_max_pids").count() == 0
    page.fill("#id_name", name)
    page.fill("#id_endpoint", fake.api_url)
    page.fill("#id_domain", fake.domain)
    page.fill("#id_sandbox_url", fake.proxy_url)
    page.fill("#id_api_key", fake.api_key)
    page.check("#id_allow_private_endpoints")
    page.check(f"input[name=spaces][value='{space_id}']")
    page.click("#backend-form button[type=submit]:has-text('Save')")
    page.wait_for_url(re.compile(r".*/platform/backends/$"))
    assert f"Backend {name} registered." in page.inner_text(".messages")


def create_config(page: Any, base: str, space_id: str, backend: PlatformBackend, name: str) -> SandboxConfig:
    """As a space admin: the config form, backend first (its kind's fields), then saved."""
    page.goto(f"{base}{reverse('sandboxes:config_create', args=[space_id])}")
    page.select_option("#id_backend", str(backend.pk))
    page.wait_for_selector(f"#config-kind[data-kind-label='{page_label(backend)}']")
    assert page.locator("#id_protocol_pin").count() == 1  # a versioned protocol: E2B and Cube
    assert page.locator("#id_pids_limit").count() == 0  # Docker's process limit is not theirs
    page.fill("#id_name", name)
    template = page.locator("#id_default_template")
    if template.evaluate("el => el.tagName") == "SELECT":
        template.select_option("base")
    else:
        template.fill("base")
    page.click("#config-form button[type=submit]:has-text('Save')")
    page.wait_for_url(re.compile(r".*/sandboxes/[0-9a-f-]{36}/$"))
    config: SandboxConfig = SandboxConfig.objects.get(backend=backend, name=name)
    assert config.default_template == "base"
    return config


def page_label(backend: PlatformBackend) -> str:
    from sandboxes.backends import describe

    return describe(backend.kind).label


def run_test_connection(page: Any, base: str, config: SandboxConfig) -> str:
    page.goto(f"{base}{config.get_absolute_url()}")
    page.click("form[action$='/test/'] button")
    page.wait_for_url(re.compile(r".*/jobs/[0-9a-f-]{36}/$"))
    return wait_for_job(page, timeout_s=120)


def test_a_config_of_each_kind_passes_its_connection_test_and_a_wrong_key_fails_clearly(
    world: World, fake_e2b: FakeHandle, fake_cube: FakeHandle, daphne_url: str, page: Any
) -> None:
    base, space = daphne_url, world.space_a
    page.set_viewport_size({"width": 1280, "height": 800})

    # The platform admin: the kind's fields swap in place, what was typed stays.
    log_in(page, base, "root")
    page.goto(f"{base}{reverse('sandboxes:backend_create')}")
    shoot_all(page, "backend-form-step1")
    page.evaluate("window.notReloaded = true")
    page.select_option("#id_kind", "cube")
    page.wait_for_selector("#id_workspace_host_root")
    page.fill("#id_name", "typed before the switch")
    page.select_option("#id_kind", "docker")
    page.wait_for_selector("#id_tls_cert")
    assert page.locator("#id_domain").count() == 0
    assert page.locator("#id_api_key").count() == 0
    assert page.input_value("#id_name") == "typed before the switch"
    assert page.evaluate("window.notReloaded === true")  # swapped by HTMX, not a new page
    assert page.inner_text("#backend-kind") == "Settings for a Docker backend."
    shoot_all(page, "backend-form-docker", reload=False)
    page.select_option("#id_kind", "e2b")
    page.wait_for_selector("#id_domain")
    assert page.locator("#id_workspace_host_root").count() == 0  # Cube's only
    shoot_all(page, "backend-form-e2b", reload=False)
    assert not PlatformBackend.objects.exists()  # nothing saved by the swaps
    # Without JavaScript: the same form in two steps, by its buttons.
    nojs_context = page.context.browser.new_context(java_script_enabled=False)
    try:
        nojs = nojs_context.new_page()
        log_in(nojs, base, "root")
        nojs.goto(f"{base}{reverse('sandboxes:backend_create')}")
        nojs.select_option("#id_kind", "cube")
        nojs.click("button[name=choose_kind]:has-text('Next')")
        nojs.wait_for_selector("#id_workspace_host_root")
        assert nojs.locator("#id_tls_cert").count() == 0
        nojs.fill("#id_name", "typed without js")
        nojs.select_option("#id_kind", "docker")
        nojs.click("button[name=choose_kind]:has-text('Show the chosen kind')")
        nojs.wait_for_selector("#id_tls_cert")
        assert nojs.locator("#id_workspace_host_root").count() == 0
        assert nojs.input_value("#id_name") == "typed without js"
    finally:
        nojs_context.close()
    assert not PlatformBackend.objects.exists()

    register_backend(page, base, fake_e2b, name="Fake E2B", kind="e2b", space_id=str(space.id))
    register_backend(page, base, fake_cube, name="Fake Cube", kind="cube", space_id=str(space.id))
    e2b = PlatformBackend.objects.get(name="Fake E2B")
    cube = PlatformBackend.objects.get(name="Fake Cube")
    assert (e2b.kind, e2b.domain, cube.kind) == ("e2b", fake_e2b.domain, "cube")
    assert list(e2b.spaces.all()) == [space]
    shoot_all(page, "backend-list")
    # A third one with a key the server refuses (registered directly: the form is shown above).
    wrong = make_backend(
        space,
        name="Fake E2B, wrong key",
        kind="e2b",
        endpoint=fake_e2b.api_url,
        domain=fake_e2b.domain,
        sandbox_url=fake_e2b.proxy_url,
        allow_private_endpoints=True,
        api_key="e2b_not_the_servers_key",
    )

    # The space admin: a config on each, and its connection test followed to the end.
    page.context.clear_cookies()
    log_in(page, base, "alice")
    for backend, name in ((e2b, "on-e2b"), (cube, "on-cube")):
        config = create_config(page, base, str(space.id), backend, name)
        assert "processes" not in page.inner_text("#config-resources")  # no process limit on this kind
        if backend == e2b:
            shoot_all(page, "config-e2b")
        status = run_test_connection(page, base, config)
        assert status == "Succeeded", page.inner_text("#job-status")
        shoot_all(page, f"test-connection-{backend.kind}")

    # The wrong key: the job fails with the server's refusal in words, the page is no 500.
    config = create_config(page, base, str(space.id), wrong, "wrong-key")
    status = run_test_connection(page, base, config)
    assert status == "Failed", page.inner_text("#job-status")
    job = AdminJob.objects.filter(params__config_id=str(config.id)).latest("created")
    card = page.inner_text("#job-status")
    assert job.error
    assert job.error in card, (job.error, card)
    assert re.search(r"(?i)api key|unauthori[sz]ed|401|credential", job.error), job.error
    assert "Traceback" not in card
    assert "e2b_not_the_servers_key" not in page.content()  # the refused key is never shown
    page.set_viewport_size({"width": 390, "height": 844})
    clipped = "(() => { const e = document.querySelector('#job-status .message-error pre');"
    assert page.evaluate(clipped + " return e.scrollWidth - e.clientWidth; })()") <= 0  # all of it on a phone
    page.set_viewport_size({"width": 1280, "height": 800})
    shoot_all(page, "test-connection-wrong-key")
    response = page.goto(f"{base}{config.get_absolute_url()}")
    assert response is not None
    assert response.status == 200
    assert "Failed" in page.inner_text("body")  # the config's recent tests name the failure

    # The jobs list on a phone: its date cells stay on one line.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}{reverse('console:job_list')}")
    page.wait_for_selector("#job-results td.when, table td.when")
    assert page.evaluate(LINES_OF, "td.when") == 1
    # Without the rule the same cell wraps at this width (the check can fail).
    # Through the CSSOM: the page's policy refuses an added <style> element (add_style_tag).
    page.evaluate(
        "() => { for (const td of document.querySelectorAll('td.when, td.when .when'))"
        " td.style.setProperty('white-space', 'normal', 'important'); }"
    )
    assert page.evaluate(LINES_OF, "td.when") > 1
