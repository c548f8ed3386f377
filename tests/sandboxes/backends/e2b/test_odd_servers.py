"""The E2B and Cube adapters against control planes that answer oddly: a proxy that
redirects, a /health that is JSON but not the object CubeAPI answers, a /health that lies
about the sandbox count. None of these is the vendor's server, so they are not personalities
of tests/fakes: each is a few lines of stdlib HTTP on 127.0.0.1, started here."""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from sandboxes.backends.base import (
    BackendConfig,
    ErrorKind,
    ExecRequest,
    ListQuery,
    NetworkSpec,
    RemoteError,
    SandboxSpec,
)
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.cube.common import MAX_LIST_LIMIT
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.backends.e2b.common import envelope

# (status, headers, body) for a (method, path, query).
Answer = Callable[[str, str, dict[str, list[str]]], tuple[int, dict[str, str], bytes]]


class _Odd:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.seen: list[tuple[str, str, dict[str, list[str]]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                sent = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                if sent:
                    query["_body"] = [sent.decode(errors="replace")]  # for answers that read it
                outer.seen.append((self.command, parts.path, query))
                status, headers, body = outer.answer(self.command, parts.path, query)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_DELETE = do_PUT = _serve

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def config(self, kind: str) -> BackendConfig:
        return BackendConfig(
            kind=kind, endpoint=self.url, domain="odd.test", api_key="e2b_" + "0" * 40, allow_private_endpoints=True
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def odd() -> Iterator[Callable[[Answer], _Odd]]:
    servers: list[_Odd] = []

    def start(answer: Answer) -> _Odd:
        servers.append(_Odd(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _redirect(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
    # A login proxy or an http->https hop: every request redirected, with a body.
    return 302, {"Location": "https://login.odd.test/", "Content-Type": "text/html"}, b"<html>moved</html>"


@pytest.mark.parametrize("backend_class", [E2BBackend, CubeBackend])
def test_a_redirecting_endpoint_is_not_taken_for_a_healthy_server(
    odd: Callable[[Answer], _Odd], backend_class: type[E2BBackend]
) -> None:
    # Redirects are not followed (the SSRF guard pins the endpoint), and a 3xx was taken
    # for success: health said ok and the probe detected the SDK /v2 create (E2B) or
    # Cube v0.5+ (GET /snapshots "served") from a proxy that answers nothing but 302.
    server = odd(_redirect)
    backend = backend_class(server.config(backend_class.kind))
    health = backend.health()
    assert not health.ok
    assert "redirect" in health.detail
    assert "https://login.odd.test/" in health.detail
    with pytest.raises(RemoteError) as caught:
        backend.list(ListQuery())
    assert caught.value.kind == ErrorKind.INVALID
    assert "redirect" in caught.value.message
    backend.close()


@pytest.mark.parametrize("body", [b"[]", b"null", b'"ok"', b"42"])
def test_a_cube_health_that_is_json_but_no_object_is_a_clear_failure(
    odd: Callable[[Answer], _Odd], body: bytes
) -> None:
    # CubeAPI answers {status, sandboxes}; anything else in JSON raised AttributeError out of
    # health() (the config page's connection test), and out of every listing.
    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if path == "/health":
            return 200, {"Content-Type": "application/json"}, body
        return 200, {"Content-Type": "application/json"}, b"[]"

    backend = CubeBackend(odd(answer).config("cube"))
    health = backend.health()
    assert not health.ok
    assert "/health" in health.detail
    assert backend.list(ListQuery()).items == ()  # the count is unknown, the listing still works
    backend.close()


def test_a_cube_health_that_lies_about_the_count_does_not_size_the_page_past_the_cap(
    odd: Callable[[Answer], _Odd],
) -> None:
    # The first listing page was sized to /health's count with no cap (only its growth was
    # capped): a count of 10**12 asked CubeAPI for limit=1000000000100.
    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if path == "/health":
            return 200, {"Content-Type": "application/json"}, json.dumps({"status": "ok", "sandboxes": 10**12}).encode()
        return 200, {"Content-Type": "application/json"}, b"[]"

    server = odd(answer)
    backend = CubeBackend(server.config("cube"))
    assert backend.list(ListQuery(metadata={"console-space": "1"})).items == ()
    limits = [int(q["limit"][0]) for m, p, q in server.seen if p == "/v2/sandboxes"]
    assert limits
    assert max(limits) <= MAX_LIST_LIMIT
    backend.close()


def test_the_volume_check_of_an_html_answer_is_a_remote_error(odd: Callable[[Answer], _Odd]) -> None:
    # The connection test's "persistent workspace" step catches RemoteError only: an HTML 200
    # (a portal in front of the API) escaped volumes().check() as a JSONDecodeError.
    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "text/html"}, b"<html>captive portal</html>"

    backend = E2BBackend(odd(answer).config("e2b"))
    volumes = backend.volumes()
    assert volumes is not None
    with pytest.raises(RemoteError) as caught:
        volumes.check()
    assert caught.value.kind == ErrorKind.INTERNAL
    backend.close()


def test_an_envd_message_claiming_gigabytes_is_refused_not_buffered(odd: Callable[[Answer], _Odd]) -> None:
    # A Connect envelope's length is the sender's word (u32): a broken or hostile envd that
    # claims 2 GiB made the exec reader buffer everything that followed, waiting for the
    # message to complete, and a stream cut then was reported as a plain cut.
    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if path == "/sandboxes/sbx1":
            detail = {"sandboxID": "sbx1", "templateID": "base", "envdVersion": "0.5.7", "state": "running"}
            return 200, {"Content-Type": "application/json"}, json.dumps(detail).encode()
        if path == "/process.Process/Start":
            return 200, {"Content-Type": "application/connect+json"}, struct.pack(">BI", 0, 2**31) + b"x" * 65536
        return 404, {}, b""

    server = odd(answer)
    config = server.config("e2b")
    backend = E2BBackend(replace(config, options={"sandbox_url": server.url}))
    with pytest.raises(RemoteError) as caught:
        backend.exec("sbx1", ExecRequest(argv=("true",), timeout_s=10))
    assert caught.value.kind == ErrorKind.INTERNAL
    assert "2147483648 bytes" in caught.value.message
    backend.close()


@pytest.mark.parametrize("backend_class", [E2BBackend, CubeBackend])
@pytest.mark.parametrize(
    ("content_type", "body"),
    [("text/html", b"<html>dashboard</html>"), ("application/json", b'{"ok": true}'), ("application/json", b"null")],
)
def test_a_server_that_answers_200_to_everything_is_no_api(
    odd: Callable[[Answer], _Odd], backend_class: type[E2BBackend], content_type: str, body: bytes
) -> None:
    # A dashboard or portal URL given as the endpoint answers 200 to every path: health said
    # ok and recorded a protocol (E2B: /v2 create, as the probe "succeeded"; Cube: v0.5+, as
    # GET /snapshots "was served"), though the list answer is no list and no E2B API accepts
    # a create without templateID.
    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if backend_class is CubeBackend and path == "/health":
            return 200, {"Content-Type": "application/json"}, b'{"status": "ok", "sandboxes": 0}'
        return 200, {"Content-Type": content_type}, body

    backend = backend_class(odd(answer).config(backend_class.kind))
    health = backend.health()
    assert not health.ok
    assert health.protocol == ""
    backend.close()


def test_cube_listing_past_the_first_page_when_health_undercounts(odd: Callable[[Answer], _Odd]) -> None:
    # CubeAPI takes one CubeMaster page of `limit` rows from index 0 and filters *that page*
    # by metadata and state (services/sandboxes.rs list; tests/fakes list_v2 does the same).
    # A filtered answer shorter than `limit` therefore says nothing about rows past the page:
    # with /health counting fewer sandboxes than the list holds, the matches past row 1000
    # were silently never seen (the reaper's listing is filtered by config).
    rows = [
        {
            "sandboxID": f"sbx-{i:05d}",
            "templateID": "base",
            "state": "running",
            "startedAt": f"2026-12-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "metadata": {"console-config": "mine" if i >= 1100 else "other"},
        }
        for i in range(1200)
    ]

    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if path == "/health":
            return 200, {"Content-Type": "application/json"}, b'{"status": "ok", "sandboxes": 0}'
        if path == "/v2/sandboxes":
            page = rows[: int(query.get("limit", ["100"])[0])]
            wanted = dict(p.partition("=")[::2] for p in query.get("metadata", [""])[0].split("&") if p)
            page = [r for r in page if all(r["metadata"].get(k) == v for k, v in wanted.items())]  # type: ignore[attr-defined]
            return 200, {"Content-Type": "application/json"}, json.dumps(page).encode()
        return 404, {}, b""

    backend = CubeBackend(odd(answer).config("cube"))
    found = list(backend.iter_sandboxes(ListQuery(metadata={"console-config": "mine"}, limit=50)))
    assert [info.sandbox_id for info in found] == [f"sbx-{i:05d}" for i in range(1100, 1200)]
    backend.close()


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("signal: segmentation fault (core dumped)", 139),
        ("signal: aborted (core dumped)", 134),
        ("signal: user defined signal 1", 138),
        ("signal: CPU time limit exceeded", 152),
        ("signal: killed", 137),
    ],
)
def test_a_signal_exit_is_128_plus_that_signal(odd: Callable[[Answer], _Odd], status: str, code: int) -> None:
    # envd's EndEvent.status is Go's ProcessState.String(): "signal: " + the signal's name
    # from the syscall table, plus " (core dumped)" when a core was written (os/exec_posix.go).
    # Only nine names were known, and a core dump hid even those: all read as SIGKILL (137).
    end = {"exitCode": -1, "status": status, "error": status}  # `exited` false: omitted
    events: list[dict[str, object]] = [{"event": {"start": {"pid": 7}}}, {"event": {"end": end}}]
    stream = b"".join(envelope(event) for event in events) + envelope({}, flags=0x02)

    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if path == "/sandboxes/sbx1":
            detail = {"sandboxID": "sbx1", "templateID": "base", "envdVersion": "0.5.7", "state": "running"}
            return 200, {"Content-Type": "application/json"}, json.dumps(detail).encode()
        if path == "/process.Process/Start":
            return 200, {"Content-Type": "application/connect+json"}, stream
        return 404, {}, b""

    server = odd(answer)
    backend = E2BBackend(replace(server.config("e2b"), options={"sandbox_url": server.url}))
    assert backend.exec("sbx1", ExecRequest(argv=("true",), timeout_s=10)).exit_code == code
    backend.close()


def test_a_gateways_json_404_for_a_missing_route_falls_back_to_the_spec_create(odd: Callable[[Answer], _Odd]) -> None:
    # A spec-built control plane (no POST /v2/sandboxes) behind an API gateway: Kong answers
    # a path it has no route for with 404 {"message": "no Route matched with those values"}.
    # Any JSON with `message` was taken for the API's own error ({code, message}, spec
    # Error): the probe recorded e2b-v2 and every create failed with not_found.
    sandbox = {"sandboxID": "sbx-k", "templateID": "base", "clientID": "c", "envdVersion": "0.5.7"}

    def answer(method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if path == "/health":
            return 204, {}, b""
        if (method, path) == ("GET", "/v2/sandboxes"):
            return 200, {"Content-Type": "application/json"}, b"[]"
        if (method, path) == ("POST", "/sandboxes"):
            if "templateID" not in json.loads(query["_body"][0]):  # the spec's NewSandbox requires it
                return 400, {"Content-Type": "application/json"}, b'{"code": 400, "message": "templateID missing"}'
            return 201, {"Content-Type": "application/json"}, json.dumps(sandbox).encode()
        return 404, {"Content-Type": "application/json"}, b'{"message": "no Route matched with those values"}'

    server = odd(answer)
    backend = E2BBackend(server.config("e2b"))
    health = backend.health()
    assert (health.ok, health.protocol) == (True, "e2b-v1")
    fresh = E2BBackend(server.config("e2b"))  # knows nothing: learns it from the create
    info = fresh.create(
        SandboxSpec(template_id="base", network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False))
    )
    assert info.sandbox_id == "sbx-k"
    creates = [q for m, p, q in server.seen if (m, p) == ("POST", "/sandboxes") and "templateID" in q["_body"][0]]
    assert len(creates) == 1
    backend.close()
    fresh.close()
