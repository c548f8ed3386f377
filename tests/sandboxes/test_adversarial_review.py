"""Adversarial review (rev1): forged cursors and a sandbox's answer that reaches for the
console's origin. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from sandboxes.inbound.forward import forward
from sandboxes.models import Session
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent
from tests.sandboxes.sessions.test_limits import agent  # noqa: F401  (the fixture)


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "forged",
    [
        ["2020-01-01T00:00:00+00:00", 1],
        ["2020-01-01T00:00:00+00:00", {"a": 1}],
        ["2020-01-01T00:00:00+00:00", ["x"]],
        {"2020-01-01T00:00:00+00:00": 0, "b": 1},
    ],
    ids=["int-id", "object-id", "list-id", "object"],
)
def test_a_forged_cursor_of_other_types_is_a_400_not_a_500(world: World, agent: Agent, forged: Any) -> None:  # noqa: F811
    config = make_config(world.space_a, name="c")
    Session.objects.create(space=world.space_a, key="s", config=config)
    for what in ("commands", "artifacts"):
        response = agent.get("s", what, cursor=_cursor(forged))
        assert response.status_code == 400, (what, response.status_code, response.content[:200])
        assert json.loads(response.content)["error"]["field"] == "cursor"


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


@pytest.mark.django_db
@pytest.mark.parametrize(
    "when",
    ["2020-01-01T00:00:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2020-01-01"],
    ids=["naive", "year-1-east", "year-9999-west", "date-only"],
)
def test_a_cursor_at_odd_times_answers_a_page_or_a_400(world: World, agent: Agent, when: str) -> None:  # noqa: F811
    config = make_config(world.space_a, name="c")
    Session.objects.create(space=world.space_a, key="s", config=config)
    response = agent.get("s", "commands", cursor=_cursor([when, "00000000-0000-0000-0000-000000000000"]))
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])
