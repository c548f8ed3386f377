"""The fake against the `e2b` SDK's own generated wire models (pinned e2b 2.63).

The SDK's REST models (e2b/api/client/models, generated from the OpenAPI spec the SDK ships)
and envd messages (e2b/envd/*_pb.py) are the SDK's idea of the wire format. Every answer of
the fake's E2B cloud personality must parse with them and carry no field they do not know
(so the fake cannot drift); envd messages must be canonical proto3 JSON, i.e. what the SDK's
codec prints back, defaults omitted (connect-go's protojson). Requests the SDK models build
must be accepted, and the adapters' request bodies must parse as those models.

Where the published spec (e2b-dev/infra spec/openapi.yml) and the SDK differ, the fake's
`spec` personality answers as the spec; docs/backends.md says which the adapter follows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b.api.client.models.connect_sandbox import ConnectSandbox
from e2b.api.client.models.error import Error
from e2b.api.client.models.listed_sandbox import ListedSandbox
from e2b.api.client.models.new_sandbox import NewSandbox
from e2b.api.client.models.new_sandbox_v2 import NewSandboxV2
from e2b.api.client.models.sandbox import Sandbox
from e2b.api.client.models.sandbox_detail import SandboxDetail
from e2b.api.client.models.snapshot_info import SnapshotInfo
from e2b.api.client.models.template import Template
from e2b.api.client.models.template_with_builds import TemplateWithBuilds
from e2b.envd.filesystem.filesystem_pb import ListDirResponse, StatResponse
from e2b.envd.process.process_pb import ListResponse, StartResponse

from sandboxes.backends.base import NetworkSpec, SandboxSpec
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.backends.e2b.common import iter_envelopes
from tests.fakes.fixtures import FakeHandle

pytestmark = [pytest.mark.docker, pytest.mark.e2b]


def strict(model: Any, data: Any) -> Any:
    """Parse with an SDK model; a field the model does not know is drift."""
    parsed = model.from_dict(data)
    assert parsed.additional_properties == {}, f"{model.__name__}: unknown fields {parsed.additional_properties}"
    return parsed


def canonical(message_class: Any, raw: Any) -> None:
    """A proto3 JSON message exactly as the SDK's codec prints it (defaults omitted)."""
    parsed = message_class.from_json(json.dumps(raw))  # unknown fields rejected
    assert json.loads(parsed.to_json()) == raw, f"{message_class.__name__}: not canonical: {raw}"


@pytest.fixture
def sandbox(fake_e2b: FakeHandle) -> Iterator[dict[str, Any]]:
    body = NewSandboxV2(template_id="base", timeout=120, metadata={"wire": uuid.uuid4().hex}).to_dict()
    with fake_e2b.http() as http:
        created = http.post("/v2/sandboxes", json=body)
        assert created.status_code == 201, created.text
        yield created.json()
        http.delete(f"/sandboxes/{created.json()['sandboxID']}")


def test_control_plane_answers_parse_with_the_sdk_models(fake_e2b: FakeHandle, sandbox: dict[str, Any]) -> None:
    sandbox_id = sandbox["sandboxID"]
    strict(Sandbox, sandbox)
    with fake_e2b.http() as http:
        strict(SandboxDetail, http.get(f"/sandboxes/{sandbox_id}").json())
        listed = http.get("/v2/sandboxes", params={"limit": 100})
        assert listed.json()
        for row in listed.json():
            strict(ListedSandbox, row)
        connected = http.post(f"/sandboxes/{sandbox_id}/connect", json=ConnectSandbox(timeout=60).to_dict())
        strict(Sandbox, connected.json())
        snapshot = http.post(f"/sandboxes/{sandbox_id}/snapshots", json={"name": f"wire-{uuid.uuid4().hex[:6]}"})
        assert snapshot.status_code == 201
        strict(SnapshotInfo, snapshot.json())
        for row in http.get("/snapshots").json():
            strict(SnapshotInfo, row)
        http.delete(f"/templates/{snapshot.json()['snapshotID']}")
        for row in http.get("/v2/templates").json():
            strict(Template, row)
        strict(TemplateWithBuilds, http.get("/templates/base").json())
        missing = http.get("/sandboxes/doesnotexist")
        assert missing.status_code == 404
        strict(Error, missing.json())


def test_the_spec_personality_answers_as_the_published_spec(fake_e2b_spec_server: FakeHandle) -> None:
    # infra's spec/openapi.yml TemplateWithBuilds lacks buildID, cpuCount, diskSizeMB, ... that
    # SDK 2.63 requires; the adapter reads only templateID, names/aliases, createdAt.
    with fake_e2b_spec_server.http() as http:
        detail = http.get("/templates/base").json()
        assert "diskSizeMB" not in detail
        with pytest.raises(KeyError):
            TemplateWithBuilds.from_dict(detail)
        created = http.post("/sandboxes", json=NewSandbox(template_id="base", timeout=60).to_dict())
        assert created.status_code == 201
        strict(Sandbox, created.json())
        http.delete(f"/sandboxes/{created.json()['sandboxID']}")
        # The routes the spec lacks answer as infra's request validator does (packages/api
        # main.go, internal/utils/error.go @54693ff): the API's Error body with the router's reason.
        v2 = http.post("/v2/sandboxes", json={"templateID": "base"})
        assert (v2.status_code, v2.json()["message"]) == (404, "validation error: method not allowed")
        v2_connect = http.post("/v2/sandboxes/x/connect", json={})
        assert (v2_connect.status_code, v2_connect.json()["message"]) == (
            404,
            "validation error: no matching operation was found",
        )


@pytest.mark.parametrize("kind", ["e2b", "cube"])
def test_the_adapters_bodies_parse_as_the_sdk_models(fake_e2b: FakeHandle, kind: str) -> None:
    backend_class = CubeBackend if kind == "cube" else E2BBackend
    adapter = backend_class(fake_e2b.backend_config(kind, protocol="cube-0.5" if kind == "cube" else "e2b-v2"))
    spec = SandboxSpec(
        template_id="base",
        network=NetworkSpec.parse(allow_internet_access=False, allow_public_traffic=False, allow_out=("10.0.0.1",)),
        metadata={"a": "b"},
        env={"A": "1"},
    )
    body = adapter._create_body(spec)
    parsed = NewSandbox.from_dict(body)
    # Cube from v0.5.0 reads the idle behaviour from `lifecycle`, which E2B's NewSandbox lacks.
    assert set(parsed.additional_properties) <= ({"lifecycle"} if kind == "cube" else set())
    # The model adds an empty volumeMounts list when none was sent; otherwise the same body.
    assert {k: v for k, v in parsed.to_dict().items() if v != [] or k in body} == body
    strict(ConnectSandbox, {"timeout": adapter.sandbox_ttl})
    adapter.close()


def _stream(adapter: E2BBackend, sandbox_id: str, method: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = adapter.open_stream(sandbox_id, method, body, "wire check", user="user")
    try:
        return [message for flags, message in iter_envelopes(response.iter_raw()) if not flags & 0x02]
    finally:
        response.close()


def test_envd_messages_are_canonical_proto3_json(fake_e2b: FakeHandle, sandbox: dict[str, Any]) -> None:
    sandbox_id = sandbox["sandboxID"]
    adapter = E2BBackend(fake_e2b.backend_config("e2b"))
    try:
        start = {"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi; echo err >&2"]}, "stdin": False}
        events = _stream(adapter, sandbox_id, "process.Process/Start", start)
        assert next(iter(events[0]["event"])) == "start"
        assert events[-1]["event"]["end"] == {"exited": True, "status": "exit status 0"}  # exitCode 0 omitted
        for message in events:
            canonical(StartResponse, message)
        killed = _stream(
            adapter, sandbox_id, "process.Process/Start", {"process": {"cmd": "/bin/sh", "args": ["-c", "kill -9 $$"]}}
        )
        for message in killed:
            canonical(StartResponse, message)
        canonical(ListResponse, adapter.rpc(sandbox_id, "process.Process/List", {}, "list"))
        canonical(StatResponse, adapter.rpc(sandbox_id, "filesystem.Filesystem/Stat", {"path": "/etc"}, "stat"))
        listing = adapter.rpc(sandbox_id, "filesystem.Filesystem/ListDir", {"path": "/etc", "depth": 1}, "ls")
        canonical(ListDirResponse, listing)
    finally:
        adapter.close()


def test_api_auth_is_the_x_api_key_header_only(fake_e2b: FakeHandle) -> None:
    # spec/openapi.yml ApiKeyAuth: header X-API-Key. A Bearer token is the dashboard's.
    with httpx.Client(base_url=fake_e2b.api_url, timeout=10) as http:
        assert http.get("/v2/sandboxes", headers={"X-API-Key": fake_e2b.api_key}).status_code == 200
        bearer = http.get("/v2/sandboxes", headers={"Authorization": f"Bearer {fake_e2b.api_key}"})
        assert bearer.status_code == 401
        strict(Error, bearer.json())
        assert http.get("/v2/sandboxes", params={"api_key": fake_e2b.api_key}).status_code == 401
