"""Inbound traffic end to end: a real console (Daphne, as `make start` runs it in the embedded
mode) proxying a sandbox port's URL to a server inside a real Docker sandbox: the host of its
own each port is issued (`<label>-<port>.localhost:<console port>`, the wildcard
INBOUND_BASE_URL `http://*.localhost:<port>`), and `/inbound/<sandbox>/<port>/` on the
console's own origin (127.0.0.1).

Three spaces: A (inbound on, outbound off), B (inbound on: its session's token must not open
A's URLs) and C (inbound off). Each sandbox runs servers of the test's own (`python3 -m
http.server`, and a small echo server for bodies and headers); every request goes to
127.0.0.1, a sandbox host's name only in the Host header (no name is ever looked up).
Nothing leaves the machine: A's and C's sandboxes have no outbound at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.console_process import ADMIN_PASSWORD, ADMIN_USER, ApiClient, UiClient
from tests.support.inbound_world import (
    _SET_INBOUND,
    LABEL,
    MAX_BODY,
    Reply,
    World,
    browser_args,
    host_of,
    made_world,
    wait_for,
    ws_exchange,
)

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def world(docker_base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with made_world(docker_base_image, tmp_path_factory) as made:
        yield made


def _get_with_token(world: World, letter: str, path: str = "hello.txt", port: int = 8000) -> Reply:
    inbound = world.inbound(letter, port)
    return world.request(inbound["url"] + path, headers={inbound["token_header"]: inbound["traffic_token"]})


def test_the_api_issues_the_url_the_token_and_its_header(world: World) -> None:
    inbound = world.inbound("a")
    sandbox_id = world.sandboxes["a"]
    # A host of its own per sandbox port, with an opaque label: no sandbox id in it.
    assert re.fullmatch(rf"http://({LABEL})-8000\.localhost:{world.port}/", inbound["url"]), inbound["url"]
    assert sandbox_id not in inbound["url"]
    label = inbound["url"].split("//", 1)[1].split("-", 1)[0]
    assert world.inbound("a", 9000)["url"] == f"http://{label}-9000.localhost:{world.port}/"
    assert label not in world.inbound("b")["url"]
    assert inbound["token_header"] == "X-Traffic-Token"
    assert inbound["traffic_token"]
    assert inbound["signed_links"]
    assert inbound["inbound_on"]
    bad = world.api("a").call("GET", "web", "inbound?port=70000")
    assert bad.status == 400
    assert bad.body["error"]["field"] == "port"
    # Another space's API token does not learn A's session.
    outsider = ApiClient(f"http://127.0.0.1:{world.port}", world.spaces["a"]["space_id"], world.spaces["b"]["token"])
    assert outsider.call("GET", "web", "inbound?port=8000").status == 404


def test_the_token_header_reaches_the_sandbox_port(world: World) -> None:
    reply = wait_for(lambda: (r := _get_with_token(world, "a")).status == 200 and r, "http.server in A")
    assert reply.body == b"hello-inbound-a\n"
    assert reply.header("Content-Security-Policy") is None  # an origin of its own
    # The same port at the console's own origin: under CSP sandbox.
    token = {"X-Traffic-Token": world.inbound("a")["traffic_token"]}
    console = world.request(f"/inbound/{world.sandboxes['a']}/8000/hello.txt", headers=token)
    assert console.body == b"hello-inbound-a\n"
    assert (console.header("Content-Security-Policy") or "").startswith("sandbox allow-scripts")
    # Without the trailing slash: redirected to the app's root.
    bare = world.request(f"/inbound/{world.sandboxes['a']}/8000")
    assert bare.status == 308
    assert bare.header("Location") == f"/inbound/{world.sandboxes['a']}/8000/"


def test_without_the_right_token_the_url_does_not_exist(world: World) -> None:
    a, b = world.inbound("a"), world.inbound("b")
    path = a["url"] + "hello.txt"
    console_path = f"/inbound/{world.sandboxes['a']}/8000/hello.txt"
    refusals = {
        "no token": world.request(path),
        "wrong token": world.request(path, headers={"X-Traffic-Token": "x" * 43}),
        "B's token": world.request(path, headers={"X-Traffic-Token": b["traffic_token"]}),
        "A's token, truncated": world.request(path, headers={"X-Traffic-Token": a["traffic_token"][:-1]}),
        "unknown sandbox": world.request(
            f"/inbound/{'0' * 64}/8000/hello.txt", headers={"X-Traffic-Token": a["traffic_token"]}
        ),
        "A's token on B's URL": world.request(b["url"], headers={"X-Traffic-Token": a["traffic_token"]}),
        "bad port": world.request(f"/inbound/{world.sandboxes['a']}/99999/", headers={"X-Traffic-Token": "x"}),
        "no token, console origin": world.request(console_path),
        "B's token, console origin": world.request(console_path, headers={"X-Traffic-Token": b["traffic_token"]}),
    }
    for what, reply in refusals.items():
        assert reply.status == 404, (what, reply)
        assert b"Inbound traffic is off" not in reply.body, what
        assert b"hello-inbound" not in reply.body, what
    # All the same answer: nothing tells an existing sandbox from a missing one.
    assert len({reply.body for reply in refusals.values()}) == 1
    # A console login is no inbound credential either (and its cookie would never be forwarded).
    ui = UiClient(f"http://127.0.0.1:{world.port}")
    ui.login(ADMIN_USER, ADMIN_PASSWORD)
    cookie = "; ".join(f"{c.name}={c.value}" for c in ui.cookies)
    assert world.request(path, headers={"Cookie": cookie}).status == 404


def test_a_signed_link_sets_a_cookie_for_that_url_only(world: World) -> None:
    made = world.api("a").call("POST", "web", "inbound/links", {"port": 8000, "ttl_s": 120})
    assert made.status == 201, made.body
    assert made.body["expires_at"] - time.time() == pytest.approx(120, abs=10)
    url = made.body["url"]
    host = host_of(url)
    assert url.startswith(world.inbound("a")["url"] + "?_console_link=")
    followed = world.request(url)
    assert followed.status == 303
    assert followed.header("Location") == "/"
    cookie = followed.header("Set-Cookie") or ""
    assert "Path=/;" in cookie + ";"
    assert "Domain" not in cookie  # its own host only
    assert "HttpOnly" in cookie
    assert "Max-Age=" in cookie
    value = cookie.split(";", 1)[0]
    page = world.request(f"http://{host}/hello.txt", headers={"Cookie": value})
    assert page.status == 200
    assert page.body == b"hello-inbound-a\n"
    # The cookie is bound to its sandbox and port (whichever host it is sent to).
    assert world.request(world.inbound("b")["url"], headers={"Cookie": value}).status == 404
    assert world.request(world.inbound("a", 9000)["url"], headers={"Cookie": value}).status == 404
    assert world.request(f"/inbound/{world.sandboxes['b']}/8000/", headers={"Cookie": value}).status == 404
    # A tampered link is no link.
    tampered = url[:-3] + "abc"
    assert world.request(tampered).status == 404
    audit = world.console.query("SELECT count(*) FROM console_auditevent WHERE action = 'session.inbound_link'")
    assert audit[0][0] >= 1


def test_an_expired_link_or_cookie_is_refused(world: World) -> None:
    a = world.inbound("a")
    script = (
        "from sandboxes.inbound.links import sign_link; import time; "
        f"print('LINK', sign_link({world.sandboxes['a']!r}, 8000, {a['traffic_token']!r}, int(time.time()) - 5))"
    )
    expired = world.console.manage("shell", "-c", script).split("LINK ", 1)[1].strip()
    prefix = a["url"]
    by_link = world.request(prefix + "?_console_link=" + urllib.parse.quote(expired, safe=""))
    by_cookie = world.request(prefix + "hello.txt", headers={"Cookie": f"console_inbound={expired}"})
    for reply in (by_link, by_cookie):
        assert reply.status == 403, reply
        assert b"expired" in reply.body
    # Too long a link is refused when asked for.
    refused = world.api("a").call("POST", "web", "inbound/links", {"port": 8000, "ttl_s": 10**9})
    assert refused.status == 400
    assert refused.body["error"]["field"] == "ttl"


def test_inbound_off_is_refused_with_a_clear_error(world: World) -> None:
    reply = _get_with_token(world, "c")
    assert reply.status == 403
    assert b"Inbound traffic is off for space Inbound c" in reply.body
    no_link = world.api("c").call("POST", "web", "inbound/links", {"port": 8000})
    assert no_link.status == 400
    assert "off" in no_link.body["error"]["message"]
    # Switched off for A while its session runs: refused within seconds, and back on again.
    space_a = world.spaces["a"]["space_id"]
    world.console.manage("shell", "-c", _SET_INBOUND.format(space_id=space_a, on=False))
    try:
        wait_for(lambda: _get_with_token(world, "a").status == 403, "inbound off for A")
    finally:
        world.console.manage("shell", "-c", _SET_INBOUND.format(space_id=space_a, on=True))
    wait_for(lambda: _get_with_token(world, "a").status == 200, "inbound on again for A")


def test_bodies_stream_both_ways_within_the_limit(world: World) -> None:
    a = world.inbound("a", 9000)
    token = {"X-Traffic-Token": a["traffic_token"]}
    base = a["url"]
    wait_for(lambda: world.request(base + "h", headers=token).status == 200, "echo server in A")
    payload = os.urandom(2 * 1024 * 1024)
    sent = world.request(base + "upload?x=1", method="POST", headers=token, body=payload)
    assert sent.status == 200, sent
    echoed = json.loads(sent.body)
    assert echoed == {"length": len(payload), "sha256": hashlib.sha256(payload).hexdigest(), "path": "/upload?x=1"}
    # Chunked from the client (no length known up front).
    chunks = [os.urandom(100_000) for _ in range(5)]
    streamed = world.request(base + "upload", method="POST", headers=token, body=iter(chunks))
    assert json.loads(streamed.body)["sha256"] == hashlib.sha256(b"".join(chunks)).hexdigest()
    # Over the limit: 413, from the length, before anything reaches the sandbox.
    too_big = world.request(base + "upload", method="POST", headers=token, body=b"x" * (MAX_BODY + 1))
    assert too_big.status == 413
    # Chunked past the limit: 413 too.
    big_chunks = iter([b"y" * 1024 * 1024] * 4)
    assert world.request(base + "upload", method="POST", headers=token, body=big_chunks).status == 413
    # A large answer arrives whole; the sandbox's hop-by-hop headers stay behind.
    big = world.request(base + "big", headers=token)
    assert big.status == 200
    assert len(big.body) == 8 * 1024 * 1024
    assert big.body[:256] == bytes(range(256))
    assert big.header("X-Upstream-Hop") is None


def test_hop_by_hop_headers_the_token_and_console_cookies_stay_behind(world: World) -> None:
    a = world.inbound("a", 9000)
    reply = world.request(
        a["url"] + "headers",
        headers={
            "X-Traffic-Token": a["traffic_token"],
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "Proxy-Authorization": "Basic c2VjcmV0",
            "X-Forwarded-For": "203.0.113.9",
            "Cookie": "sessionid=console-session; csrftoken=abc; app=1",
            "X-App": "kept",
        },
    )
    assert reply.status == 200, reply
    seen = dict(json.loads(reply.body)["headers"])
    assert seen["x-app"] == "kept"
    assert seen["cookie"] == "app=1"
    for gone in ("x-traffic-token", "x-secret-hop", "proxy-authorization"):
        assert gone not in seen, gone
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-host"] == host_of(a["url"])
    assert "x-forwarded-prefix" not in seen  # the app is at the root of its host
    # The sandbox's cookies stay on its own host (no Domain); the console's names never pass.
    assert reply.all("Set-Cookie") == ["app=1; Path=/"]
    # At the console's own origin: under the URL's path.
    console = world.request(
        f"/inbound/{world.sandboxes['a']}/9000/headers", headers={"X-Traffic-Token": a["traffic_token"]}
    )
    assert dict(json.loads(console.body)["headers"])["x-forwarded-prefix"] == f"/inbound/{world.sandboxes['a']}/9000"
    assert console.all("Set-Cookie") == [f"app=1; Path=/inbound/{world.sandboxes['a']}/9000/"]
    # A signed link in the query never reaches the sandbox; the rest of the query does.
    linked = world.request(
        a["url"] + "headers?_console_link=abc&keep=1", headers={"X-Traffic-Token": a["traffic_token"]}
    )
    assert json.loads(linked.body)["path"] == "/headers?keep=1"


def test_a_port_nothing_listens_on_and_a_paused_sandbox_say_so(world: World) -> None:
    closed = _get_with_token(world, "a", port=8999)
    assert closed.status == 502
    assert b"Nothing answers on port 8999" in closed.body
    ui = UiClient(f"http://127.0.0.1:{world.port}")
    ui.login(ADMIN_USER, ADMIN_PASSWORD)
    session_b = world.api("b").session("web").body["id"]
    assert ui.session_action(session_b, "pause") == 200
    try:
        # Looked-up addresses are kept for 2 s: the pause shows within that.
        paused = wait_for(lambda: (r := _get_with_token(world, "b")).status == 503 and r, "paused B refused")
        assert b"not running" in paused.body
        assert b"resume the session" in paused.body
    finally:
        assert ui.session_action(session_b, "resume") == 200
    wait_for(lambda: _get_with_token(world, "b").status == 200, "B again after resume")


def test_the_session_page_shows_the_url_and_makes_signed_links(world: World) -> None:
    ui = UiClient(f"http://127.0.0.1:{world.port}")
    ui.login(ADMIN_USER, ADMIN_PASSWORD)
    session_id = world.api("a").session("web").body["id"]
    page_path = f"/sessions/{session_id}/"
    with ui.opener.open(f"http://127.0.0.1:{world.port}{page_path}?port=8000", timeout=30) as answer:
        page = answer.read().decode()
    assert world.inbound("a")["url"] in page
    assert 'data-copy="inbound-url"' in page
    assert "Make signed link" in page
    token = ui._csrf(page_path)
    data = urllib.parse.urlencode({"port": "8000", "minutes": "5", "csrfmiddlewaretoken": token}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{world.port}/sessions/{session_id}/inbound/link/", data=data, method="POST"
    )
    request.add_header("Referer", f"http://127.0.0.1:{world.port}{page_path}")
    with ui.opener.open(request, timeout=30) as answer:
        result = answer.read().decode()
    link = result.split('id="inbound-signed-link" readonly size="90" value="', 1)[1].split('"', 1)[0]
    link = link.replace("&amp;", "&")
    followed = world.request(link)
    assert followed.status == 303
    cookie = (followed.header("Set-Cookie") or "").split(";", 1)[0]
    assert world.request(f"http://{host_of(link)}/hello.txt", headers={"Cookie": cookie}).status == 200


def test_the_host_packet_filter_is_loaded_while_all_this_works(world: World) -> None:
    done = subprocess.run(["nft", "list", "table", "inet", "sandbox_console"], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.fail("the nftables table inet sandbox_console is not loaded: these tests prove nothing about it")
    assert _get_with_token(world, "a").status == 200


def test_a_sandbox_host_is_that_port_s_whole_origin_without_csp_sandbox(world: World) -> None:
    a = world.inbound("a")
    token = {"X-Traffic-Token": a["traffic_token"]}
    # Every path of the host is the sandbox port's: a console page's path is the app's own.
    login = world.request(a["url"] + "login/", headers=token)
    assert login.status == 404
    assert b"File not found" in login.body  # http.server's answer, not the console's
    assert b"csrfmiddlewaretoken" not in world.request(a["url"] + "login/").body
    direct = world.request(a["url"] + "hello.txt", headers=token)
    assert direct.status == 200
    assert direct.header("Content-Security-Policy") is None
    made = world.api("a").call("POST", "web", "inbound/links", {"port": 8000, "ttl_s": 120})
    cookie = world.request(made.body["url"]).header("Set-Cookie") or ""
    assert "SameSite=Lax" in cookie
    # The console's own origin: sandboxed, and the cookie must come along from an opaque origin.
    query = urllib.parse.urlsplit(made.body["url"]).query
    cookie = world.request(f"/inbound/{world.sandboxes['a']}/8000/?{query}").header("Set-Cookie") or ""
    assert "SameSite=None" in cookie
    assert "Secure" in cookie


APP_PAGE = (
    "<!doctype html><html><head><script src='app.js'></script></head>"
    "<body><img id='pic' src='pic.svg' onload=\"document.body.dataset.img='loaded'\""
    " onerror=\"document.body.dataset.img='failed'\"></body></html>"
)
APP_SCRIPT = (
    "document.title = 'script-ran';"
    "fetch('data.txt').then(r => r.text()).then(t => { document.body.dataset.fetch = t.trim(); })"
    ".catch(() => { document.body.dataset.fetch = 'failed'; });"
)
PIC = "<svg xmlns='http://www.w3.org/2000/svg' width='4' height='4'><rect width='4' height='4'/></svg>"


def test_a_browser_follows_a_signed_link_and_the_page_loads_its_parts(world: World) -> None:
    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)", pytrace=False)
    from playwright.sync_api import sync_playwright

    api = world.api("a")
    assert api.shell("web", "mkdir -p /workspace/app").status == 200
    for name, body in (("index.html", APP_PAGE), ("app.js", APP_SCRIPT), ("pic.svg", PIC), ("data.txt", "data-ok")):
        put = api.call("PUT", "web", f"files/content?path=app/{name}", raw=body.encode())
        assert put.status == 201, put.body
    made = api.call("POST", "web", "inbound/links", {"port": 8000, "ttl_s": 300})
    assert made.status == 201, made.body
    link = urllib.parse.urlsplit(made.body["url"])
    console_prefix = f"/inbound/{world.sandboxes['a']}/8000/"
    seen = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=browser_args(CHROMIUM_ARGS))
        try:
            for origin, prefix in ((f"http://{link.netloc}", "/"), (f"http://127.0.0.1:{world.port}", console_prefix)):
                context = browser.new_context()
                page = context.new_page()
                page.goto(f"{origin}{prefix}?{link.query}")  # 303 -> cookie -> the app's root
                page.goto(f"{origin}{prefix}app/index.html")
                if prefix == "/":
                    page.wait_for_function("document.body && document.body.dataset.img && document.body.dataset.fetch")
                    seen[origin] = (
                        page.title(),
                        page.evaluate("document.body.dataset.img"),
                        page.evaluate("document.body.dataset.fetch"),
                    )
                else:
                    page.wait_for_load_state("load")
                    seen[origin] = (
                        page.evaluate("window.origin"),
                        page.evaluate("(() => { try { return document.cookie; } catch (e) { return 'refused'; } })()"),
                        page.evaluate(
                            "(() => { try { localStorage.length; return 'open'; } catch (e) { return 'refused'; } })()"
                        ),
                    )
                context.close()
        finally:
            browser.close()
    own, console_origin = seen.values()
    # A host of its own: an ordinary page (its script, image and own fetches work).
    assert own == ("script-ran", "loaded", "data-ok")
    # The console's own origin: the page runs sandboxed, in an opaque origin that reaches no
    # cookie or storage of the console's (its own parts need third-party cookies: docs/inbound.md).
    assert console_origin == ("null", "refused", "refused")


_AGE_ACTIVITY = """
from datetime import timedelta
from django.utils import timezone
from sandboxes.models import Session
Session.objects.filter(space_id={space_id!r}, key="idle").update(last_activity=timezone.now() - timedelta(hours=1))
"""
_READ_ACTIVITY = """
from django.utils import timezone
from sandboxes.models import Session
session = Session.objects.get(space_id={space_id!r}, key="idle")
print("AGE", (timezone.now() - session.last_activity).total_seconds())
"""


def test_inbound_traffic_counts_as_session_activity(world: World) -> None:
    space_a = world.spaces["a"]["space_id"]
    api = world.api("a")
    assert api.resolve("idle").status == 200
    try:
        world.console.manage("shell", "-c", _AGE_ACTIVITY.format(space_id=space_a))
        age = float(world.console.manage("shell", "-c", _READ_ACTIVITY.format(space_id=space_a)).split("AGE ")[1])
        assert age > 3000
        inbound = api.call("GET", "idle", "inbound?port=8000").body
        reply = world.request(inbound["url"], headers={"X-Traffic-Token": inbound["traffic_token"]})
        assert reply.status == 502  # nothing listens there: still traffic for the session
        age = float(world.console.manage("shell", "-c", _READ_ACTIVITY.format(space_id=space_a)).split("AGE ")[1])
        assert age < 60
    finally:
        assert api.delete("idle").status == 204
    # A deleted session's URL is gone (within the 2 s the lookups are kept).
    gone = wait_for(
        lambda: (
            (r := world.request(inbound["url"], headers={"X-Traffic-Token": inbound["traffic_token"]})).status == 404
            and r
        ),
        "the deleted session's URL refused",
    )
    assert b"hello" not in gone.body


def test_websockets_reach_the_sandbox_port_with_the_token(world: World) -> None:
    a, b = world.inbound("a", 9100), world.inbound("b", 9100)
    path = a["url"] + "chat?room=1"
    _status, echoed = wait_for(
        lambda: (r := ws_exchange(world, path, {"X-Traffic-Token": a["traffic_token"]}, "hi"))[0] == 101 and r,
        "websocket echo in A",
    )
    assert echoed == b"/chat?room=1||hi"
    for refused in ({}, {"X-Traffic-Token": b["traffic_token"]}, {"X-Traffic-Token": "x" * 43}):
        assert ws_exchange(world, path, refused, "hi")[0] == 403
    # A link cookie counts from a page of the same origin only, and reaches no further.
    made = world.api("a").call("POST", "web", "inbound/links", {"port": 9100, "ttl_s": 120})
    cookie = (world.request(made.body["url"]).header("Set-Cookie") or "").split(";", 1)[0]
    jar = f"{cookie}; sessionid=console-session; app=1"
    same = {"Cookie": jar, "Origin": f"http://{host_of(a['url'])}"}
    assert ws_exchange(world, path, same, "yo") == (101, b"/chat?room=1|app=1|yo")
    cross = {"Cookie": jar, "Origin": "http://evil.test"}
    assert ws_exchange(world, path, cross, "yo")[0] == 403
    # The console's own origin's path takes the token too.
    console = f"/inbound/{world.sandboxes['a']}/9100/chat?room=1"
    assert ws_exchange(world, console, {"X-Traffic-Token": a["traffic_token"]}, "hi") == (101, b"/chat?room=1||hi")
