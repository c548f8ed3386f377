"""The Content-Security-Policy of the console's pages (console/security.py): a fresh nonce per
request, named by every script tag the page has; no inline style attributes or event handlers
in any template (the policy refuses them). The browser side is tests/e2e/test_csp_e2e.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.http import HttpResponse
from django.test import RequestFactory

from console.security import CSP_HEADER, ContentSecurityPolicyMiddleware, content_security_policy
from tests.factories import make_config
from tests.personas import World

ROOT = Path(settings.BASE_DIR)
NONCE = re.compile(r"'nonce-([A-Za-z0-9_\-]+)'")


def template_files() -> list[Path]:
    """Every template of ours: the shared folder, the rooms' and the apps' own."""
    folders = [ROOT / "templates", *ROOT.glob("*/templates"), *ROOT.glob("sandboxes/*/templates")]
    return sorted(path for folder in folders if "tests" not in folder.parts for path in folder.rglob("*.html"))


@pytest.mark.parametrize("template", template_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_template_has_what_the_policy_refuses(template: Path) -> None:
    text = template.read_text()
    for tag in re.findall(r"<script\b[^>]*>", text):
        assert 'nonce="{{ csp_nonce }}"' in tag, tag
    assert not re.search(r"\sstyle\s*=", text), "an inline style attribute"
    assert not re.search(r"<style\b", text), "a <style> element"
    assert not re.search(r"\son(?:click|load|error|submit|change|input|focus|blur|key[a-z]+|mouse[a-z]+)\s*=", text)
    assert "javascript:" not in text
    assert "hx-on" not in text  # HTMX would eval it


@pytest.mark.django_db
def test_every_main_page_carries_the_policy_and_its_scripts_the_nonce(world: World) -> None:
    from sandboxes.models import Session

    config = make_config(world.space_a, name="pages", is_default=True)
    session = Session.objects.create(space=world.space_a, key="csp-pages", config=config)
    client = world.client_for("root")
    pages = [
        "/",
        "/spaces/",
        f"/spaces/{world.space_a.id}/",
        f"/spaces/{world.space_a.id}/network/",
        f"/spaces/{world.space_a.id}/tokens/",
        f"/spaces/{world.space_a.id}/limits/",
        session.get_absolute_url(),
        f"/platform/users/{world.bob.pk}/",
        f"/platform/users/{world.bob.pk}/deactivate/",
        "/sandboxes/",
        config.get_absolute_url(),
        "/skills/",
        "/sessions/",
        "/jobs/",
        "/audit/",
        "/platform/users/",
        "/platform/activity/",
        "/platform/backends/",
        "/login/",
    ]
    nonces = set()
    for path in pages:
        response = client.get(path, follow=True)
        assert response.status_code == 200, path
        policy = response[CSP_HEADER]
        nonce = NONCE.search(policy)
        assert nonce, policy
        nonces.add(nonce[1])
        html = response.content.decode()
        scripts = re.findall(r"<script\b[^>]*>", html)
        assert scripts, path  # htmx and console.js at least
        for tag in scripts:
            assert f'nonce="{nonce[1]}"' in tag, (path, tag)
        assert not re.search(r"<[a-z][^>]*\sstyle\s*=", html), path
        assert not re.search(r"<style\b", html), path
        for directive in ("object-src 'none'", "base-uri 'none'", "frame-ancestors 'none'", "'strict-dynamic'"):
            assert directive in policy
        assert "unsafe-inline" not in policy.split("style-src-elem")[0]
        assert "unsafe-eval" not in policy
    assert len(nonces) == len(pages)  # fresh for each request


@pytest.mark.django_db
def test_the_terminal_page_alone_lets_xterm_write_its_styles(world: World) -> None:
    from sandboxes.models import Session

    config = make_config(world.space_a, name="term", is_default=True)
    session = Session.objects.create(space=world.space_a, key="csp-term", config=config)
    terminal = world.client_for("bob").get(f"/sessions/{session.id}/terminal/")
    assert terminal.status_code == 200
    policy = terminal[CSP_HEADER]
    assert "style-src-attr 'unsafe-inline'" in policy
    assert "script-src 'nonce-" in policy
    assert "unsafe" not in policy.split("script-src")[1].split(";")[0]
    detail = world.client_for("bob").get(session.get_absolute_url())
    assert "style-src-attr 'none'" in detail[CSP_HEADER]


@pytest.mark.django_db
def test_djangos_admin_runs_its_own_script_files_and_nothing_inline(world: World) -> None:
    from django.urls import reverse

    from console.security import ADMIN_PREFIX

    assert reverse("admin:index") == ADMIN_PREFIX
    response = world.client_for("root").get(reverse("admin:index"))
    assert response.status_code == 200
    policy = dict(d.split(" ", 1) for d in response[CSP_HEADER].split("; "))
    assert policy["script-src"] == "'self'"
    assert policy["object-src"] == "'none'"


@pytest.mark.django_db
def test_error_pages_and_anonymous_pages_carry_it_too(world: World) -> None:
    from django.test import Client

    for response in (Client().get("/login/"), world.client_for("alice").get("/no/such/page/")):
        assert NONCE.search(response[CSP_HEADER])


def test_a_response_with_a_policy_of_its_own_keeps_it() -> None:
    def view(request: object) -> HttpResponse:
        response = HttpResponse("proxied")
        response[CSP_HEADER] = "sandbox"
        return response

    response = ContentSecurityPolicyMiddleware(view)(RequestFactory().get("/"))
    assert response[CSP_HEADER] == "sandbox"


def test_the_policy_allows_no_inline_script_or_style_attribute() -> None:
    policy = content_security_policy("abc")
    directives = dict(d.split(" ", 1) for d in policy.split("; "))
    assert directives["script-src"] == "'nonce-abc' 'strict-dynamic'"
    assert directives["style-src-attr"] == "'none'"
    assert "unsafe-inline" not in directives["style-src-elem"]
    relaxed = dict(d.split(" ", 1) for d in content_security_policy("abc", inline_styles=True).split("; "))
    assert relaxed["script-src"] == directives["script-src"]  # scripts as strict on the terminal page
    assert relaxed["object-src"] == "'none'"


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost:46425", "ws://localhost:46425 wss://localhost:46425"),
        ("127.0.0.1:8000", "ws://127.0.0.1:8000 wss://127.0.0.1:8000"),
        ("console.test", "ws://console.test wss://console.test"),
        ("[::1]:8443", "ws://[::1]:8443 wss://[::1]:8443"),
    ],
)
def test_connect_src_names_the_consoles_own_websocket_origin_and_nothing_else(
    host: str, allowed: str, settings: Any
) -> None:
    """The terminal's websocket goes to the host:port the page was asked for (its ws_url is
    built from the same Host): connect-src allows that origin, ws: and wss:, and no other."""
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", "console.test", "[::1]"]
    response = ContentSecurityPolicyMiddleware(lambda request: HttpResponse("page"))(
        RequestFactory().get("/", HTTP_HOST=host)
    )
    directives = dict(d.split(" ", 1) for d in response[CSP_HEADER].split("; "))
    assert directives["connect-src"] == f"'self' {allowed}"
    assert directives["default-src"] == "'self'"


def test_a_host_django_refuses_gets_no_websocket_origin(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["console.test"]
    response = ContentSecurityPolicyMiddleware(lambda request: HttpResponse("page"))(
        RequestFactory().get("/", HTTP_HOST="elsewhere.test:9000")
    )
    directives = dict(d.split(" ", 1) for d in response[CSP_HEADER].split("; "))
    assert directives["connect-src"] == "'self'"
