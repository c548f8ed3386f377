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

from sandboxes.inbound.common import request_headers
from sandboxes.inbound.forward import forward
from sandboxes.inbound.hosts import (
    LABEL_CHARS,
    HostRoute,
    SharedDomain,
    check_setting,
    host_label,
    host_route,
    read_label,
    setting_problem,
    shared_domain,
)
from sandboxes.inbound.proxy import InboundRouter

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
    from sandboxes.inbound.hosts import HostRoute

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
    # so it would wipe every other sandbox host's link cookie.
    assert b"clear-site-data" not in _proxied_headers(hostile_upstream, sandboxed=False)


# What a forged Host header, a sandbox's own answer headers and the settings check let through:
# the router and the forwarding code on their own, against a server of the test's own on
# 127.0.0.1; no name is ever looked up.

NOT_FOUND = (404, b"No such inbound URL, or no valid traffic token for it.\n")


# --- A trailing dot: the same name in DNS, another Host for the router ---------------------


def test_a_trailing_dot_host_maps_to_the_same_label() -> None:
    """`<label>-8000.sbx.example.net.` is the same DNS name (the wildcard record and the
    wildcard certificate cover it); it must route as the name without the dot does."""
    domain = SharedDomain("https", "sbx.example.net", "")
    label = "a" * LABEL_CHARS
    want = HostRoute(label, 8000, valid=True)
    assert host_route(f"{label}-8000.sbx.example.net.", domain) == want
    assert host_route(f"{label}-8000.sbx.example.net.:443", domain) == want


@pytest.mark.parametrize("allowed", [["*"], [".sbx.example.net"]])
def test_a_trailing_dot_name_on_the_domain_never_reaches_the_console(allowed: list[str]) -> None:
    """ALLOWED_HOSTS of "*" or ".sbx.example.net" pass sandboxes.E001, and Django takes
    `x.sbx.example.net.` for `x.sbx.example.net` (it drops the dot): before the fix the router
    handed `www.sbx.example.net./admin/` to the console's own views, on a sandbox-domain host."""
    with override_settings(INBOUND_BASE_URL="https://*.sbx.example.net", ALLOWED_HOSTS=allowed):
        assert check_setting() == []
        router = InboundRouter(_console_app)
        for host in ("www.sbx.example.net.", "x-8000.sbx.example.net.", "www.sbx.example.net.:443"):
            for path in ("/admin/", "/login/", "/inbound/abc/8000/"):
                assert _call(router, host, path) == NOT_FOUND, (host, path)


# --- The console on the inbound domain's apex or a parent of it ---------------------------


@pytest.mark.parametrize("console_host", ["sandboxes.example.net", "example.net", "Example.NET"])
def test_a_console_on_the_apex_or_a_parent_of_the_inbound_domain_is_refused(console_host: str) -> None:
    """A console served at `sandboxes.example.net` (or `example.net`) with sandboxes at
    `*.sandboxes.example.net` is the parent domain of every sandbox host: a sandbox's page sets
    `sessionid=…; Domain=sandboxes.example.net` (or `csrftoken`) from its own script and the
    browser sends it to the console (a tossed session: the visitor is logged into the
    attacker's account), and every console cookie with SameSite=Lax rides along on the
    sandbox page's requests to it (same site). E001 let that through."""
    with override_settings(ALLOWED_HOSTS=[console_host]):
        problem = setting_problem("https://*.sandboxes.example.net")
        assert "ALLOWED_HOSTS" in problem, problem


def test_the_local_single_label_domain_stays_usable() -> None:
    """`localhost` with `http://*.localhost:8001` (the documented local form and the default
    ALLOWED_HOSTS): a single-label name is a top-level domain to browsers, no page can set a
    cookie for it."""
    with override_settings(ALLOWED_HOSTS=["127.0.0.1", "localhost"]):
        assert setting_problem("http://*.localhost:8001") == ""
    with override_settings(ALLOWED_HOSTS=["console.example.net", ".example.net", "*"]):
        assert setting_problem("https://*.sandboxes.example.net") == ""


# --- Headers of a sandbox's answer that act on the whole site ---------------------------


class _ClearsSite(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Clear-Site-Data", '"cookies", "storage", "cache"')
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def clearing_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ClearsSite)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_sandbox_host_cannot_clear_the_cookies_of_its_whole_site(clearing_server: int) -> None:
    """`Clear-Site-Data: "cookies"` removes the cookies of the response's *registrable
    domain*, subdomains included (the spec; Chromium does so), not of its origin: one
    tenant's page on `a-8000.sandboxes.example.net` would drop the visitor's link cookies of
    every other sandbox host, and the console's session when the console is same-site. The
    proxy drops it on the console's own origin only; on a host of its own it passed."""
    sent: list[MutableMapping[str, Any]] = []
    asked: list[int] = []

    async def receive() -> dict[str, Any]:
        if asked:  # the client stays connected until the answer is out
            await asyncio.sleep(30)
            return {"type": "http.disconnect"}
        asked.append(1)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [(b"host", b"a-8000.sbx.example.net")],
        "client": ("127.0.0.1", 1),
    }

    async def run() -> None:
        await forward(
            scope, receive, send, request_headers(scope), ("127.0.0.1", clearing_server), "/", "/", sandboxed=False
        )

    asyncio.run(run())
    assert sent[0]["status"] == 200
    names = [name for name, _ in sent[0]["headers"]]
    assert b"clear-site-data" not in names, sent[0]["headers"]


# --- SECRET_KEY rotation -------------------------------------------------------------------


def test_issued_hosts_survive_a_secret_key_rotation_with_the_old_key_in_the_fallbacks() -> None:
    """Django rotates SECRET_KEY through SECRET_KEY_FALLBACKS, and the signed links do honour
    it (django.core.signing); the labels, from salted_hmac of SECRET_KEY alone, do not: every
    issued host (bookmarks, open tabs, URLs handed to agents) answers 404 the moment the key
    is rotated, while the same links on the path form still pass."""
    session, sandbox = uuid.uuid4(), "f" * 64
    old = "old-secret-key-for-this-test-only-0123456789abcdef"
    with override_settings(SECRET_KEY=old):
        label = host_label(session, sandbox)
    with override_settings(SECRET_KEY="new-secret-key-for-this-test-only-0123456789abcdef", SECRET_KEY_FALLBACKS=[old]):
        assert any(r.session_id == session and r.matches(session, sandbox) for r in read_label(label))
        # made with the new key from now on, and the old key's label still read first by none
        assert host_label(session, sandbox) != label
    with override_settings(SECRET_KEY="new-secret-key-for-this-test-only-0123456789abcdef", SECRET_KEY_FALLBACKS=[]):
        assert not any(r.session_id == session and r.matches(session, sandbox) for r in read_label(label))


def test_a_websocket_over_tls_counts_as_secure() -> None:
    """Daphne names a TLS websocket's scheme "wss" (console/security.py takes it so): the
    inbound route compared the Origin with http://<host> and dropped the visitor's link
    cookie, so a page's own websocket on its https host failed without the token header."""
    from sandboxes.inbound.common import is_secure

    with override_settings(SECURE_PROXY_SSL_HEADER=None):
        assert is_secure({"type": "websocket", "scheme": "wss"}, [])
        assert not is_secure({"type": "websocket", "scheme": "ws"}, [])
