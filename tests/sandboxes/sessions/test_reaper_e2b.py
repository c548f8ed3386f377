"""The reaper on an E2B config pointed at the fake server, which hands out a repeating page
token: the pass must stop with the error reported, delete only real orphans, and never loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from sandboxes.backends.base import (
    META_INSTALLATION,
    META_SESSION,
    ErrorKind,
    ListQuery,
    NetworkSpec,
    RemoteError,
    SandboxSpec,
)
from sandboxes.catalog.bridge import console_metadata, get_backend
from sandboxes.models import PlatformBackend, SandboxConfig
from sandboxes.sessions.reaper import reap_config
from sandboxes.sessions.store import Binding, MemorySessionStore, binding_key, now_iso
from tests.factories import make_config
from tests.fakes.fixtures import FakeHandle
from tests.personas import World

pytestmark = [pytest.mark.django_db, pytest.mark.docker, pytest.mark.e2b]


@pytest.fixture
def config(world: World, fake_e2b: FakeHandle, settings: Any, test_run_id: str) -> Iterator[SandboxConfig]:
    settings.CONSOLE_INSTALLATION_ID = f"test-reaper-e2b-{test_run_id}"
    cfg: SandboxConfig = make_config(world.space_a, **fake_e2b.platform_fields(), default_template="base")
    try:
        yield cfg
    finally:
        fake_e2b.clear_faults()
        backend = get_backend(cfg)
        for info in backend.iter_sandboxes(ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})):
            backend.delete(info.sandbox_id)


def plant(config: SandboxConfig, session_key: str) -> str:
    info = get_backend(config).create(
        SandboxSpec(
            template_id=config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata={**console_metadata(config), META_SESSION: session_key},
        )
    )
    return info.sandbox_id


def exists(config: SandboxConfig, sandbox_id: str) -> bool:
    try:
        get_backend(config).get(sandbox_id)
    except RemoteError as exc:
        if exc.kind != ErrorKind.NOT_FOUND:
            raise
        return False
    return True


def test_reaper_survives_a_repeating_page_token(fake_e2b: FakeHandle, config: SandboxConfig) -> None:
    store = MemorySessionStore()
    bound = plant(config, "reaper-e2b-bound")
    store.set_binding_if_absent(
        binding_key(config.space_id, "reaper-e2b-bound"),
        Binding(sandbox_id=bound, version=1, config_id=str(config.id), created=now_iso()),
    )
    orphan = plant(config, "reaper-e2b-orphan")
    fake_e2b.set_fault("repeat_token")

    young = reap_config(config, store, grace=timedelta(hours=1))
    assert any("repeated page token" in error for error in young.errors), young.errors
    assert young.deleted == []
    assert exists(config, bound)
    assert exists(config, orphan)

    report = reap_config(config, store, grace=timedelta(0))
    assert any("repeated page token" in error for error in report.errors), report.errors
    # Only the orphan may go, and only once; the bound sandbox stays.
    assert report.deleted == [orphan]
    assert exists(config, bound)
    assert not exists(config, orphan)


def test_idle_sweep_leaves_e2b_to_its_own_auto_pause(world: World, fake_e2b: FakeHandle, config: SandboxConfig) -> None:
    import time

    from django.utils import timezone

    from sandboxes.backends.base import SandboxState
    from sandboxes.models import Session, SessionState
    from sandboxes.sessions.reaper import idle_sweep
    from sandboxes.sessions.runtime import Runtime

    PlatformBackend.objects.filter(pk=config.backend_id).update(sandbox_url=fake_e2b.sandbox_url)
    SandboxConfig.objects.filter(pk=config.pk).update(is_default=True)
    config.refresh_from_db()
    runtime = Runtime(MemorySessionStore())
    resolved = runtime.resolve(world.space_a, "e2b-idle")
    Session.objects.filter(pk=resolved.session.pk).update(last_activity=timezone.now() - timedelta(hours=2))

    # Idle past the config's timeout, but the backend has not paused it: the console does not either.
    assert idle_sweep(runtime) == 0
    assert get_backend(config).get(resolved.sandbox.sandbox_id).state == SandboxState.RUNNING

    fake_e2b.expire(resolved.sandbox.sandbox_id)  # the TTL runs out; autoPause was sent at create
    deadline = time.monotonic() + 5
    while get_backend(config).get(resolved.sandbox.sandbox_id).state != SandboxState.PAUSED:
        assert time.monotonic() < deadline, "the fake did not auto-pause"
        time.sleep(0.1)
    assert idle_sweep(runtime) == 1
    resolved.session.refresh_from_db()
    assert resolved.session.state == SessionState.PAUSED
    back = runtime.resolve(world.space_a, "e2b-idle")
    assert back.sandbox.state == SandboxState.RUNNING


def test_config_page_does_not_call_the_e2b_workspace_unsupported(world: World, config: SandboxConfig) -> None:
    page = world.client_for("alice").get(config.get_absolute_url()).content.decode()
    assert 'id="workspace-unsupported"' not in page  # E2B keeps /workspace on a team volume
    assert 'id="workspace-host-root"' not in page  # a Cube setting
