"""The "Verify backend" job: the checklist through the contract on Docker, E2B and Cube.

Docker runs end to end (POST view -> job -> result); E2B and Cube run the same checklist on
an adapter pointed at the fake server (their SandboxConfig rows cannot carry the fake's
`sandbox_url` yet). Every check must pass or be `unsupported` with a reason, and nothing the
run made may be left behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from console.jobs import run_job
from console.models import AdminJob, AuditEvent, JobStatus
from sandboxes.backends.base import META_INSTALLATION, Backend, ListQuery
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.verify import FAIL, PASS, UNSUPPORTED, Check, Verifier
from sandboxes.models import SandboxConfig
from tests.factories import make_config
from tests.fakes.fixtures import FakeHandle
from tests.personas import World

CHECK_NAMES = [
    "snapshot_as_template",
    "snapshot_keeps_source",
    "pause_resume",
    "metadata_lists_back",
    "outbound_off",
    "data_plane_contract",
    "data_plane_agent",
    "paging_delete_echo",
]


def assert_clean_run(checks: list[Check] | list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rows = [c.as_json() if isinstance(c, Check) else c for c in checks]
    assert [row["name"] for row in rows] == CHECK_NAMES
    by_name = {row["name"]: row for row in rows}
    for row in rows:
        assert row["status"] in (PASS, UNSUPPORTED), row
        assert row["detail"], row
        assert row["ms"] >= 0
    return by_name


def leftovers(
    backend: Backend, metadata: dict[str, str], snapshots_before: set[str], *, snapshot_name: str | None = None
) -> tuple[list[str], set[str]]:
    """The sandboxes listed under `metadata`, and the snapshots made since `snapshots_before`
    (named `snapshot_name` where given: on the shared engine, other tests and runs make
    snapshots of their own meanwhile, and a snapshot's metadata labels are blanked)."""
    sandboxes = [info.sandbox_id for info in backend.iter_sandboxes(ListQuery(metadata=metadata))]
    capability = backend.snapshots()
    listed = capability.list() if capability else []
    snapshots = {s.snapshot_id for s in listed if snapshot_name in (None, s.name)} - snapshots_before
    return sandboxes, snapshots


@pytest.fixture
def docker_config(world: World, docker_base_image: str, settings: Any, test_run_id: str) -> Iterator[SandboxConfig]:
    settings.CONSOLE_INSTALLATION_ID = f"test-verify-{test_run_id}"
    config: SandboxConfig = make_config(world.space_a, default_template=docker_base_image)
    yield config
    get_backend(config).close()


@pytest.mark.django_db
@pytest.mark.docker
def test_verify_on_docker_end_to_end(world: World, docker_config: SandboxConfig, settings: Any) -> None:
    backend = get_backend(docker_config)
    snapshots = backend.snapshots()
    assert snapshots is not None
    before = {s.snapshot_id for s in snapshots.list()}
    url = reverse("sandboxes:config_verify", args=[docker_config.id])

    assert world.client_for("bob").post(url).status_code == 403  # members may not
    assert world.client_for("charlie").post(url).status_code == 404  # outsiders see nothing
    assert world.client_for("alice").get(url).status_code == 405
    response = world.client_for("alice").post(url)
    job = AdminJob.objects.get(kind="sandboxes.verify_backend")
    assert response.status_code == 302
    assert response["Location"] == job.get_absolute_url()
    assert job.params == {"config_id": str(docker_config.id)}
    assert AuditEvent.objects.filter(action="job.start", details__kind="sandboxes.verify_backend").count() == 1

    finished = run_job(str(job.id))
    assert finished is not None
    assert finished.status == JobStatus.SUCCEEDED, finished.error
    *contract, policy = finished.result["checks"]
    checks = assert_clean_run(contract)
    assert all(row["status"] == PASS for row in checks.values()), checks
    # The job ends with whether the backend can enforce the space's policy (closed here).
    assert (policy["name"], policy["status"]) == ("network_policy", PASS)
    assert finished.result["ok"] is True
    assert finished.result["summary"] == {PASS: 9, FAIL: 0, UNSUPPORTED: 0}
    assert "no default route" in checks["outbound_off"]["detail"]
    sandboxes, snapshots_left = leftovers(
        backend, {META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID}, before, snapshot_name="console-verify"
    )
    assert sandboxes == []
    assert snapshots_left == set()


def run_checklist(backend: Backend) -> tuple[dict[str, dict[str, Any]], Verifier]:
    installation = f"verify-{backend.kind}"
    snapshots = backend.snapshots()
    before = {s.snapshot_id for s in snapshots.list()} if snapshots else set()
    verifier = Verifier(backend, "base", {META_INSTALLATION: installation, "console-space": f"space-{backend.kind}"})
    checks = verifier.run()
    assert verifier.cleanup_errors == []
    by_name = assert_clean_run(checks)
    sandboxes, snapshots_left = leftovers(backend, {META_INSTALLATION: installation}, before)
    assert sandboxes == []
    assert snapshots_left == set()
    return by_name, verifier


@pytest.mark.docker
@pytest.mark.e2b
def test_verify_on_fake_e2b(fake_e2b: FakeHandle) -> None:
    backend = E2BBackend(fake_e2b.backend_config("e2b"))
    checks, _ = run_checklist(backend)
    assert all(row["status"] == PASS for row in checks.values()), checks
    backend.close()


@pytest.mark.docker
@pytest.mark.e2b
@pytest.mark.cube
def test_verify_on_fake_cube(fake_cube: FakeHandle) -> None:
    backend = CubeBackend(fake_cube.backend_config("cube"))
    checks, _ = run_checklist(backend)
    assert all(row["status"] == PASS for row in checks.values()), checks
    backend.close()


@pytest.mark.docker
@pytest.mark.e2b
@pytest.mark.cube
def test_verify_marks_what_an_old_cube_lacks_as_unsupported(fake_cube_server: FakeHandle) -> None:
    from tests.fakes.e2b_server import FakeServer

    server = FakeServer("cube", run_id=f"{fake_cube_server.run_id}-verify-may", cube_version="may").start()
    handle = FakeHandle(server)
    backend = CubeBackend(handle.backend_config("cube", cube_version="may"))
    try:
        checks, _ = run_checklist(backend)
        assert checks["snapshot_as_template"]["status"] == UNSUPPORTED
        assert "no snapshots" in checks["snapshot_as_template"]["detail"]
        assert checks["snapshot_keeps_source"]["status"] == UNSUPPORTED
        assert all(checks[name]["status"] == PASS for name in CHECK_NAMES[2:]), checks
    finally:
        backend.close()
        handle.close()
        server.stop()
