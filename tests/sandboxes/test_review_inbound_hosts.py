"""Review of the per-port inbound hosts (sandboxes/sessions/inbound_hosts.py and the proxy):
what a forged Host header, a sandbox's own answer headers and the settings check let through.
In-process (the router and the forwarding code on their own), against a server of the test's
own on 127.0.0.1; no name is ever looked up."""

from __future__ import annotations

import asyncio
import http.server
import threading
import uuid
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
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
)
from sandboxes.inbound.proxy import InboundRouter

NOT_FOUND = (404, b"No such inbound URL, or no valid traffic token for it.\n")


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
