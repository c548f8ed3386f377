"""Inbound traffic across tenants: every sandbox port has a host of its own
(`<label>-<port>.<domain>`), so a page in space B's sandbox is never same-origin with space
A's (with one inbound host for all, its script could read A's pages with the visitor's A link
cookie and A's localStorage). These tests hold the proxy to it: a host answers for its own sandbox port only, any other
name on the domain is the uniform 404, and neither links nor cookies nor websockets cross.
Real console, real Docker sandboxes, Chromium; every request goes to 127.0.0.1 (a sandbox
host's name only in the Host header, or mapped to 127.0.0.1 inside Chromium)."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator

import pytest

from tests.support.inbound_world import (
    World,
    browser_args,
    host_of,
    made_world,
    ws_exchange,
)

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def world(docker_base_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with made_world(docker_base_image, tmp_path_factory) as made:
        yield made


NOT_FOUND = b"No such inbound URL, or no valid traffic token for it.\n"
VICTIM_PAGE = "<!doctype html><script>localStorage.setItem('a-secret', 'a-storage-secret')</script><p>a</p>"
ATTACKER_PAGE = (
    "<!doctype html><script>"
    "window.seen = {storage: (() => { try { return localStorage.getItem('a-secret'); }"
    " catch (e) { return 'refused'; } })()};"
    "fetch(window.VICTIM, {credentials: 'include'}).then(r => r.text())"
    ".then(t => { window.seen.read = t.trim(); }).catch(() => { window.seen.read = 'refused'; });"
    "</script>"
)


def _link(at: World, letter: str, port: int = 8000) -> str:
    made = at.api(letter).call("POST", "web", "inbound/links", {"port": port, "ttl_s": 300})
    assert made.status == 201, made.body
    return str(made.body["url"])


def _cookie(at: World, link: str) -> str:
    followed = at.request(link)
    assert followed.status == 303, followed
    return (followed.header("Set-Cookie") or "").split(";", 1)[0]


def test_a_page_in_another_spaces_sandbox_cannot_read_this_one(world: World) -> None:
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing (apt-get install -y chromium)", pytrace=False)
    for letter, body in (("a", VICTIM_PAGE), ("b", ATTACKER_PAGE)):
        api = world.api(letter)
        assert api.shell("web", "mkdir -p /workspace/x").status == 200
        put = api.call("PUT", "web", "files/content?path=x/page.html", raw=body.encode())
        assert put.status == 201, put.body
    links = {letter: _link(world, letter) for letter in "ab"}
    origins = {letter: f"http://{host_of(link)}" for letter, link in links.items()}
    assert origins["a"] != origins["b"]
    victim = f"{origins['a']}/hello.txt"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=browser_args(CHROMIUM_ARGS))
        try:
            context = browser.new_context()
            page = context.new_page()
            # The visitor uses A's app (a link A's member sent), then opens a link to B's.
            page.goto(links["a"])
            assert page.content().count("hello.txt") >= 1  # A's root listing: the cookie works
            page.goto(f"{origins['a']}/x/page.html")
            page.wait_for_load_state("load")
            page.goto(links["b"])
            page.add_init_script(f"window.VICTIM = {victim!r};")
            page.goto(f"{origins['b']}/x/page.html")
            page.wait_for_function("window.seen && window.seen.read")
            seen = page.evaluate("window.seen")
            # The visitor's own cookie still opens A's page: the refusal is B's, not A's.
            page.goto(victim)
            own = page.inner_text("body").strip()
            context.close()
        finally:
            browser.close()
    leaked = {"read": seen["read"] == "hello-inbound-a", "storage": seen["storage"] == "a-storage-secret"}
    assert leaked == {"read": False, "storage": False}, seen
    assert own == "hello-inbound-a"


def test_a_host_answers_for_its_own_sandbox_port_only(world: World) -> None:
    a, b = world.inbound("a"), world.inbound("b")
    a_host, b_host = host_of(a["url"]), host_of(b["url"])
    a_label, b_label = a_host.split("-", 1)[0], b_host.split("-", 1)[0]
    a_cookie = _cookie(world, _link(world, "a"))
    refusals = {
        "A's token on B's host": world.request(b["url"] + "hello.txt", headers={"X-Traffic-Token": a["traffic_token"]}),
        "A's cookie on B's host": world.request(b["url"] + "hello.txt", headers={"Cookie": a_cookie}),
        "A's cookie on A's other port": world.request(world.inbound("a", 9000)["url"], headers={"Cookie": a_cookie}),
        "A's label with B's sandbox tag": world.request(
            f"http://{a_label[:26]}{b_label[26:]}-8000.localhost:{world.port}/hello.txt",
            headers={"X-Traffic-Token": a["traffic_token"]},
        ),
        "B's label with A's sandbox tag": world.request(
            f"http://{b_label[:26]}{a_label[26:]}-8000.localhost:{world.port}/hello.txt",
            headers={"X-Traffic-Token": a["traffic_token"]},
        ),
        "no credential": world.request(a["url"] + "hello.txt"),
    }
    for what, reply in refusals.items():
        assert (reply.status, reply.body) == (404, NOT_FOUND), what
    # The same credentials on their own host pass (the refusals above are about the host).
    assert world.request(a["url"] + "hello.txt", headers={"Cookie": a_cookie}).body == b"hello-inbound-a\n"


def test_unknown_and_malformed_hosts_on_the_domain_are_the_uniform_404(world: World) -> None:
    a = world.inbound("a")
    token = {"X-Traffic-Token": a["traffic_token"]}
    label = host_of(a["url"]).split("-", 1)[0]
    port = world.port
    hosts = {
        "a label of nothing": f"{'a' * 34}-8000.localhost:{port}",
        "one character changed": f"{label[:5]}{'b' if label[5] != 'b' else 'c'}{label[6:]}-8000.localhost:{port}",
        "no port": f"{label}.localhost:{port}",
        "port 0": f"{label}-0.localhost:{port}",
        "port 70000": f"{label}-70000.localhost:{port}",
        "short label": f"{label[:-1]}-8000.localhost:{port}",
        "not base32": f"{label[:-1]}1-8000.localhost:{port}",
        "a deeper name": f"x.{label}-8000.localhost:{port}",
        "another port of the console": f"{label}-8000.localhost:{port + 1}",
        "no port of the console": f"{label}-8000.localhost",
        "the sandbox id": f"{world.sandboxes['a'][:34]}-8000.localhost:{port}",
        "nothing before the domain": f".localhost:{port}",
    }
    for what, host in hosts.items():
        for path in ("/hello.txt", "/login/", f"/inbound/{world.sandboxes['a']}/8000/hello.txt"):
            reply = world.request(path, headers={**token, "Host": host})
            assert (reply.status, reply.body) == (404, NOT_FOUND), (what, path, reply.status)
    # Upper case is the same name (DNS is case-blind).
    upper = world.request("/hello.txt", headers={**token, "Host": host_of(a["url"]).upper()})
    assert upper.body == b"hello-inbound-a\n"
    # Names off the domain stay the console's.
    assert world.request("/login/", headers={"Host": f"127.0.0.1:{port}"}).status == 200


def test_websockets_route_by_host_too(world: World) -> None:
    a, b = world.inbound("a", 9100), world.inbound("b", 9100)
    a_ws, b_ws = a["url"] + "chat", b["url"] + "chat"
    token = {"X-Traffic-Token": a["traffic_token"]}
    assert ws_exchange(world, a_ws, token, "hi") == (101, b"/chat||hi")
    assert ws_exchange(world, b_ws, {"X-Traffic-Token": b["traffic_token"]}, "hi") == (101, b"/chat||hi")
    label = host_of(a["url"]).split("-", 1)[0]
    refused = {
        "A's token on B's host": (b_ws, token),
        "unknown host": (f"http://{'a' * 34}-9100.localhost:{world.port}/chat", token),
        "malformed host": (f"http://{label}-x.localhost:{world.port}/chat", token),
    }
    a_cookie = _cookie(world, _link(world, "a", 9100))
    own_origin = f"http://{host_of(a['url'])}"
    refused["A's cookie from B's page"] = (a_ws, {"Cookie": a_cookie, "Origin": f"http://{host_of(b['url'])}"})
    refused["A's cookie on B's host"] = (b_ws, {"Cookie": a_cookie, "Origin": f"http://{host_of(b['url'])}"})
    for what, (url, headers) in refused.items():
        assert ws_exchange(world, url, headers, "hi")[0] == 403, what
    assert ws_exchange(world, a_ws, {"Cookie": a_cookie, "Origin": own_origin}, "yo") == (101, b"/chat||yo")


def test_a_link_of_one_space_does_nothing_on_another_spaces_host(world: World) -> None:
    a_link, b_link = _link(world, "a"), _link(world, "b")
    b_host = host_of(b_link)
    # A's link parameter on B's host: no cookie, the uniform 404.
    query = urllib.parse.urlsplit(a_link).query
    reply = world.request(f"http://{b_host}/?{query}")
    assert (reply.status, reply.body) == (404, NOT_FOUND)
    assert reply.header("Set-Cookie") is None
    # A's link on B's host with B's own cookie too: B's cookie opens B, A's link adds nothing.
    b_cookie = _cookie(world, b_link)
    both = world.request(f"http://{b_host}/hello.txt?{query}", headers={"Cookie": b_cookie})
    assert (both.status, both.body) == (200, b"hello-inbound-b\n")
    # A cookie another host tossed for the whole domain does not hide the visitor's own.
    tossed = world.request(f"http://{b_host}/hello.txt", headers={"Cookie": f"{b_cookie}; console_inbound=junk"})
    assert tossed.body == b"hello-inbound-b\n"


def test_a_page_of_another_host_cannot_make_the_browser_use_this_hosts_cookie(world: World) -> None:
    """In a deployment all sandbox hosts are one site (one registrable domain), so SameSite=Lax
    sends the visitor's cookie for A's host along with what a page of B's host makes the
    browser send there: a form POST (a write in A's app), a `<script src>` (A's data run in
    B's page). The cookie counts only for A's own pages (Fetch Metadata: same-origin, or a
    browser that sends none) and for top-level navigations, as Lax does between sites."""
    cookie = _cookie(world, _link(world, "a"))
    url = world.inbound("a")["url"] + "hello.txt"
    names = {"site": "Sec-Fetch-Site", "mode": "Sec-Fetch-Mode", "dest": "Sec-Fetch-Dest"}

    def sent(method: str = "GET", credential: dict[str, str] | None = None, **fetch: str) -> tuple[int, bytes]:
        headers = {**(credential or {"Cookie": cookie}), **{names[key]: value for key, value in fetch.items()}}
        reply = world.request(url, method=method, headers=headers)
        return reply.status, reply.body

    counted = {
        "no Fetch Metadata": sent(),
        "its own page's fetch": sent(site="same-origin", mode="cors", dest="empty"),
        "a typed URL": sent(site="none", mode="navigate", dest="document"),
        "a link from a sibling host": sent(site="same-site", mode="navigate", dest="document"),
        "a link from another site": sent(site="cross-site", mode="navigate", dest="document"),
        "HEAD, a link": sent("HEAD", site="same-site", mode="navigate", dest="document"),
    }
    for what, (status, _body) in counted.items():
        assert status == 200, what
    refused = {
        "a sibling's script tag": sent(site="same-site", mode="no-cors", dest="script"),
        "a sibling's fetch": sent(site="same-site", mode="cors", dest="empty"),
        "a sibling's form POST": sent("POST", site="same-site", mode="navigate", dest="document"),
        "a sibling's frame": sent(site="same-site", mode="navigate", dest="iframe"),
        "another site's image": sent(site="cross-site", mode="no-cors", dest="image"),
    }
    for what, answer in refused.items():
        assert answer == (404, NOT_FOUND), what
    # The token header is no cookie: no browser sends it on its own.
    token = {"X-Traffic-Token": world.inbound("a")["traffic_token"]}
    assert sent(credential=token, site="same-site", mode="no-cors", dest="script")[0] == 200
    # On the console's own origin a page runs in an opaque origin: its own parts are
    # cross-site requests, and the cookie counts for them (CSP sandbox keeps them apart there).
    query = urllib.parse.urlsplit(_link(world, "a")).query
    path = f"/inbound/{world.sandboxes['a']}/8000/"
    console_cookie = _cookie(world, f"{path}?{query}")
    reply = world.request(
        path + "hello.txt",
        headers={"Cookie": console_cookie, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},
    )
    assert reply.status == 200


def test_a_link_with_its_parameter_name_percent_encoded_is_not_a_redirect_loop(world: World) -> None:
    """`?%5Fconsole_link=…` is the same parameter to the route's check (parse_qsl decodes it),
    but the step that leaves the link out compares raw bytes: the 303 keeps the link in the
    Location, the next request sets the cookie again and answers 303 again, for ever (and a
    link the route did not take is passed on to the sandbox's app)."""
    link = _link(world, "a")
    parts = urllib.parse.urlsplit(link)
    encoded = parts.query.replace("_console_link=", "%5Fconsole_link=", 1)
    first = world.request(f"http://{parts.netloc}{parts.path}?{encoded}")
    assert first.status == 303
    cookie = (first.header("Set-Cookie") or "").split(";", 1)[0]
    second = world.request(f"http://{parts.netloc}{first.header('Location') or ''}", headers={"Cookie": cookie})
    assert second.status == 200, (second.status, second.header("Location"))
