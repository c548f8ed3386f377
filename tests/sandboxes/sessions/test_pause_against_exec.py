"""A Pause racing execs never wedges the sandbox: the one guarded pause, on the real engine.

Two pause loops (the UI's and the API's `Runtime.pause`, as two members clicking) run
against an exec loop on one session's container, which the test owns: without the guard, one
Pause during an exec loop wedged the container 5 times in 20, and two tight pause loops
every time within 15 s. A pause that meets an exec in flight is refused
(409 `session_busy`, in words); one that gets in holds the session's row, so the next exec
waits for it and resumes the sandbox. A wedge (docker/for-linux#891) is any call that does
not come back, an engine that no longer answers an inspect of the container, or an engine
and a freezer cgroup that disagree at the end. The teardown thaws the freezer whatever
happened, so a wedge here never hangs the engine for the other tests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import docker
import pytest

from console.services import Actor
from sandboxes.backends.base import ExecRequest, RemoteError
from sandboxes.backends.docker.repair import FROZEN, THAWED
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime, SessionBusy
from tests.personas import World
from tests.support.pause_support import Loop, freezer, thaw_quietly

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.slow]

KEY = "pause-against-exec"
PAUSES = 40  # successful pauses with the exec loop running: the rounds of the figure
DEADLINE_S = 120


@pytest.fixture
def owned_session(world: World, session_config: SandboxConfig) -> Iterator[Session]:
    resolved = Runtime().resolve(world.space_a, KEY)
    sandbox_id = resolved.sandbox.sandbox_id
    try:
        yield Session.objects.select_related("config", "space").get(pk=resolved.session.pk)
    finally:
        thaw_quietly(sandbox_id)


def _pause_call(session_pk: Any) -> tuple[int, str]:
    session = Session.objects.select_related("config", "space").get(pk=session_pk)
    try:
        Runtime().pause(session, actor=Actor(user=None))
    except SessionBusy as exc:
        worded = "right now" in exc.message or ("is busy" in exc.message and "not paused" in exc.message)
        return (409, "session_busy" if worded else f"session_busy without words: {exc.message}")
    except RemoteError as exc:
        return (502, f"{exc.kind}: {exc.message[:80]}")
    time.sleep(0.02)  # paused a moment, as a member's Pause stays
    return (200, "paused")


def _exec_call(session_pk: Any) -> tuple[int, str]:
    session = Session.objects.select_related("config", "space").get(pk=session_pk)
    try:
        result = Runtime().exec(session, ExecRequest(argv=("true",), timeout_s=10))
    except RemoteError as exc:
        return (409 if exc.kind == "conflict" else 502, getattr(exc, "code", str(exc.kind)))
    return (200, f"exit {result.exit_code}")


def test_a_pause_loop_against_an_exec_loop_never_wedges_the_sandbox(owned_session: Session) -> None:
    session = owned_session
    sandbox_id = session.sandbox_id
    execs = Loop("execs", lambda: _exec_call(session.pk)).start()
    pausers = [Loop(f"pauses-{n}", lambda: _pause_call(session.pk)) for n in range(2)]
    time.sleep(0.3)
    for pauser in pausers:
        pauser.start()
    pauses = Loop("pauses", lambda: (0, ""))  # the two loops' answers, added up

    def paused() -> int:
        return sum(p.seen[(200, "paused")] for p in pausers)

    deadline = time.monotonic() + DEADLINE_S
    while paused() < PAUSES and time.monotonic() < deadline and all(p.thread.is_alive() for p in pausers):
        time.sleep(0.2)
    pauses_back = all(p.join(30) for p in pausers)
    execs_back = execs.join(30)
    for pauser in pausers:
        pauses.seen.update(pauser.seen)
        pauses.slowest = max(pauses.slowest, pauser.slowest)
    engine = docker.APIClient(timeout=10)
    try:
        inspected = engine.inspect_container(sandbox_id)["State"]
        inspect_answers = True
    except Exception:
        inspected, inspect_answers = {}, False
    cgroup = freezer(sandbox_id).state()
    agree = (inspected.get("Paused") and cgroup == FROZEN) or (not inspected.get("Paused") and cgroup == THAWED)
    wedges = sum([not pauses_back, not execs_back, not inspect_answers, not agree])
    figures = {
        "pauses": dict(pauses.seen),
        "execs": dict(execs.seen),
        "slowest_pause_s": round(pauses.slowest, 2),
        "slowest_exec_s": round(execs.slowest, 2),
        "wedges": wedges,
    }
    print(f"pause-vs-exec: wedges {wedges} in {pauses.seen[(200, 'paused')]} pauses; {figures}")
    assert wedges == 0, figures
    assert pauses.seen[(200, "paused")] >= PAUSES, figures
    assert pauses.seen[(409, "session_busy")] > 0, figures  # the guard did meet execs in flight
    assert set(pauses.seen) <= {(200, "paused"), (409, "session_busy")}, figures
    assert set(execs.seen) == {(200, "exit 0")}, figures  # every exec ran, none cut or failed
    # Bounded, far below a client's patience.
    assert pauses.slowest < 25, figures
    assert execs.slowest < 25, figures
    # And the session still works afterwards.
    fresh = Session.objects.select_related("config", "space").get(pk=session.pk)
    assert Runtime().exec(fresh, ExecRequest(argv=("echo", "alive"), timeout_s=10)).stdout == b"alive\n"


def test_a_members_pause_during_an_exec_is_refused_in_words(owned_session: Session, world: World) -> None:
    from django.test import Client
    from django.urls import reverse

    session = owned_session
    execs = Loop("one exec", lambda: _exec_call_of(session.pk, "sleep 3"), rounds=1).start()
    for _ in range(100):
        session.refresh_from_db()
        if session.execs_in_flight:
            break
        time.sleep(0.05)
    client = Client()
    client.force_login(world.bob)
    url = reverse("sandboxes:session_action", kwargs={"session_id": session.id, "action": "pause"})
    page = client.post(url, follow=True).content.decode()
    assert "is busy (1 command or file operation running); it was not paused." in page
    assert "The backend said" not in page
    assert execs.join(30)
    assert execs.seen == {(200, "exit 0"): 1}
    assert docker.APIClient(timeout=10).inspect_container(session.sandbox_id)["State"]["Paused"] is False


def _exec_call_of(session_pk: Any, shell: str) -> tuple[int, str]:
    session = Session.objects.select_related("config", "space").get(pk=session_pk)
    result = Runtime().exec(session, ExecRequest(shell=shell, timeout_s=10))
    return (200, f"exit {result.exit_code}")
