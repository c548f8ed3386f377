"""The Cube adapter on each CubeSandbox release the fake answers as (tests/fakes/fake_state.py
CUBE_RELEASES): the release it detects, the capabilities it advertises, and what reaches the
sandbox in the fake's state for each choice of the admin (the two network switches, idle
pause, L7 rules), not just the request's shape."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes.backends.base import ErrorKind, NetworkSpec, RemoteError, SandboxSpec, SandboxState, TemplateBuildSpec
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.e2b.common import parse_time
from sandboxes.catalog.network import PolicyConflict, refuse_unless_honoured
from tests.fakes.fake_state import CUBE_RELEASES, CubeRelease
from tests.fakes.fixtures import FakeHandle
from tests.support.backend_conformance import run

pytestmark = [pytest.mark.docker, pytest.mark.cube]

# What Test connection must record and name for each release the fake answers as.
EXPECTED = {
    "0.2.2": ("cube-0.2", "CubeSandbox v0.2.2:"),
    "0.3.0": ("cube-0.3", "CubeSandbox v0.3.0:"),
    "0.4.0": ("cube-0.4", "CubeSandbox v0.4.0:"),
    "0.5.0": ("cube-0.5", "CubeSandbox v0.5.0/v0.5.1:"),
    "0.5.1": ("cube-0.5", "CubeSandbox v0.5.0/v0.5.1:"),
    "0.6.0": ("cube-0.6", "CubeSandbox v0.6.0 or later:"),
}


@pytest.fixture
def cube(fake_cube_release: FakeHandle) -> Iterator[tuple[FakeHandle, CubeRelease, CubeBackend]]:
    """(the fake, the facts of its release, a fresh adapter that knows nothing of it yet)."""
    adapter = CubeBackend(fake_cube_release.backend_config("cube"))
    yield fake_cube_release, CUBE_RELEASES[fake_cube_release.cube_version], adapter
    adapter.close()


def _row(fake: FakeHandle, sandbox_id: str) -> dict[str, Any]:
    rows = [row for row in fake.state()["sandboxes"] if row["sandboxID"] == sandbox_id]
    assert rows, f"sandbox {sandbox_id} is gone"
    return rows[0]


def _spec(test_run_id: str, **overrides: Any) -> SandboxSpec:
    args: dict[str, Any] = {
        "template_id": "base",
        "network": NetworkSpec(allow_internet_access=False, allow_public_traffic=True),
        "metadata": {"test-run": test_run_id},
    }
    args.update(overrides)
    return SandboxSpec(**args)


def test_test_connection_names_the_release_and_its_capabilities(
    cube: tuple[FakeHandle, CubeRelease, CubeBackend],
) -> None:
    # v0.3.0 and v0.4.0 serve GET /snapshots, which was all the adapter asked: they were
    # recorded as v0.5+ (allowPublicTraffic read as inbound, idle pause believed).
    fake, facts, adapter = cube
    health = adapter.health()
    assert health.ok, health.detail
    protocol, name = EXPECTED[fake.cube_version]
    assert health.protocol == protocol
    assert health.version.startswith(name)
    words = health.version.split(": ", 1)[1].split(", ")
    assert ("inbound toggle" in words) == facts.inbound_gate
    assert ("idle pause" in words) == facts.idle_from_lifecycle
    assert ("L7 rules" in words) == facts.l7_rules
    assert ("snapshots" in words) == facts.snapshot_list
    assert "no metrics" in words
    assert "no network update" in words
    assert adapter.idles_itself() == facts.idle_from_lifecycle
    caps = adapter.network_capabilities()
    assert (caps.inbound_toggle, caps.l7_rules) == (facts.inbound_gate, facts.l7_rules)
    assert (adapter.snapshots() is not None) == facts.snapshot_list


@pytest.mark.parametrize("internet", [False, True], ids=["internet-off", "internet-on"])
@pytest.mark.parametrize("inbound", [False, True], ids=["inbound-off", "inbound-on"])
def test_each_switch_combination_reaches_the_sandbox_as_chosen(
    cube: tuple[FakeHandle, CubeRelease, CubeBackend], internet: bool, inbound: bool, test_run_id: str
) -> None:
    # On v0.3/v0.4 internet off with inbound on got internet, and internet on with inbound off
    # got none (allowPublicTraffic is their egress switch). Before v0.5.0 every sandbox's ports
    # are public: a policy keeping them private is refused in words before anything is made.
    fake, facts, adapter = cube
    network = NetworkSpec(allow_internet_access=internet, allow_public_traffic=inbound)
    info = adapter.create(_spec(test_run_id, network=network))
    try:
        row = _row(fake, info.sandbox_id)
        assert row["egress"] is internet
        assert row["inbound"] is (inbound or not facts.inbound_gate)
    finally:
        adapter.delete(info.sandbox_id)
    if inbound or facts.inbound_gate:
        refuse_unless_honoured(network, adapter, "per-release")
    else:
        with pytest.raises(PolicyConflict) as caught:
            refuse_unless_honoured(network, adapter, "per-release")
        assert "private sandbox ports" in caught.value.message


def test_idle_sandboxes_pause_where_the_release_forwards_it(
    cube: tuple[FakeHandle, CubeRelease, CubeBackend], test_run_id: str
) -> None:
    # v0.3/v0.4 parse autoPause but forward nothing: the adapter believed Cube paused idle
    # sandboxes and sent the TTL without its margin, so idle sessions died at the TTL.
    fake, facts, adapter = cube
    info = adapter.create(_spec(test_run_id, auto_pause=True, auto_resume=True, timeout_s=600))
    try:
        row = _row(fake, info.sandbox_id)
        if not facts.idle_from_lifecycle:
            assert not adapter.idles_itself()  # the console's idle sweep pauses these
            assert (row["autoPause"], row["autoResume"]) == (False, False)
            assert parse_time(row["endAt"]).timestamp() - time.time() > 600 + 600  # type: ignore[union-attr]
            return
        assert adapter.idles_itself()
        assert (row["autoPause"], row["autoResume"]) == (True, True)
        fake.expire(info.sandbox_id)
        deadline = time.monotonic() + 10
        while adapter.get(info.sandbox_id).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the TTL did not pause the sandbox"
            time.sleep(0.1)
        assert run(adapter, info.sandbox_id, "echo resumed") == "resumed\n"
    finally:
        adapter.delete(info.sandbox_id)


def test_l7_rules_reach_the_proxy_or_are_refused(
    cube: tuple[FakeHandle, CubeRelease, CubeBackend], test_run_id: str
) -> None:
    # v0.3.0 has no `rules` field: the rules were advertised, sent and silently dropped.
    fake, facts, adapter = cube
    network = NetworkSpec.parse(
        allow_internet_access=True,
        allow_public_traffic=True,
        l7_rules=("allow api.example.test GET /v1/",),
    )
    if not facts.l7_rules:
        with pytest.raises(RemoteError) as caught:
            adapter.create(_spec(test_run_id, network=network))
        assert caught.value.kind == ErrorKind.UNSUPPORTED
        return
    info = adapter.create(_spec(test_run_id, network=network))
    try:
        assert _row(fake, info.sandbox_id)["l7Rules"], "the rules did not reach the sandbox's proxy"
    finally:
        adapter.delete(info.sandbox_id)


def test_stats_say_the_release_does_not_report(cube: tuple[FakeHandle, CubeRelease, CubeBackend]) -> None:
    # CubeAPI has no metrics route: the stats card showed "unsupported (HTTP 404)".
    fake, _facts, adapter = cube
    assert adapter.stats() is None
    with fake.http() as http:
        answer = http.get("/sandboxes/anything/metrics")
    assert (answer.status_code, answer.content) == (404, b"")


def test_templates_are_created_and_named_on_every_release(
    cube: tuple[FakeHandle, CubeRelease, CubeBackend], docker_base_image: str
) -> None:
    # v0.2.2 requires the caller's templateID; v0.6.0 lists names under `aliases`, which the
    # adapter did not read (names fell back to ids).
    _fake, facts, adapter = cube
    templates = adapter.templates()
    assert templates is not None
    template = templates.create(TemplateBuildSpec(name="per-release", labels={"image": docker_base_image}))
    try:
        assert template.template_id.startswith("tpl-")
        listed = {t.template_id: t.name for t in templates.list()}
        assert template.template_id in listed
        if facts.aliases:
            assert listed[template.template_id] == "per-release"
    finally:
        templates.delete(template.template_id)
