"""pytest fixtures for the fake E2B/Cube server.

Load with ``pytest_plugins = ["tests.fakes.fixtures"]`` in tests/conftest.py.

- ``fake_e2b_server`` / ``fake_cube_server`` (session): one server per personality on a free
  loopback port, started on first use (E2B cloud; the newest Cube release).
  ``fake_e2b_spec_server`` (e2b-dev/infra's control plane, built from the published spec),
  ``fake_cube_05_server``, ``fake_cube_04_server`` and ``fake_cube_022_server`` (older Cube
  releases) likewise, and ``fake_cube_release`` once per Cube release; every container and snapshot image it created
  (labelled with the session's run id) is removed at the end of the session.
- ``fake_e2b`` / ``fake_cube`` (function): a ``FakeHandle`` on that server; faults set
  through it are cleared when the test ends. Sandboxes are not reset between tests, so
  module-scoped sandboxes can be shared (use ``fake_*_server`` for those).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import pytest
from docker.errors import DockerException

from sandboxes.backends.base import BackendConfig
from tests.fakes.e2b_server import FakeServer
from tests.fakes.fake_runtime import DEFAULT_IMAGE
from tests.fakes.fake_state import CUBE_VERSIONS, Personality

RUN_ID = "pytest-" + uuid.uuid4().hex[:10]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


class FakeHandle:
    """What a test needs from a running fake: SDK options, faults, state."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.personality = server.personality
        self.cube_version = server.cube_version
        self.e2b_api = server.e2b_api
        self.api_url = server.api_url
        self.sandbox_url = server.sandbox_url
        self.proxy_url = server.proxy_url
        self.domain = server.domain
        self.api_key = server.api_key
        self.run_id = server.run_id
        self._http = httpx.Client(base_url=server.api_url, timeout=30)

    def options(self, **overrides: Any) -> dict[str, Any]:
        """SDK keyword arguments: Sandbox.create(template, **fake.options())."""
        return {**self.server.connection_options(), **overrides}

    def backend_config(self, kind: str | None = None, **options: str) -> BackendConfig:
        """A BackendConfig pointing the E2B/Cube adapter at this fake: control plane at
        `endpoint`, envd at `options["sandbox_url"]` (E2B: one URL routed by header; Cube: the
        CubeProxy address, routed by Host), loopback allowed through the guarded transport."""
        return BackendConfig(
            kind=kind or self.personality,
            endpoint=self.api_url,
            domain=self.domain,
            api_key=self.api_key,
            allow_private_endpoints=True,
            options={"sandbox_url": self.proxy_url, **options},
        )

    def platform_fields(self, **overrides: Any) -> dict[str, Any]:
        """make_config/make_backend keywords for a platform backend on this fake: its kind,
        control plane, domain and key, loopback allowed; `overrides` (sandbox_url, ...) on top."""
        return {
            "kind": self.personality,
            "endpoint": self.api_url,
            "domain": self.domain,
            "api_key": self.api_key,
            "allow_private_endpoints": True,
            **overrides,
        }

    def _admin(self, method: str, path: str, json: Any = None) -> Any:
        r = self._http.request(method, f"/_fake/{path}", json=json)
        r.raise_for_status()
        return r.json() if r.content else None

    def set_fault(self, kind: str = "status", **fields: Any) -> list[dict[str, Any]]:
        """Inject a fault, e.g. ``set_fault("status", status=429, path="/v2/sandboxes$")``,
        ``set_fault("latency", delay=0.5)``, ``set_fault("repeat_token")``,
        ``set_fault("drop_stream", after_events=1)``. See fake_state.Fault."""
        result: list[dict[str, Any]] = self._admin("POST", "faults", {"kind": kind, **fields})
        return result

    def clear_faults(self) -> None:
        self._admin("DELETE", "faults")

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self._admin("GET", "state")
        return result

    def configure(self, **settings: Any) -> None:
        """``cube_pause_seconds`` (async Cube pause), ``resume_failures`` (Cube 503s) and
        ``new_id_on_resume`` (the next n resumes through connect answer a new sandbox id)."""
        self._admin("POST", "config", settings)

    def force_state(self, sandbox_id: str, state: str) -> None:
        self._admin("POST", f"sandboxes/{sandbox_id}/state", {"state": state})

    def expire(self, sandbox_id: str) -> None:
        """Run the sandbox's TTL out now; the reaper pauses or kills it within ~0.2 s."""
        self._admin("POST", f"sandboxes/{sandbox_id}/expire")

    def requests(self) -> list[tuple[str, str, str]]:
        """(plane, method, path) of the requests since `forget_requests`."""
        return [tuple(r) for r in self._admin("GET", "requests")]

    def forget_requests(self) -> None:
        self._admin("DELETE", "requests")

    def reset(self) -> None:
        self._admin("POST", "reset")

    def http(self) -> httpx.Client:
        """A raw client on the fake (for what the SDK hides: headers, Cube-only routes)."""
        return httpx.Client(base_url=self.api_url, headers={"X-API-Key": self.api_key}, timeout=60)

    def close(self) -> None:
        self._http.close()


def _start(personality: Personality, **versions: str) -> FakeServer:
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        client.images.get(DEFAULT_IMAGE)
        client.close()
    except DockerException as e:
        problem = f"the fake {personality} server needs Docker and {DEFAULT_IMAGE}: {e}"
        # Same policy as tests/conftest.py: a missing service skips locally, fails in CI.
        if IN_CI:
            pytest.fail(f"[CI] {problem}", pytrace=False)
        pytest.skip(problem)
    suffix = "".join(f"-{v}" for v in versions.values()).replace(".", "")
    server = FakeServer(personality, run_id=f"{RUN_ID}-{personality}{suffix}", **versions)  # type: ignore[arg-type]
    return server.start()


def _serve(personality: Personality, **versions: str) -> Iterator[FakeHandle]:
    server = _start(personality, **versions)
    handle = FakeHandle(server)
    yield handle
    handle.close()
    server.stop()


@pytest.fixture(scope="session")
def fake_e2b_server() -> Iterator[FakeHandle]:
    yield from _serve("e2b")


@pytest.fixture(scope="session")
def fake_e2b_spec_server() -> Iterator[FakeHandle]:
    """An E2B control plane built from e2b-dev/infra's published spec (no SDK /v2 create or
    connect)."""
    yield from _serve("e2b", e2b_api="spec")


@pytest.fixture(scope="session")
def fake_cube_server() -> Iterator[FakeHandle]:
    """The newest Cube release (fake_state.LATEST_CUBE)."""
    yield from _serve("cube")


@pytest.fixture(scope="session")
def fake_cube_05_server() -> Iterator[FakeHandle]:
    yield from _serve("cube", cube_version="0.5.1")


@pytest.fixture(scope="session")
def fake_cube_04_server() -> Iterator[FakeHandle]:
    yield from _serve("cube", cube_version="0.4.0")


@pytest.fixture(scope="session")
def fake_cube_022_server() -> Iterator[FakeHandle]:
    yield from _serve("cube", cube_version="0.2.2")


@pytest.fixture(scope="session", params=CUBE_VERSIONS)
def fake_cube_release(request: pytest.FixtureRequest) -> Iterator[FakeHandle]:
    """One server per Cube release (fake_state.CUBE_RELEASES), each test run on every one."""
    yield from _serve("cube", cube_version=request.param)


@pytest.fixture
def fake_e2b(fake_e2b_server: FakeHandle) -> Iterator[FakeHandle]:
    yield fake_e2b_server
    fake_e2b_server.clear_faults()


@pytest.fixture
def fake_cube(fake_cube_server: FakeHandle) -> Iterator[FakeHandle]:
    yield fake_cube_server
    fake_cube_server.clear_faults()
    fake_cube_server.configure(cube_pause_seconds=0, resume_failures=0)
