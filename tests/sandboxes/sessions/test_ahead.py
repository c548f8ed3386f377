"""A warm resolve's look at its sandbox sent while the session's row is read (sessions.ahead):
the engine is asked once, and the look answers only for the sandbox the row binds, running,
when nothing had to be written first."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import docker
import pytest
from django.db import connection
from django.utils import timezone

from console import metrics
from sandboxes.backends.base import ErrorKind, RemoteError
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions import ahead
from sandboxes.sessions.runtime import Resolved, Runtime
from tests.personas import World
from tests.sandboxes.backends.docker.test_engine_loss import proxied_config, proxy  # noqa: F401 - fixtures
from tests.support.engine_proxy import EngineProxy

pytestmark = pytest.mark.django_db


def inspects(engine: EngineProxy, sandbox_id: str) -> int:
    return len(engine.requests(rf"^GET /v[\d.]+/containers/{sandbox_id}/json$"))


def resolved_on_a_short_control_timeout(runtime: Runtime, world: World, key: str) -> tuple[Resolved, DockerBackend]:
    """The session `key` resolved, its adapter's control calls bounded by 1 s (as its option
    `control_timeout` would bound them)."""
    resolved = runtime.resolve(world.space_a, key)
    backend = get_backend(resolved.session.config)
    assert isinstance(backend, DockerBackend)
    backend.engine.control_timeout = 1.0
    return resolved, backend


def test_a_warm_resolve_asks_the_engine_once_while_its_row_is_read(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    runtime = Runtime()
    sandbox_id = runtime.resolve(world.space_a, "warm").sandbox.sandbox_id
    runtime.resolve(world.space_a, "warm")
    before = inspects(proxy, sandbox_id)
    for _ in range(3):
        resolved = runtime.resolve(world.space_a, "warm")
        assert (resolved.action, resolved.sandbox.sandbox_id, resolved.sandbox.state) == (
            "bound",
            sandbox_id,
            "running",
        )
    # One inspect each: the look's answer stood for the connect (without it: look and connect).
    assert inspects(proxy, sandbox_id) - before == 3


def test_a_look_at_another_sessions_sandbox_is_never_its_answer(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    runtime = Runtime()
    mine = runtime.resolve(world.space_a, "mine")
    theirs = runtime.resolve(world.space_a, "theirs")
    # This process's memory of where a session was says the wrong running sandbox.
    backend = get_backend(mine.session.config)
    ahead.remember(world.space_a.pk, "mine", backend, theirs.sandbox.sandbox_id)
    resolved = runtime.resolve(world.space_a, "mine")
    assert resolved.sandbox.sandbox_id == mine.sandbox.sandbox_id
    assert Session.objects.get(pk=mine.session.pk).sandbox_id == mine.sandbox.sandbox_id


def test_a_sandbox_paused_behind_the_consoles_back_is_resumed_not_answered_as_it_was_seen(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    runtime = Runtime()
    sandbox_id = runtime.resolve(world.space_a, "paused").sandbox.sandbox_id
    engine = docker.APIClient(timeout=30)
    engine.pause(sandbox_id)
    resolved = runtime.resolve(world.space_a, "paused")
    assert (resolved.sandbox.sandbox_id, resolved.sandbox.state) == (sandbox_id, "running")
    assert engine.inspect_container(sandbox_id)["State"]["Status"] == "running"


@pytest.mark.parametrize("why", ["row says paused", "activity written first"])
def test_a_look_sent_before_what_must_come_first_is_dropped(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
    why: str,
) -> None:
    """A row not saying running (a pause or rebuild under way) is connected to as before; so is
    a session whose activity is written before its sandbox is looked at (`Runtime._touch`)."""
    runtime = Runtime()
    resolved = runtime.resolve(world.space_a, "dropped")
    sandbox_id = resolved.sandbox.sandbox_id
    rows = Session.objects.filter(pk=resolved.session.pk)
    if why == "row says paused":
        rows.update(state=SessionState.PAUSED)
    else:
        rows.update(last_activity=timezone.now() - timedelta(hours=1))
    before = inspects(proxy, sandbox_id)
    again = runtime.resolve(world.space_a, "dropped")
    assert (again.sandbox.sandbox_id, again.sandbox.state) == (sandbox_id, "running")
    assert inspects(proxy, sandbox_id) - before == 2  # the look, then the connect's own
    assert rows.get().state == SessionState.RUNNING


def test_an_adapter_replaced_by_an_edit_of_its_config_is_not_opened_again_for_a_look(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    runtime = Runtime()
    resolved = runtime.resolve(world.space_a, "edited")
    old = get_backend(resolved.session.config)
    config = SandboxConfig.objects.get(pk=proxied_config.pk)
    config.memory_mb = (config.memory_mb or 512) + 1
    config.save()
    assert get_backend(config) is not old  # as another request would: the old one is closed
    again = runtime.resolve(world.space_a, "edited")
    assert again.sandbox.sandbox_id == resolved.sandbox.sandbox_id
    assert (old.engine._client, old.engine._wire) == (None, None)  # type: ignore[attr-defined]


def test_a_wedged_engine_is_waited_for_no_longer_than_without_the_look(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    """The look is the connect's first inspect: when the engine does not answer it in time,
    that is the connect's timeout, not a reason to send the same inspect again and wait as
    long once more."""
    runtime = Runtime()
    resolved, _ = resolved_on_a_short_control_timeout(runtime, world, "wedged")
    sandbox_id = resolved.sandbox.sandbox_id

    def wedged(resolve: Callable[[], object]) -> tuple[int, float]:
        before, started = inspects(proxy, sandbox_id), time.monotonic()
        with pytest.raises(RemoteError) as caught:
            resolve()
        assert caught.value.kind == ErrorKind.TIMEOUT, caught.value
        assert f"sandbox {sandbox_id}" in caught.value.message
        return inspects(proxy, sandbox_id) - before, time.monotonic() - started

    proxy.hold(rf"^GET /v[\d.]+/containers/{sandbox_id}/json$")
    try:
        # The same resolve of the same row, sent no look.
        without_look = wedged(lambda: runtime.resolve_session(Session.objects.get(pk=resolved.session.pk)))
        with_look = wedged(lambda: runtime.resolve(world.space_a, "wedged"))
    finally:
        proxy.release()
    # As many inspects waited for (each a control timeout) with the look as without it.
    assert with_look[0] == without_look[0], (with_look, without_look)
    assert with_look[1] < without_look[1] + 0.5, (with_look, without_look)


def test_a_look_is_measured_and_logged_as_look_ahead_naming_its_sandbox(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = Runtime()
    sandbox_id = runtime.resolve(world.space_a, "measured").sandbox.sandbox_id
    runtime.resolve(world.space_a, "measured")
    calls = metrics.BACKEND_CALLS.labels(backend_kind="docker", operation="look_ahead")
    before = calls._value.get()
    with caplog.at_level(logging.DEBUG, logger="sandboxes.catalog.observed"):
        runtime.resolve(world.space_a, "measured")
    assert calls._value.get() - before == 1
    looks = [r for r in caplog.records if getattr(r, "operation", "") == "look_ahead"]
    assert [getattr(r, "sandbox_id", None) for r in looks] == [sandbox_id]
    assert not [r for r in caplog.records if getattr(r, "operation", "") == "connect"]


@pytest.mark.django_db(transaction=True)  # the resolve runs in a thread of its own
def test_a_look_unanswered_while_this_adapter_paused_the_sandbox_leaves_the_resume_to_connect(
    world: World,
    proxy: EngineProxy,  # noqa: F811 - the fixture
    proxied_config: SandboxConfig,  # noqa: F811
) -> None:
    """A pause by this adapter that lands while the look waits (an inspect hangs while its
    container is frozen): connect resumes that sandbox without an inspect, so the look's
    timeout is no failure of the connect's."""
    runtime = Runtime()
    resolved, backend = resolved_on_a_short_control_timeout(runtime, world, "frozen")
    sandbox_id = resolved.sandbox.sandbox_id
    looked = inspects(proxy, sandbox_id)
    answers: list[object] = []

    def resolve() -> None:
        try:
            answers.append(runtime.resolve(world.space_a, "frozen"))
        except Exception as exc:
            answers.append(exc)
        finally:
            connection.close()

    proxy.hold(rf"^GET /v[\d.]+/containers/{sandbox_id}/json$")
    try:
        started = time.monotonic()
        thread = threading.Thread(target=resolve)
        thread.start()
        while inspects(proxy, sandbox_id) == looked and time.monotonic() - started < 5:
            time.sleep(0.01)
        backend.pause(sandbox_id)
        thread.join(timeout=30)
        elapsed = time.monotonic() - started
    finally:
        proxy.release()
    assert [type(answer) for answer in answers] == [Resolved], answers
    assert (answers[0].sandbox.sandbox_id, answers[0].sandbox.state) == (sandbox_id, "running")  # type: ignore[attr-defined]
    assert docker.APIClient(timeout=30).inspect_container(sandbox_id)["State"]["Status"] == "running"
    assert elapsed < 2.0  # the look's one timeout
