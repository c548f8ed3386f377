"""The runtime's bind and the network policy: a policy saved while a session's sandbox is
being made (its spec already read, its sandbox not bound yet) skips that session in its live
pass, so the bind itself brings the new sandbox to the policy in force. Checked on the
engine (the container's networks), not on the session row alone."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.catalog import network as catalog_network
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.network import network_spec_for, spec_fingerprint
from sandboxes.models import Session
from sandboxes.sessions import runtime as runtime_module
from sandboxes.sessions.runtime import Runtime
from tests.factories import set_policy
from tests.personas import World
from tests.sandboxes.network.test_live_docker import require_live_egress

pytestmark = [pytest.mark.docker, pytest.mark.django_db(transaction=True)]


def space_networks(config: Any, sandbox_id: str) -> list[str]:
    backend = get_backend(config)
    assert isinstance(backend, DockerBackend)
    return [n for n in backend.engine.networks_of(sandbox_id) if backend.networks.is_space_network(n)]


def test_outbound_turned_off_during_a_create_is_off_once_bound(
    world: World, session_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_live_egress(session_config)
    set_policy(world.space_a, allow_out=["pkgs.test"])
    read = catalog_network.network_spec_for
    turned: list[bool] = []

    def spec_then_policy_off(*args: Any, **kwargs: Any) -> Any:
        spec = read(*args, **kwargs)
        if not turned:  # the admin saves "outbound off" right after the create read the spec
            turned.append(True)
            set_policy(world.space_a, allow_internet_access=False)
        return spec

    monkeypatch.setattr(runtime_module, "network_spec_for", spec_then_policy_off)
    session = Runtime().resolve(world.space_a, "mid-create").session
    assert turned
    row = Session.objects.get(pk=session.pk)
    assert space_networks(session_config, row.sandbox_id) == [], "the sandbox kept its outbound network"
    assert row.policy_fingerprint == spec_fingerprint(network_spec_for(world.space_a, row))
