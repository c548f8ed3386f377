"""Live policy changes on the real Docker engine, written against the contract
(`Backend.egress()`, `NetworkCapabilities.live_update`, `EgressCapability.update/refusals`).

These need the Docker adapter's EgressCapability (its nftables/dnsmasq component).
Until it advertises `live_update`, they skip outside CI and FAIL under CI=true, like a
missing service (tests/conftest.py): a CI run must not pass without them.

No traffic is sent: the console's part is that a committed change reaches every running
sandbox of the space through `update` within 5 s, audited, with the session's policy
version recorded, and that refusals read back land in the log. What the packet filter does
with the spec is tested by the adapter's own tests.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from console.models import AuditEvent
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.network import network_spec_for, spec_fingerprint
from sandboxes.models import EgressCursor, Session
from sandboxes.network.live import sessions_keeping_old_rules
from sandboxes.network.log import ingest_backend
from sandboxes.sessions.runtime import Runtime
from tests.conftest import IN_CI
from tests.factories import set_policy
from tests.personas import World

pytestmark = pytest.mark.docker


def require_live_egress(config: Any) -> None:
    backend = get_backend(config)
    if backend.egress() is not None and backend.network_capabilities().live_update:
        return
    message = "the Docker backend does not offer EgressCapability with live_update"
    if IN_CI:
        pytest.fail(f"[CI] {message}", pytrace=False)
    pytest.skip(message)


@pytest.mark.django_db(transaction=True)
def test_a_policy_change_reaches_running_sandboxes_within_5_s(world: World, session_config: Any) -> None:
    require_live_egress(session_config)
    set_policy(world.space_a, allow_out=["pypi.org"])
    runtime = Runtime()
    sessions = [runtime.resolve(world.space_a, f"live-{n}").session for n in range(2)]
    started = time.monotonic()
    set_policy(world.space_a, allow_out=["pypi.org", "files.example"])  # applied once committed
    deadline = started + 5
    while time.monotonic() < deadline and sessions_keeping_old_rules(world.space_a):
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    assert sessions_keeping_old_rules(world.space_a) == [], f"still on old rules after {elapsed:.1f} s"
    for session in sessions:
        session.refresh_from_db()
        assert session.policy_fingerprint == spec_fingerprint(network_spec_for(world.space_a, session))
    applied = AuditEvent.objects.filter(action="network_policy.apply").latest("time")
    assert sorted(applied.details["applied"]) == ["live-0", "live-1"]
    # The sandboxes are the same ones: no recreate, no lost session.
    for session in sessions:
        assert Session.objects.get(pk=session.pk).sandbox_id == session.sandbox_id


@pytest.mark.django_db(transaction=True)
def test_refusals_read_back_keep_a_cursor(world: World, session_config: Any) -> None:
    require_live_egress(session_config)
    assert ingest_backend(session_config.backend) >= 0
    assert EgressCursor.objects.filter(backend=session_config.backend).exists()  # the next read starts there


@pytest.mark.django_db(transaction=True)
def test_a_session_the_live_pass_missed_is_caught_up_by_the_periodic_pass(
    world: World, session_config: Any, tuned: Any
) -> None:
    """Outbound turned off, and the pass ran out of its budget before the session: the next
    periodic pass takes the sandbox off its network (the engine's view, not the row's)."""
    from sandboxes.backends.docker.backend import DockerBackend
    from sandboxes.network.live import catch_up

    require_live_egress(session_config)
    set_policy(world.space_a, allow_out=["pkgs.test"])
    session = Runtime().resolve(world.space_a, "missed").session
    tuned({"network.apply_budget_s": 0})
    set_policy(world.space_a, allow_internet_access=False)
    backend = get_backend(session_config)
    assert isinstance(backend, DockerBackend)

    def on_space_network() -> list[str]:
        return [n for n in backend.engine.networks_of(session.sandbox_id) if backend.networks.is_space_network(n)]

    assert on_space_network(), "the live pass was meant to miss it"
    catch_up()
    assert on_space_network() == []
    assert sessions_keeping_old_rules(world.space_a) == []
