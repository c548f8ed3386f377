"""The fake's personalities answer as each release's code does: one CubeSandbox personality per
release (fake_state.CUBE_RELEASES) and e2b-dev/infra's control plane. Each row names the
source file and commit it was read from (TencentCloud/CubeSandbox, e2b-dev/infra); the
adapters' tests rely on these answers, so they are held here against the source, raw HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fakes.fake_state import CUBE_RELEASES
from tests.fakes.fixtures import FakeHandle

pytestmark = [pytest.mark.docker, pytest.mark.cube]

# (method, path, releases that route it, where that was read). Anything else answers axum's
# empty 404 (unknown path) or 405 (known path, other method).
CUBE_ROUTES = [
    ("GET", "/snapshots?limit=1", {"0.3.0", "0.4.0", "0.5.0", "0.5.1", "0.6.0"}, "CubeAPI/src/routes.rs @6e482266"),
    ("GET", "/cubeapi/v1/cluster/versions", {"0.4.0", "0.5.0", "0.5.1"}, "CubeAPI/src/routes.rs @870a2463..a164417f"),
    ("GET", "/cubeapi/v1/auth/session", {"0.5.0", "0.5.1"}, "CubeAPI/src/routes.rs @30b4e25a build_auth_routes"),
    ("GET", "/templates/aliases/nothing-here", {"0.6.0"}, "CubeAPI/src/routes.rs @08f2f5d7"),
    ("PUT", "/sandboxes/no-such-sandbox/network", set(), "CubeAPI/src/routes.rs @b1b7ec65..08f2f5d7"),
    ("GET", "/sandboxes/no-such-sandbox/metrics", set(), "CubeAPI/src/routes.rs @b1b7ec65..08f2f5d7"),
    ("POST", "/v2/sandboxes", set(), "CubeAPI/src/routes.rs: GET only on every release"),
]


@pytest.fixture
def http(fake_cube_release: FakeHandle) -> Iterator[httpx.Client]:
    with fake_cube_release.http() as client:
        yield client


@pytest.mark.parametrize(("method", "path", "served", "source"), CUBE_ROUTES, ids=[r[1] for r in CUBE_ROUTES])
def test_each_release_routes_what_its_router_has(
    fake_cube_release: FakeHandle, http: httpx.Client, method: str, path: str, served: set[str], source: str
) -> None:
    answer = http.request(method, path, json={} if method != "GET" else None)
    missing = answer.status_code in (404, 405) and answer.content == b""
    assert missing != (fake_cube_release.cube_version in served), f"{method} {path}: {source}"


def _create(fake: FakeHandle, http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    answer = http.post("/sandboxes", json={"templateID": "base", "timeout": 300, **body})
    assert answer.status_code in (200, 201), answer.text
    sandbox_id = answer.json()["sandboxID"]
    try:
        rows = [row for row in fake.state()["sandboxes"] if row["sandboxID"] == sandbox_id]
        return {**rows[0], "created": answer.json()}
    finally:
        http.delete(f"/sandboxes/{sandbox_id}")


def test_allow_public_traffic_meaning_per_release(fake_cube_release: FakeHandle, http: httpx.Client) -> None:
    # Before v0.5.0 allowPublicTraffic, when sent, overrides allow_internet_access as the egress
    # switch (CubeAPI/src/services/sandboxes.rs build_cubevs_context @b1b7ec65, @6e482266;
    # build_cube_network_config @870a2463) and nothing gates the public URL (no
    # AllowPublicTraffic in CubeMaster @870a2463). From v0.5.0 it is the inbound gate
    # (build_cube_network_config @30b4e25a; CubeMaster pkg/base/types/id2ip.go @30b4e25a).
    release = CUBE_RELEASES[fake_cube_release.cube_version]
    row = _create(fake_cube_release, http, {"allow_internet_access": False, "network": {"allowPublicTraffic": True}})
    assert row["egress"] is release.public_traffic_is_egress
    assert row["inbound"] is True
    row = _create(fake_cube_release, http, {"allow_internet_access": True, "network": {"allowPublicTraffic": False}})
    assert row["egress"] is not release.public_traffic_is_egress
    assert row["inbound"] is not release.inbound_gate
    assert bool(row["created"].get("trafficAccessToken")) is release.inbound_gate


def test_idle_pause_is_read_per_release(fake_cube_release: FakeHandle, http: httpx.Client) -> None:
    # Before v0.5.0 models NewSandbox parses autoPause and CreateSandboxRequest has no field for
    # it (services/sandboxes.rs create_sandbox @6e482266, @870a2463); from v0.5.0 only
    # `lifecycle` is read (models SandboxLifecycleConfig @30b4e25a, @08f2f5d7).
    release = CUBE_RELEASES[fake_cube_release.cube_version]
    flat = _create(fake_cube_release, http, {"autoPause": True, "autoResume": {"enabled": True}})
    assert (flat["autoPause"], flat["autoResume"]) == (False, False)
    nested = _create(fake_cube_release, http, {"lifecycle": {"onTimeout": "pause", "autoResume": True}})
    assert (nested["autoPause"], nested["autoResume"]) == (release.idle_from_lifecycle,) * 2


def test_l7_rules_per_release(fake_cube_release: FakeHandle, http: httpx.Client) -> None:
    # SandboxNetworkConfig.rules arrives in v0.4.0 (CubeAPI/src/models/mod.rs @870a2463); before,
    # serde drops the unknown field without a word (@6e482266).
    release = CUBE_RELEASES[fake_cube_release.cube_version]
    rule = {"name": "r1", "match": {"host": "api.example.test"}, "action": {"allow": True}}
    row = _create(fake_cube_release, http, {"allow_internet_access": True, "network": {"rules": [rule]}})
    assert bool(row["l7Rules"]) is release.l7_rules


def test_template_list_names_under_aliases_from_v060(fake_cube_release: FakeHandle, http: httpx.Client) -> None:
    # TemplateSummary.aliases (CubeAPI/src/models/mod.rs @08f2f5d7); absent before.
    release = CUBE_RELEASES[fake_cube_release.cube_version]
    rows = http.get("/templates").json()
    base = next(row for row in rows if row["templateID"] == "base")
    assert ("aliases" in base) is release.aliases


def test_infra_answers_a_missing_route_from_its_validator(fake_e2b_spec_server: FakeHandle) -> None:
    # e2b-dev/infra packages/api/main.go @54693ff: gin.New() with the OpenAPI validator as a
    # global middleware; utils.ErrorHandler (packages/api/internal/utils/error.go) answers
    # {"code": 404, "message": "validation error: <kin-openapi router reason>"}. The published
    # spec (spec/openapi.yml @54693ff) has GET /v2/sandboxes but no POST.
    with fake_e2b_spec_server.http() as http:
        create_v2 = http.post("/v2/sandboxes", json={})
        unknown = http.get("/no-such-operation")
        create_v1 = http.post("/sandboxes", json={})
    assert (create_v2.status_code, create_v2.json()) == (
        404,
        {"code": 404, "message": "validation error: method not allowed"},
    )
    assert (unknown.status_code, unknown.json()) == (
        404,
        {"code": 404, "message": "validation error: no matching operation was found"},
    )
    assert create_v1.status_code == 400  # the route exists and refuses a body without templateID
