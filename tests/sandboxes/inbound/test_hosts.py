"""A host per sandbox port (sandboxes/sessions/inbound_hosts.py): the INBOUND_BASE_URL forms
the console takes and refuses (the system check, the ASGI app at startup), the opaque labels
and how a Host header maps to one. No network: the router is driven in-process."""

from __future__ import annotations

import asyncio
import http.server
import threading
import uuid
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from sandboxes.inbound.forward import forward
from sandboxes.inbound.proxy import InboundRouter
from sandboxes.sessions.inbound_hosts import (
    LABEL_CHARS,
    SharedDomain,
    check_setting,
    host_label,
    host_route,
    read_label,
    setting_problem,
    shared_domain,
)

USABLE = ["", "https://*.sandboxes.example.net", "https://*.Sandboxes.Example.NET/", "http://*.localhost:8001"]
REFUSED = {
    "https://sandboxes.example.net": "names one host",
    "http://127.0.0.1:8000": "names one host",
    "ftp://*.sandboxes.example.net": "https://",
    "sandboxes.example.net": "https://",
    "https://*.sandboxes.example.net/inbound/": "without a path",
    "https://*.sandboxes.example.net?x=1": "without a path",
    "https://user:pw@*.sandboxes.example.net": "user name",
    "https://*.*.example.net": "not a domain name",
    "https://*.-bad.example.net": "not a domain name",
    "https://*.bad_name.example.net": "not a domain name",
    "https://*.": "not a domain name",
    "https://*.10.0.0.1": "not an address",
    "https://*.example.net:0": "1 to 65535",
    "https://*.example.net:70000": "not a URL",
    "https://*.example.net:x": "not a URL",
    "https://*." + ".".join(letter * 60 for letter in "abcd"): "characters",
}


@pytest.mark.parametrize("value", USABLE)
def test_the_usable_forms(value: str) -> None:
    assert setting_problem(value) == ""


@pytest.mark.parametrize(("value", "says"), REFUSED.items())
def test_unusable_forms_are_refused_with_the_reason(value: str, says: str) -> None:
    problem = setting_problem(value)
    assert says in problem, problem
    assert "INBOUND_BASE_URL" in problem


def test_console_cookies_or_hosts_under_the_domain_are_refused() -> None:
    value = "https://*.sandboxes.example.net"
    with override_settings(SESSION_COOKIE_DOMAIN=".example.net"):
        assert "SESSION_COOKIE_DOMAIN" in setting_problem(value)
    with override_settings(CSRF_COOKIE_DOMAIN="sandboxes.example.net"):
        assert "CSRF_COOKIE_DOMAIN" in setting_problem(value)
    with override_settings(SESSION_COOKIE_DOMAIN="console.example.net"):
        assert setting_problem(value) == ""
    with override_settings(ALLOWED_HOSTS=["console.sandboxes.example.net"]):
        assert "ALLOWED_HOSTS" in setting_problem(value)
    with override_settings(ALLOWED_HOSTS=["console.example.net", ".example.net", "*"]):
        assert setting_problem(value) == ""


def test_the_system_check_and_the_asgi_app_refuse_an_unusable_setting() -> None:
    with override_settings(INBOUND_BASE_URL="https://sandboxes.example.net"):
        errors = check_setting()
        assert [error.id for error in errors] == ["sandboxes.E001"]
        assert "wildcard" in errors[0].msg
        with pytest.raises(ImproperlyConfigured, match="names one host"):
            InboundRouter(_console_app)
    with override_settings(INBOUND_BASE_URL="https://*.sandboxes.example.net"):
        assert check_setting() == []
        InboundRouter(_console_app)


def test_labels_are_opaque_and_name_their_session_and_sandbox() -> None:
    session, other = uuid.uuid4(), uuid.uuid4()
    sandbox = "f" * 64
    label = host_label(session, sandbox)
    assert len(label) == LABEL_CHARS
    assert set(label) <= set("abcdefghijklmnopqrstuvwxyz234567")
    assert str(session).replace("-", "") not in label
    assert host_label(session, sandbox) == label  # stable: the same URL every time it is asked
    assert host_label(session, "e" * 64) != label  # a rebuilt session: another host
    assert host_label(other, sandbox)[:26] != label[:26]
    [read] = read_label(label)  # no fallback keys: one reading
    assert read.session_id == session
    assert read.matches(session, sandbox)
    assert not read.matches(session, "e" * 64)
    assert not read.matches(other, sandbox)
    assert not read.matches(session, "")
    # Another SECRET_KEY (the old one not kept as a fallback): another label, and the old one
    # names no session of ours.
    with override_settings(SECRET_KEY="another-secret-key-for-this-test-only-0123456789"):
        assert host_label(session, sandbox) != label
        assert not any(r.session_id == session and r.matches(session, sandbox) for r in read_label(label))
    for bad in ("", label[:-1], label + "a", label.upper(), label[:-9] + "1" + label[-8:], "-" * LABEL_CHARS):
        assert not any(r.session_id == session and r.matches(session, sandbox) for r in read_label(bad)), bad


def test_a_host_header_maps_to_a_label_only_on_the_domain_and_its_port() -> None:
    domain = SharedDomain("https", "sbx.example.net", "")
    label = "a" * LABEL_CHARS
    assert host_route(f"{label}-8000.sbx.example.net", domain) == _route(label, 8000)
    assert host_route(f"{label.upper()}-8000.SBX.example.net:443", domain) == _route(label, 8000)
    for off_domain in ("console.example.net", "sbx.example.net", "evilsbx.example.net", "", "[::1]:8000"):
        assert host_route(off_domain, domain) is None, off_domain
    for bad in (
        f"{label}-8000.sbx.example.net:8443",
        f"{label}-0.sbx.example.net",
        f"{label}-08000.sbx.example.net",
        f"{label}-65536.sbx.example.net",
        f"{label}.sbx.example.net",
        f"{label[:-1]}-8000.sbx.example.net",
        f"x.{label}-8000.sbx.example.net",
        ".sbx.example.net",
    ):
        route = host_route(bad, domain)
        assert route is not None, bad
        assert not route.valid, bad
    local = SharedDomain("http", "localhost", ":8001")
    assert host_route(f"{label}-1.localhost:8001", local) == _route(label, 1)
    assert not host_route(f"{label}-1.localhost", local).valid  # type: ignore[union-attr]
    assert not host_route(f"{label}-1.localhost:8002", local).valid  # type: ignore[union-attr]
    with override_settings(INBOUND_BASE_URL="https://*.Sbx.Example.net:8443"):
        assert shared_domain() == SharedDomain("https", "sbx.example.net", ":8443")
    with override_settings(INBOUND_BASE_URL="https://*.sbx.example.net:443"):
        assert shared_domain() == SharedDomain("https", "sbx.example.net", "")
    with override_settings(INBOUND_BASE_URL=""):
        assert shared_domain() is None
        assert host_route(f"{label}-8000.sbx.example.net") is None


def _route(label: str, port: int) -> Any:
    from sandboxes.sessions.inbound_hosts import HostRoute

    return HostRoute(label, port, valid=True)


async def _console_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"console"})


def _call(router: InboundRouter, host: str, path: str) -> tuple[int, bytes]:
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": [(b"host", host.encode())], "query_string": b""}
    asyncio.run(router(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


@override_settings(INBOUND_BASE_URL="https://*.sbx.example.net")
def test_the_router_answers_malformed_names_on_the_domain_404_and_leaves_the_rest_to_the_console() -> None:
    router = InboundRouter(_console_app)
    for host in (f"{'a' * 33}-8000.sbx.example.net", "x-8000.sbx.example.net", "www.sbx.example.net"):
        for path in ("/", "/login/", "/inbound/abc/8000/"):
            assert _call(router, host, path) == (404, b"No such inbound URL, or no valid traffic token for it.\n")
    assert _call(router, "console.example.net", "/login/") == (299, b"console")
    assert _call(router, "sbx.example.net", "/login/") == (299, b"console")


def test_daphne_refuses_to_start_on_a_single_inbound_host() -> None:
    """The console as deployed (Daphne on console.asgi) stops at once with the reason, before
    it listens (port 0: nothing of ours is reachable even if it did)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "INBOUND_BASE_URL": "https://sandboxes.example.net"}
    daphne = str(Path(sys.executable).parent / "daphne")
    done = subprocess.run(
        [daphne, "-b", "127.0.0.1", "-p", "0", "console.asgi:application"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured: INBOUND_BASE_URL='https://sandboxes.example.net' names one host" in done.stderr


# --- A sandbox's response headers on the console's own origin ----------------------------


class _Hostile(http.server.BaseHTTPRequestHandler):
    """What a tenant's sandbox may answer: headers that act on the whole origin."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Clear-Site-Data", '"cookies", "storage", "cache"')
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile_upstream() -> Iterator[tuple[str, int]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield "127.0.0.1", server.server_address[1]
    server.shutdown()
    server.server_close()


def _proxied_headers(address: tuple[str, int], *, sandboxed: bool) -> dict[bytes, bytes]:
    prefix = "/inbound/sbx1/8000/"
    scope = {
        "type": "http",
        "method": "GET",
        "path": prefix + "x",
        "raw_path": (prefix + "x").encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000")],
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
    }
    sent: list[dict[str, Any]] = []

    async def run() -> None:
        messages = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop()
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(dict(message))

        headers: list[tuple[bytes, bytes]] = [(b"host", b"127.0.0.1:8000")]
        await forward(scope, receive, send, headers, address, prefix, "/x", sandboxed=sandboxed)

    asyncio.run(run())
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 200
    return {name.lower(): value for name, value in start["headers"]}


def test_a_sandbox_cannot_clear_the_consoles_cookies_on_its_origin(hostile_upstream: tuple[str, int]) -> None:
    """On the console's own origin, `Clear-Site-Data: "cookies"` from a sandbox would log the
    visitor out of the console (CSP sandbox does not stop it: it acts on the URL's origin)."""
    headers = _proxied_headers(hostile_upstream, sandboxed=True)
    assert b"content-security-policy" in headers
    assert b"clear-site-data" not in headers
    # On a sandbox port's host of its own too: "cookies" acts on the whole registrable domain,
    # so it would wipe every other sandbox host's link cookie (the inbound review's finding).
    assert b"clear-site-data" not in _proxied_headers(hostile_upstream, sandboxed=False)
