"""Exec, resolve and file calls racing a Pause or a DELETE answer in words, never 502.

Loops of API execs, resolves and file reads run against a loop of the console's Pause (the
one guarded pause, through the API's POST …/pause); every answer is counted. Allowed: 200,
409 `session_busy` for a pause that met work in flight, 409 `session_not_running` for a read
that found the sandbox paused (or a call the pause raced). Then the session is deleted
under running execs: those answer 200 or 404, never 502.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from console.models import SpaceLimits
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import SandboxConfig
from tests.personas import World
from tests.sandboxes.api.test_get_never_wakes import Agent
from tests.support.pause_support import Loop, answer_of, pauses_between_calls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker, pytest.mark.slow]

KEY = "racing-pause"
# The loops run until the pause got in between calls this often (each one a resume raced by
# the calls that follow), within MAX_RUN_S; the calls leave gaps so that it can. A gap is at
# least GAP_SHARE of the call before it: with a fixed 30 ms gap, on a loaded machine (calls of
# a second or more) the pause found exec and file calls both idle a few times a minute.
PAUSES = 8
MIN_RUN_S, MAX_RUN_S = 8, 60
GAP_S, GAP_SHARE = 0.03, 0.5


@pytest.fixture
def agents(world: World, session_config: SandboxConfig) -> list[Agent]:
    # The rate limit counts the space's requests whichever token sent them: the loops make
    # thousands a minute, which is the point here, not the limit.
    SpaceLimits.objects.update_or_create(space=world.space_a, defaults={"api_requests_per_minute": 1_000_000})
    made = []
    for n in range(4):
        _, token = do_create_api_token(world.space_a, name=f"racer-{n}", actor=Actor(user=world.alice))
        made.append(Agent(world.space_a.id, token))
    return made


ALLOWED = {(200, ""), (409, "session_busy"), (409, "session_not_running")}


def test_exec_resolve_and_file_calls_racing_a_pause_never_answer_502(agents: list[Agent]) -> None:
    pauser, executor, resolver, reader = agents
    assert executor.post("resolve", key=KEY).status_code == 200
    assert executor.post("exec", '{"shell": "echo x > /workspace/f.txt"}', key=KEY).status_code == 200
    loops = [
        Loop("pause", lambda: answer_of(pauser.post("pause", key=KEY))),
        Loop(
            "exec",
            lambda: answer_of(executor.post("exec", '{"argv": ["true"]}', key=KEY)),
            gap_s=GAP_S,
            gap_share=GAP_SHARE,
        ),
        Loop("resolve", lambda: answer_of(resolver.post("resolve", key=KEY)), gap_s=GAP_S, gap_share=GAP_SHARE),
        Loop(
            "files",
            lambda: answer_of(reader.get("files/content", key=KEY, path="f.txt")),
            gap_s=GAP_S,
            gap_share=GAP_SHARE,
        ),
    ]
    for loop in loops:
        loop.start()
    started = time.monotonic()
    while time.monotonic() - started < MAX_RUN_S:
        time.sleep(0.5)
        if time.monotonic() - started >= MIN_RUN_S and pauses_between_calls(loops[0], loops[1:3]) >= PAUSES:
            break
    stuck = [loop.name for loop in loops if not loop.join(40)]
    counts = {loop.name: {**dict(loop.seen), "slowest_s": round(loop.slowest, 2)} for loop in loops}
    total = sum(sum(loop.seen.values()) for loop in loops)
    between = pauses_between_calls(loops[0], loops[1:3])
    print(f"racing a pause: {total} calls, {between} pauses between calls; {counts}")
    assert not stuck, counts
    wrong = {loop.name: {k: n for k, n in loop.seen.items() if k not in ALLOWED} for loop in loops}
    assert not any(wrong.values()), f"answers other than 200 and 409 in words: {wrong}"
    assert between >= PAUSES, counts  # the pause did get in between calls (a no-op pause is a 200 too)
    assert (409, "session_busy") not in loops[1].seen
    assert (409, "session_busy") not in loops[2].seen


def test_execs_racing_a_delete_answer_200_or_404(agents: list[Agent]) -> None:
    deleter, *executors = agents
    assert deleter.post("resolve", key=KEY).status_code == 200
    loops = [
        Loop(f"exec-{n}", lambda a=agent: answer_of(a.post("exec", '{"shell": "sleep 0.2"}', key=KEY)))  # type: ignore[misc]
        for n, agent in enumerate(executors)
    ]
    for loop in loops:
        loop.start()
    time.sleep(2)
    response = deleter.client.delete(f"{deleter.base}/{KEY}", headers=deleter.headers)
    assert response.status_code == 204, response.content
    time.sleep(1)
    assert all(loop.join(30) for loop in loops)
    seen: Counter[tuple[int, str]] = Counter()
    for loop in loops:
        seen.update(loop.seen)
    print(f"racing a delete: {dict(seen)}")
    assert set(seen) <= {(200, ""), (404, "not_found"), (409, "sandbox_replaced")}, dict(seen)
    assert seen[(404, "not_found")] > 0, dict(seen)
