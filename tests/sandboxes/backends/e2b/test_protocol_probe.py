"""How the E2B adapter learns which create operation a control plane serves: a missing route
is recognised in every form a real control plane answers it (e2b-dev/infra's request
validator, gin alone, a reverse proxy), and the chosen route is confirmed before it is
recorded. Against the fake's infra personality (tests/fakes/test_release_personalities.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sandboxes.backends.base import ErrorKind, RemoteError, SandboxSpec
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.backends.e2b.common import NoRoute, status_error
from tests.fakes.fixtures import FakeHandle
from tests.support.backend_conformance import OFFLINE, run

pytestmark = [pytest.mark.docker, pytest.mark.e2b]


@pytest.fixture(params=["validator", "gin", "proxy"])
def infra(request: pytest.FixtureRequest, fake_e2b_spec_server: FakeHandle) -> Iterator[FakeHandle]:
    """infra's control plane answering a missing route as its validator does (the real
    server), as gin alone would, or through a proxy that knows only the spec's paths."""
    fake_e2b_spec_server.configure(missing_route=request.param)
    yield fake_e2b_spec_server
    fake_e2b_spec_server.configure(missing_route="validator")


def test_self_hosted_infra_is_recorded_as_v1_and_creates_work(infra: FakeHandle, test_run_id: str) -> None:
    # infra's validator answers POST /v2/sandboxes with 404 {"code": 404, "message":
    # "validation error: method not allowed"}: read as an ordinary not_found, Test connection
    # recorded e2b-v2 and every create failed with not_found (HTTP 404).
    adapter = E2BBackend(infra.backend_config("e2b"))
    try:
        health = adapter.health()
        assert (health.ok, health.protocol) == (True, "e2b-v1"), health.detail
        recorded = E2BBackend(infra.backend_config("e2b", protocol=health.protocol))
        info = recorded.create(SandboxSpec(template_id="base", network=OFFLINE, metadata={"test-run": test_run_id}))
        try:
            assert run(recorded, info.sandbox_id, "echo infra") == "infra\n"
        finally:
            recorded.delete(info.sandbox_id)
            recorded.close()
    finally:
        adapter.close()


def test_a_create_without_a_recorded_protocol_falls_back_on_infra(infra: FakeHandle, test_run_id: str) -> None:
    adapter = E2BBackend(infra.backend_config("e2b"))
    info = adapter.create(SandboxSpec(template_id="base", network=OFFLINE, metadata={"test-run": test_run_id}))
    try:
        assert adapter.protocol == "e2b-v1"
    finally:
        adapter.delete(info.sandbox_id)
        adapter.close()


def test_the_chosen_route_is_confirmed_before_it_is_recorded(fake_e2b_spec_server: FakeHandle) -> None:
    # The probe calls the route it picks with a body it must refuse (no templateID): the 400
    # is the confirmation, and nothing is created.
    adapter = E2BBackend(fake_e2b_spec_server.backend_config("e2b"))
    before = len(fake_e2b_spec_server.state()["sandboxes"])
    fake_e2b_spec_server.forget_requests()
    assert adapter.probe_protocol() == "e2b-v1"
    calls = [(m, p) for plane, m, p in fake_e2b_spec_server.requests() if plane == "api"]
    assert calls == [("POST", "/v2/sandboxes"), ("POST", "/sandboxes")]
    assert len(fake_e2b_spec_server.state()["sandboxes"]) == before
    adapter.close()


def test_the_cloud_is_confirmed_as_v2(fake_e2b: FakeHandle) -> None:
    adapter = E2BBackend(fake_e2b.backend_config("e2b"))
    fake_e2b.forget_requests()
    assert adapter.health().protocol == "e2b-v2"
    assert ("api", "POST", "/sandboxes") not in fake_e2b.requests()
    adapter.close()


def _answer(status: int, **kwargs: object) -> httpx.Response:
    return httpx.Response(status, request=httpx.Request("POST", "http://api.example.test/x"), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "response",
    [
        _answer(404, json={"code": 404, "message": "validation error: method not allowed"}),
        _answer(404, json={"code": 404, "message": "validation error: no matching operation was found"}),
        _answer(404, text="404 page not found"),
        _answer(405, text="405 method not allowed"),
        _answer(404, content=b""),
        _answer(404, html="<html><body><h1>404 Not Found</h1></body></html>"),
        _answer(404, json={"message": "no Route matched with those values"}),
    ],
    ids=["validator-405", "validator-404", "gin-404", "gin-405", "axum", "nginx", "kong"],
)
def test_every_form_of_a_missing_route_is_recognised(response: httpx.Response) -> None:
    assert isinstance(status_error(response, "probing", control=True), NoRoute)


def test_a_handlers_404_stays_not_found() -> None:
    answer = _answer(404, json={"code": 404, "message": "sandbox \"x\" doesn't exist or you don't have access to it"})
    error = status_error(answer, "sandbox x", control=True)
    assert not isinstance(error, NoRoute)
    assert error.kind == ErrorKind.NOT_FOUND


def test_a_server_with_neither_create_route_is_not_an_e2b_api(fake_cube_server: FakeHandle) -> None:
    # Cube (axum) routes POST /sandboxes: a stand-in with neither route is a Cube with both
    # answered empty, so take a path prefix no server routes at all.
    config = fake_cube_server.backend_config("e2b")
    adapter = E2BBackend(
        type(config)(
            kind="e2b",
            endpoint=config.endpoint + "/nothing",
            domain=config.domain,
            api_key=config.api_key,
            allow_private_endpoints=True,
            options=config.options,
        )
    )
    with pytest.raises(RemoteError) as caught:
        adapter.probe_protocol()
    assert caught.value.kind == ErrorKind.INVALID
    assert "not an E2B API" in caught.value.message
    adapter.close()
