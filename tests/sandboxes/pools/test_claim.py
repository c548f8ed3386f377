"""Warm pools on the real Docker engine, Redis and the database: a pool fills, a new
session's first resolve takes a ready sandbox made its own (workspace, labels by row, network
spec), two sessions never get one sandbox, a claim whose bind never came is taken back, and
an emptied store loses nothing."""

from __future__ import annotations

import multiprocessing
import os
import threading
from datetime import timedelta

import pytest
from django.db import connections

from sandboxes.backends.base import META_INSTALLATION, META_POOL, ExecRequest, ListQuery
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import MemberState, PoolClaim, PoolMember, SandboxConfig, Session
from sandboxes.pools.claim import take
from sandboxes.pools.keeper import refill
from sandboxes.sessions.lookup import get_or_create_session
from sandboxes.sessions.reaper import reap_all
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from tests.conftest import REDIS_URL
from tests.personas import World

pytestmark = [pytest.mark.docker, pytest.mark.redis]


@pytest.fixture
def runtime() -> Runtime:
    return Runtime(RedisSessionStore(REDIS_URL))


@pytest.fixture
def pooled(session_config: SandboxConfig) -> SandboxConfig:
    SandboxConfig.objects.filter(pk=session_config.pk).update(pool_size=2)
    session_config.pool_size = 2
    return session_config


def pool_sandboxes(config: SandboxConfig) -> set[str]:
    """Sandboxes on the engine carrying a pool label of this installation."""
    from django.conf import settings

    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
    return {i.sandbox_id for i in get_backend(config).iter_sandboxes(query) if i.metadata.get(META_POOL)}


def ready_ids(config: SandboxConfig) -> set[str]:
    return set(PoolMember.objects.filter(config=config, state=MemberState.READY).values_list("sandbox_id", flat=True))


@pytest.mark.django_db
def test_a_new_session_takes_a_ready_sandbox_with_its_own_workspace(
    world: World, pooled: SandboxConfig, runtime: Runtime
) -> None:
    report = refill(pooled)
    assert len(report.made) == 2, report
    ready = ready_ids(pooled)
    assert ready == set(report.made) == pool_sandboxes(pooled)

    resolved = runtime.resolve(world.space_a, "pool-1")
    assert resolved.action == "pooled"
    assert resolved.sandbox.sandbox_id in ready
    member = PoolMember.objects.get(sandbox_id=resolved.sandbox.sandbox_id)
    assert member.state == MemberState.CLAIMED
    assert member.session_id == resolved.session.pk
    session = Session.objects.get(pk=resolved.session.pk)
    # The pooled sandbox's persistent /workspace is the session's now (deleted with it).
    assert session.has_persistent_workspace
    assert session.workspace_volume == member.workspace_volume
    assert session.sandbox_id == resolved.sandbox.sandbox_id
    assert session.policy_fingerprint == member.policy_fingerprint
    # Laid out when it was made: input/ read-only to the session's user, output/ its own.
    result = runtime.exec(session, ExecRequest(shell="id -u; touch output/x && ls; touch input/y", timeout_s=30))
    out = result.stdout.decode()
    assert out.splitlines()[0] == "1000"
    assert "input" in out
    assert "output" in out
    assert result.exit_code != 0  # input/ refused the session's user
    again = runtime.resolve(world.space_a, "pool-1")
    assert again.action == "bound"
    assert again.sandbox.sandbox_id == resolved.sandbox.sandbox_id
    assert PoolClaim.objects.filter(config=pooled, hit=True).count() == 1

    # The pool tops itself up; a second session takes the other ready one.
    assert len(refill(pooled).made) == 1
    second = runtime.resolve(world.space_a, "pool-2")
    assert second.action == "pooled"
    assert second.sandbox.sandbox_id != resolved.sandbox.sandbox_id


@pytest.mark.django_db
def test_a_resolve_that_finds_the_pool_empty_creates_and_says_why(
    world: World, pooled: SandboxConfig, runtime: Runtime
) -> None:
    resolved = runtime.resolve(world.space_a, "pool-empty")
    assert resolved.action == "created"
    miss = PoolClaim.objects.get(config=pooled)
    assert not miss.hit
    assert "no ready sandbox" in miss.reason


@pytest.mark.django_db(transaction=True)
def test_two_sessions_never_get_one_sandbox(world: World, session_config: SandboxConfig, runtime: Runtime) -> None:
    SandboxConfig.objects.filter(pk=session_config.pk).update(pool_size=3)
    session_config.refresh_from_db()
    assert len(refill(session_config).made) == 3
    pooled_ids = ready_ids(session_config)
    barrier = threading.Barrier(8)
    got: dict[str, tuple[str, str]] = {}
    errors: list[BaseException] = []

    def resolve(n: int) -> None:
        try:
            barrier.wait()
            resolved = runtime.resolve(world.space_a, f"race-{n}")
            got[f"race-{n}"] = (resolved.sandbox.sandbox_id, resolved.action)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=resolve, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    sandboxes = [sandbox for sandbox, _ in got.values()]
    assert len(set(sandboxes)) == 8  # nobody shares
    took = [sandbox for sandbox, action in got.values() if action == "pooled"]
    assert set(took) <= pooled_ids
    assert len(took) == len(set(took))
    assert len(took) == 3  # every ready one went, each to one session
    rows = PoolMember.objects.filter(config=session_config, state=MemberState.CLAIMED)
    assert sorted(rows.values_list("sandbox_id", flat=True)) == sorted(took)
    assert len({row.session_id for row in rows}) == 3


def _claim_and_die(space_id: str, key: str) -> None:
    """A process that claims for a session and is killed before it binds."""
    connections.close_all()
    from console.models import Space

    session = get_or_create_session(Space.objects.get(pk=space_id), key)
    info = take(session, get_backend(session.config), 1)
    assert info is not None
    os._exit(9)  # no binding written, nothing cleaned up


@pytest.mark.django_db(transaction=True)
def test_a_claim_killed_before_its_bind_is_taken_back_not_leaked(
    world: World, pooled: SandboxConfig, runtime: Runtime
) -> None:
    refill(pooled)
    ready = ready_ids(pooled)
    connections.close_all()
    child = multiprocessing.get_context("fork").Process(target=_claim_and_die, args=(str(world.space_a.pk), "killed"))
    child.start()
    child.join(60)
    assert child.exitcode == 9
    member = PoolMember.objects.get(state=MemberState.CLAIMED)
    assert member.sandbox_id in ready
    assert member.session is not None
    assert member.session.key == "killed"
    assert runtime.store.get_binding(runtime.keys(member.session)[0]) is None
    # The reaper, past any grace, keeps it: its session may come back for it.
    reap_all(runtime.store, grace=timedelta(0))
    assert member.sandbox_id in pool_sandboxes(pooled)
    resolved = runtime.resolve(world.space_a, "killed")
    assert resolved.action == "pooled"
    assert resolved.sandbox.sandbox_id == member.sandbox_id
    assert PoolMember.objects.filter(session__key="killed").count() == 1


@pytest.mark.django_db
def test_an_emptied_store_loses_no_pooled_sandbox(world: World, pooled: SandboxConfig, runtime: Runtime) -> None:
    refill(pooled)
    first = runtime.resolve(world.space_a, "flushed")
    assert first.action == "pooled"
    bkey = runtime.keys(first.session)[0]
    runtime.store.delete_binding_if(bkey, first.binding)  # what FLUSHDB leaves
    reap_all(runtime.store, grace=timedelta(0))
    assert first.sandbox.sandbox_id in pool_sandboxes(pooled)  # neither reaped ...
    again = runtime.resolve(world.space_a, "flushed")
    assert again.sandbox.sandbox_id == first.sandbox.sandbox_id  # ... nor replaced
    assert len([s for s in pool_sandboxes(pooled) if s == first.sandbox.sandbox_id]) == 1
    assert Session.objects.get(key="flushed").binding_version == again.binding.version


@pytest.mark.django_db
def test_the_reaper_keeps_ready_sandboxes_and_deletes_rowless_ones(
    world: World, pooled: SandboxConfig, runtime: Runtime
) -> None:
    refill(pooled)
    ready = ready_ids(pooled)
    reap_all(runtime.store, grace=timedelta(0))
    assert pool_sandboxes(pooled) == ready
    lost = PoolMember.objects.filter(config=pooled).first()
    assert lost is not None
    PoolMember.objects.filter(pk=lost.pk).delete()  # a drain that died after its row went
    reports = reap_all(runtime.store, grace=timedelta(0))
    assert lost.sandbox_id in [d for r in reports for d in r.deleted]
    assert pool_sandboxes(pooled) == ready - {lost.sandbox_id}


@pytest.mark.django_db
def test_a_session_read_before_its_claim_gets_its_own_member_back(
    world: World, pooled: SandboxConfig, runtime: Runtime
) -> None:
    assert len(refill(pooled).made) == 2
    before = get_or_create_session(world.space_a, "pool-read-early")  # no template yet
    resolved = runtime.resolve(world.space_a, "pool-read-early")
    assert resolved.action == "pooled"
    # A copy read before the claim (a racing call) asks again: the session holds a member
    # already (one per session), so it gets that one back, never the other ready sandbox.
    info = take(before, get_backend(pooled), 2)
    assert info is not None
    assert info.sandbox_id == resolved.sandbox.sandbox_id
    assert PoolMember.objects.filter(config=pooled, state=MemberState.READY).count() == 1
    assert PoolMember.objects.filter(session=before).count() == 1


@pytest.mark.django_db
def test_a_pooled_resolve_through_the_api_records_what_its_caller_waited(world: World, pooled: SandboxConfig) -> None:
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from console.services import SYSTEM
    from sandboxes.api.tokens import do_create_api_token

    assert len(refill(pooled).made) == 2
    token = do_create_api_token(world.space_a, name="pooled", actor=SYSTEM)[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    with CaptureQueriesContext(connections["default"]) as queries:
        answer = client.post(
            f"/api/v1/spaces/{world.space_a.pk}/sessions/pool-api/resolve", data={}, content_type="application/json"
        )
    assert answer.status_code == 200, answer.content[:300]
    assert answer.json()["action"] == "pooled"
    claim = PoolClaim.objects.get(config=pooled)
    assert claim.hit
    # The whole resolve, from the request's start: the claim is one step of it.
    assert claim.resolve_ms is not None
    assert claim.resolve_ms > claim.duration_ms > 0
    # The session row is written once with what the resolve needs and never read back;
    # the member is claimed and answered by one statement.
    sql = [q["sql"] for q in queries.captured_queries]
    assert sum(s.startswith('INSERT INTO "sandboxes_session"') for s in sql) == 1
    assert not any(s.startswith('SELECT "sandboxes_session"."id", "sandboxes_session"."space_id"') for s in sql), sql
    assert not any(s.startswith('SELECT "sandboxes_poolmember"') for s in sql), sql
    assert not any(s.startswith('UPDATE "sandboxes_session" SET "last_activity"') for s in sql), sql
