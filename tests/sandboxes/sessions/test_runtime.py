"""The session runtime against the real Docker engine and real Redis servers."""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

import pytest
from django.db import connections

from console.services import SYSTEM
from sandboxes.backends.base import META_INSTALLATION, META_SESSION, ExecRequest, ListQuery, SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.services import mark_space_stale
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import Binding, RedisSessionStore, SessionStoreUnavailable
from tests.conftest import REDIS_URL
from tests.personas import World
from tests.support import terminal_support
from tests.support.terminal_support import RedisServer

# A private Redis server the test may stop and restart (fails in CI without redis-server).
own_redis = terminal_support.own_redis


# The stores' own semantics: tests/sandboxes/sessions/test_store_conformance.py (every store).


# --- The runtime on Docker ------------------------------------------------------------------


@pytest.fixture
def docker_session_config(session_config: SandboxConfig) -> SandboxConfig:
    return session_config


@pytest.fixture
def installation(session_config: SandboxConfig, settings: Any) -> str:
    """The installation id the session_config fixture set (and sweeps on teardown)."""
    return str(settings.CONSOLE_INSTALLATION_ID)


def sandboxes_of(config: SandboxConfig, key: str) -> list[str]:
    """Sandboxes on the engine carrying this installation's metadata for session `key`."""
    from django.conf import settings

    query = ListQuery(metadata={META_SESSION: key, META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
    return [info.sandbox_id for info in get_backend(config).iter_sandboxes(query)]


def run(runtime: Runtime, session: Session, shell: str, user: str = "user") -> tuple[int, str]:
    result = runtime.exec(session, ExecRequest(shell=shell, user=user, timeout_s=30))
    return result.exit_code, (result.stdout + result.stderr).decode()


pytestmark = [pytest.mark.docker, pytest.mark.redis]


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(RedisSessionStore(REDIS_URL))


@pytest.mark.django_db
def test_resolve_creates_once_then_binds_and_resumes(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-basic")
    assert first.action == "created"
    again = runtime.resolve(world.space_a, "s-basic")
    assert again.action == "bound"
    assert again.sandbox.sandbox_id == first.sandbox.sandbox_id
    runtime.pause(first.session, actor=SYSTEM)
    assert get_backend(docker_session_config).get(first.sandbox.sandbox_id).state == SandboxState.PAUSED
    resumed = runtime.resolve(world.space_a, "s-basic")
    assert resumed.sandbox.state == SandboxState.RUNNING
    assert resumed.sandbox.sandbox_id == first.sandbox.sandbox_id
    assert run(runtime, first.session, "id -u") == (0, "1000\n")
    assert sandboxes_of(docker_session_config, "s-basic") == [first.sandbox.sandbox_id]


@pytest.mark.django_db
def test_a_gone_sandbox_is_replaced_and_keeps_the_workspace(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-gone")
    assert run(runtime, first.session, "echo kept > /workspace/notes.txt")[0] == 0
    get_backend(docker_session_config).delete(first.sandbox.sandbox_id)
    second = runtime.resolve(world.space_a, "s-gone")
    assert second.sandbox.sandbox_id != first.sandbox.sandbox_id
    assert second.binding.version == first.binding.version + 1
    assert run(runtime, second.session, "cat /workspace/notes.txt") == (0, "kept\n")


@pytest.mark.django_db
def test_rebuild_keeps_workspace_files_when_persistence_is_on(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-rebuild")
    run(runtime, first.session, "mkdir -p /workspace/proj && echo 42 > /workspace/proj/answer")
    rebuilt = runtime.rebuild(first.session, actor=SYSTEM)
    assert rebuilt.sandbox.sandbox_id != first.sandbox.sandbox_id
    assert run(runtime, first.session, "cat /workspace/proj/answer") == (0, "42\n")
    assert sandboxes_of(docker_session_config, "s-rebuild") == [rebuilt.sandbox.sandbox_id]


@pytest.mark.django_db
def test_without_persistence_a_rebuild_starts_clean(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    SandboxConfig.objects.filter(pk=docker_session_config.pk).update(persistent_workspace=False)
    docker_session_config.refresh_from_db()
    first = runtime.resolve(world.space_a, "s-ephemeral")
    run(runtime, first.session, "echo gone > /workspace/x")
    runtime.rebuild(first.session, actor=SYSTEM)
    assert run(runtime, first.session, "test -e /workspace/x; echo $?") == (0, "1\n")


# --- Turn lease scenarios -----------------------------------------------------------------


@pytest.mark.django_db
def test_stale_without_a_turn_rebuilds_at_once(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-stale-now")
    mark_space_stale(world.space_a)
    second = runtime.resolve(world.space_a, "s-stale-now")
    assert second.action == "rebuilt"
    assert second.sandbox.sandbox_id != first.sandbox.sandbox_id
    assert runtime.resolve(world.space_a, "s-stale-now").action == "bound"  # fresh now


@pytest.mark.django_db
def test_first_resolve_of_a_turn_rebuilds_and_later_ones_keep(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-turn")
    mark_space_stale(world.space_a)
    runtime.begin_turn(first.session)
    rebuilt = runtime.resolve(world.space_a, "s-turn")
    assert rebuilt.action == "rebuilt"
    mark_space_stale(world.space_a)  # stale again, mid-turn
    kept = runtime.resolve(world.space_a, "s-turn")
    assert kept.action == "bound"
    assert kept.sandbox.sandbox_id == rebuilt.sandbox.sandbox_id


@pytest.mark.django_db
def test_stale_mid_turn_waits_for_the_next_turn(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-midturn")
    runtime.begin_turn(first.session)
    assert runtime.resolve(world.space_a, "s-midturn").action == "bound"  # consumes the ticket
    mark_space_stale(world.space_a)
    assert runtime.resolve(world.space_a, "s-midturn").sandbox.sandbox_id == first.sandbox.sandbox_id
    runtime.end_turn(first.session)
    runtime.begin_turn(first.session)
    assert runtime.resolve(world.space_a, "s-midturn").action == "rebuilt"


@pytest.mark.django_db
def test_an_unreadable_lease_means_a_turn_is_in_flight(
    world: World, docker_session_config: SandboxConfig, own_redis: RedisServer
) -> None:
    runtime = Runtime(RedisSessionStore(own_redis.url, timeout_s=0.5))
    resolved = runtime.resolve(world.space_a, "s-unreadable")
    mark_space_stale(world.space_a)
    resolved.session.refresh_from_db()
    own_redis.stop()
    assert runtime.rebuild_allowed(resolved.session, resolved.binding.created_at) is False
    own_redis.start()


# --- Concurrency, store failures and crashes ------------------------------------------------


def _resolve_in_child(url: str, space_id: str, key: str, threads: int, out: Any) -> None:
    connections.close_all()  # never share the parent's database sockets
    from console.models import Space

    space = Space.objects.get(pk=space_id)
    results: list[str] = []
    errors: list[str] = []

    def work() -> None:
        try:
            results.append(Runtime(RedisSessionStore(url)).resolve(space, key).sandbox.sandbox_id)
        except Exception as exc:
            errors.append(f"{exc.__class__.__name__}: {exc}")
        finally:
            connections.close_all()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    out.put((results, errors))


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_resolves_from_several_processes_create_one_sandbox(
    world: World, docker_session_config: SandboxConfig
) -> None:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    connections.close_all()
    children = [
        context.Process(target=_resolve_in_child, args=(REDIS_URL, str(world.space_a.id), "s-herd", 10, out))
        for _ in range(5)
    ]
    for child in children:
        child.start()
    collected = [out.get(timeout=240) for _ in children]
    for child in children:
        child.join(timeout=30)
    ids = [sandbox for results, _ in collected for sandbox in results]
    errors = [error for _, errs in collected for error in errs]
    assert not errors, errors[:3]
    assert len(ids) == 50
    assert len(set(ids)) == 1
    assert sandboxes_of(docker_session_config, "s-herd") == ids[:1]


class StopRedisBeforeBinding(RedisSessionStore):
    """A real Redis store whose server is killed just before the binding is written."""

    def __init__(self, server: RedisServer) -> None:
        super().__init__(server.url, timeout_s=0.5)
        self.server = server

    def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
        self.server.stop()
        return super().set_binding_if_absent(key, binding)


@pytest.mark.django_db
def test_redis_lost_mid_resolve_then_back_empty_claims_instead_of_creating(
    world: World, docker_session_config: SandboxConfig, own_redis: RedisServer
) -> None:
    with pytest.raises(SessionStoreUnavailable, match="session store unavailable"):
        Runtime(StopRedisBeforeBinding(own_redis)).resolve(world.space_a, "s-redis-lost")
    created = sandboxes_of(docker_session_config, "s-redis-lost")
    assert len(created) == 1  # the sandbox exists, unbound; no duplicate
    own_redis.start()  # back, with its data lost
    recovered = Runtime(RedisSessionStore(own_redis.url)).resolve(world.space_a, "s-redis-lost")
    assert recovered.action == "claimed"
    assert recovered.sandbox.sandbox_id == created[0]
    assert sandboxes_of(docker_session_config, "s-redis-lost") == created


def _crash_after_create(url: str, space_id: str, key: str) -> None:
    connections.close_all()
    from console.models import Space

    class CrashBeforeBinding(RedisSessionStore):
        def set_binding_if_absent(self, key: str, binding: Binding) -> bool:
            os._exit(17)  # the process dies between create and binding write

    Runtime(CrashBeforeBinding(url), lock_ttl_ms=1500).resolve(Space.objects.get(pk=space_id), key)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_crash_between_create_and_binding_is_recovered_by_claim(
    world: World, docker_session_config: SandboxConfig
) -> None:
    connections.close_all()
    child = multiprocessing.get_context("fork").Process(
        target=_crash_after_create, args=(REDIS_URL, str(world.space_a.id), "s-crash")
    )
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 17
    orphan = sandboxes_of(docker_session_config, "s-crash")
    assert len(orphan) == 1
    # The crashed holder's lock lease runs out; the next resolve claims the orphan.
    recovered = Runtime(RedisSessionStore(REDIS_URL), lock_ttl_ms=1500).resolve(world.space_a, "s-crash")
    assert recovered.action == "claimed"
    assert recovered.sandbox.sandbox_id == orphan[0]


@pytest.mark.django_db
def test_duplicates_found_by_metadata_are_deleted_oldest_wins(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    first = runtime.resolve(world.space_a, "s-dupes")
    # Lose the binding and plant a second sandbox with the same session metadata.
    runtime.store.delete_binding_if(runtime.keys(first.session)[0], first.binding)
    from sandboxes.backends.base import NetworkSpec, SandboxSpec

    extra = get_backend(docker_session_config).create(
        SandboxSpec(
            template_id=docker_session_config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata=Runtime.session_metadata(first.session),
        )
    )
    claimed = runtime.resolve(world.space_a, "s-dupes")
    assert claimed.action == "claimed"
    assert claimed.sandbox.sandbox_id == first.sandbox.sandbox_id
    assert sandboxes_of(docker_session_config, "s-dupes") == [first.sandbox.sandbox_id]
    assert extra.sandbox_id not in sandboxes_of(docker_session_config, "s-dupes")


@pytest.mark.django_db
def test_a_claimed_sandbox_gets_the_workspace_layout_a_cut_create_never_made(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    from sandboxes.backends.base import NetworkSpec, SandboxSpec
    from sandboxes.sessions.lookup import get_or_create_session

    session = get_or_create_session(world.space_a, "s-half-made")
    # What a create cut after the engine made the container leaves: console metadata, but
    # input/ still the session user's (the image's layout), no root-owned staging area.
    half_made = get_backend(docker_session_config).create(
        SandboxSpec(
            template_id=docker_session_config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata=Runtime.session_metadata(session),
        )
    )
    claimed = runtime.resolve(world.space_a, "s-half-made")
    assert claimed.action == "claimed"
    assert claimed.sandbox.sandbox_id == half_made.sandbox_id
    assert run(runtime, claimed.session, "stat -c '%u' /workspace/input") == (0, "0\n")
    assert run(runtime, claimed.session, "touch /workspace/input/planted")[0] != 0


@pytest.mark.django_db
def test_delete_removes_sandbox_binding_and_workspace(
    world: World, docker_session_config: SandboxConfig, runtime: Runtime
) -> None:
    resolved = runtime.resolve(world.space_a, "s-delete")
    volume = resolved.session.workspace_volume
    runtime.delete(resolved.session, actor=SYSTEM)
    assert sandboxes_of(docker_session_config, "s-delete") == []
    assert runtime.store.get_binding(runtime.keys(resolved.session)[0]) is None
    assert not Session.objects.filter(pk=resolved.session.pk).exists()
    import docker

    client = docker.from_env()
    with pytest.raises(docker.errors.NotFound):
        client.volumes.get(volume)
