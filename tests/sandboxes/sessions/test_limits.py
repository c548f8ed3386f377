"""Quotas and rate limits per space, and cursor pagination of the API's lists."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEvent, SpaceLimits
from console.services import SYSTEM, Actor, ServiceError, do_update_space_limits
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import (
    BackgroundCommand,
    CommandStatus,
    ExecSlot,
    Session,
    SessionState,
)
from sandboxes.sessions import limits
from sandboxes.sessions import runtime as runtime_module
from sandboxes.sessions.limits import LimitExceeded, take_exec_slot
from sandboxes.sessions.lookup import get_or_create_session
from tests.conftest import REDIS_URL
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent
from tests.support.killed_process import console_child, kill_when_ready

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent(world: World) -> Agent:
    make_config(world.space_a, is_default=True)
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


def set_limits(world: World, **values: int | None) -> None:
    do_update_space_limits(world.space_a, actor=SYSTEM, **values)
    limits._limits_cache.clear()


def assert_refused(response: Any, limit: str, maximum: int) -> dict[str, Any]:
    assert response.status_code == 429, response.content
    body = json.loads(response.content)["error"]
    assert (body["code"], body["limit"], body["maximum"]) == ("limit_exceeded", limit, maximum)
    assert int(response["Retry-After"]) >= 1
    assert body["retry_after_s"] == int(response["Retry-After"])
    return body


def test_a_new_session_past_the_quota_is_refused_with_429_and_nothing_is_created(world: World, agent: Agent) -> None:
    config = make_config(world.space_a, name="other")
    Session.objects.create(space=world.space_a, key="existing", config=config)
    Session.objects.create(space=world.space_a, key="gone", config=config, state=SessionState.GONE)
    set_limits(world, live_sessions=1)
    body = assert_refused(agent.post("second", "resolve"), "live_sessions", 1)
    assert "quota of live sessions (1)" in body["message"]
    assert not Session.objects.filter(key="second").exists()
    assert not AuditEvent.objects.filter(action="session.create").exists()


@pytest.mark.django_db(transaction=True)
def test_the_session_quota_holds_under_concurrent_creations(world: World) -> None:
    """Twelve creations at once against a quota of three: exactly three sessions exist.

    The test holds inserts into the session table back until all twelve are waiting, so each
    has counted before any has inserted: only the quota's lock keeps them from all passing.
    """
    make_config(world.space_a, is_default=True)
    set_limits(world, live_sessions=3)
    outcomes: list[str] = []
    count = 12

    def create(n: int) -> None:
        try:
            get_or_create_session(world.space_a, f"racer-{n}")
            outcomes.append("created")
        except LimitExceeded:
            outcomes.append("refused")
        except Exception as exc:
            outcomes.append(f"error {exc!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(n,)) for n in range(count)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {Session._meta.db_table} IN SHARE ROW EXCLUSIVE MODE")
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0] >= count:
                break
            time.sleep(0.05)
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["created"] * 3 + ["refused"] * (count - 3)
    assert Session.objects.filter(space=world.space_a).count() == 3


def test_concurrent_execs_count_live_ones_across_sessions(world: World, agent: Agent) -> None:
    config = make_config(world.space_a, name="c")
    busy = Session.objects.create(space=world.space_a, key="busy", config=config)
    Session.objects.create(space=world.space_a, key="idle", config=config)
    set_limits(world, concurrent_execs=2)
    later = timezone.now() + timedelta(minutes=5)
    slots = [take_exec_slot(world.space_a, busy, later) for _ in range(2)]
    assert sorted(slot.number for slot in slots) == [0, 1]  # type: ignore[type-var]
    body = assert_refused(agent.post("idle", "exec", {"shell": "true"}), "concurrent_execs", 2)
    assert "limit of concurrent execs (2)" in body["message"]
    # A dead exec (its own deadline passed) no longer counts: its place is taken over.
    ExecSlot.objects.filter(pk=slots[0].pk).update(deadline=timezone.now() - timedelta(seconds=1))
    taken = take_exec_slot(world.space_a, busy, later)
    assert taken.number == slots[0].number
    assert not ExecSlot.objects.filter(pk=slots[0].pk).exists()
    assert ExecSlot.objects.filter(pk=taken.pk, deadline=later).exists()


@pytest.mark.django_db(transaction=True)
def test_racing_execs_never_hold_more_than_the_limit(world: World) -> None:
    """Twenty execs at once against a limit of three, released at once and again: at no time
    do more than three hold a slot, and every one is either counted in or refused."""
    config = make_config(world.space_a, is_default=True)
    session = Session.objects.create(space=world.space_a, key="racing", config=config)
    set_limits(world, concurrent_execs=3)
    count, rounds = 20, 3
    holding, most, outcomes = [0], [0], []
    guard = threading.Lock()
    rt = runtime_module.Runtime()

    def run(start: threading.Barrier) -> None:
        try:
            start.wait(10)
            with rt.exec_in_flight(session, 30):
                with guard:
                    holding[0] += 1
                    most[0] = max(most[0], holding[0])
                    in_rows = ExecSlot.objects.filter(space=world.space_a).count()
                time.sleep(0.2)
                with guard:
                    holding[0] -= 1
            outcomes.append(("counted", in_rows))
        except LimitExceeded:
            outcomes.append(("refused", 0))
        except Exception as exc:
            outcomes.append((f"error {exc!r}", 0))
        finally:
            connection.close()

    for _ in range(rounds):
        start = threading.Barrier(count)
        threads = [threading.Thread(target=run, args=(start,)) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert {outcome for outcome, _ in outcomes} <= {"counted", "refused"}, outcomes
    assert len(outcomes) == count * rounds
    assert 1 <= most[0] <= 3
    assert max(rows for _, rows in outcomes) <= 3
    assert sum(outcome == "counted" for outcome, _ in outcomes) >= rounds  # each round let some in
    assert not ExecSlot.objects.filter(space=world.space_a).exists()  # every slot freed
    session.refresh_from_db()
    assert session.execs_in_flight == 0


def test_background_commands_past_the_limit_are_refused(world: World, agent: Agent) -> None:
    config = make_config(world.space_a, name="c")
    session = Session.objects.create(space=world.space_a, key="s", config=config)
    BackgroundCommand.objects.create(session=session, shell="sleep 100")
    BackgroundCommand.objects.create(session=session, shell="true", status=CommandStatus.EXITED)
    set_limits(world, background_commands=1)
    assert_refused(agent.post("s", "commands", {"shell": "sleep 1"}), "background_commands", 1)
    assert BackgroundCommand.objects.count() == 2


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "this-process"])
def test_api_requests_per_minute_per_space(world: World, agent: Agent, settings: Any, shared: bool) -> None:
    settings.REDIS_URL = REDIS_URL if shared else ""
    limits._local_windows.clear()
    set_limits(world, api_requests_per_minute=3)
    for _ in range(3):
        assert agent.get("nobody").status_code == 404
    body = assert_refused(agent.get("nobody"), "api_requests_per_minute", 3)
    # At most the rest of this minute and the third of the next where these three still weigh 2.
    assert int(body["retry_after_s"]) <= 80
    # Another token of the same space shares the space's window.
    _, other = do_create_api_token(world.space_a, name="other", actor=Actor(user=world.alice))
    assert_refused(Agent(world.space_a.id, other).get("nobody"), "api_requests_per_minute", 3)


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "this-process"])
def test_api_requests_per_minute_hold_across_the_turn_of_a_minute(world: World, settings: Any, shared: bool) -> None:
    """A minute's calls spent at its end leave none for the start of the next (the previous
    minute's count weighs by its share left): no burst of twice the limit around the turn."""
    settings.REDIS_URL = REDIS_URL if shared else ""
    limits._local_windows.clear()
    set_limits(world, api_requests_per_minute=5)
    turn = (int(time.time() // limits.WINDOW_S) + 2) * limits.WINDOW_S  # a minute no other call uses

    def passed(at: float, calls: int) -> int:
        done = 0
        for _ in range(calls):
            with contextlib.suppress(LimitExceeded):
                limits.check_api_rate(world.space_a, now=at)
                done += 1
        return done

    assert passed(turn - 0.5, 10) == 5
    with pytest.raises(LimitExceeded) as refused:
        limits.check_api_rate(world.space_a, now=turn + 0.5)
    # The previous minute's five still weigh 4.96: one more fits after a fifth of this one.
    assert refused.value.retry_after_s == 12
    assert passed(turn + 0.5, 5) == 0
    assert passed(turn + 11.5, 5) == 0
    assert passed(turn + 12.5, 5) == 1
    assert passed(turn + 30, 5) == 1  # half the previous five weigh 2.5: two of this minute fit
    assert passed(turn + 59, 5) == 2
    # Refused calls are not counted: a client that keeps trying still gets its share later.
    assert passed(turn + 61, 20) == 1
    assert passed(turn + 150, 5) == 4  # half of the one call that passed, not of twenty


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "this-process"])
def test_api_requests_per_minute_hold_for_a_call_timed_before_the_turn_counted_after_it(
    world: World, settings: Any, shared: bool
) -> None:
    """Threads read the clock before they count: one that read it just before the turn may
    count after another already counted past it. Its call still counts against the full
    minute: the minute's calls are not forgotten."""
    settings.REDIS_URL = REDIS_URL if shared else ""
    limits._local_windows.clear()
    set_limits(world, api_requests_per_minute=5)
    turn = (int(time.time() // limits.WINDOW_S) + 2) * limits.WINDOW_S
    for _ in range(5):
        limits.check_api_rate(world.space_a, now=turn - 1)
    with pytest.raises(LimitExceeded):
        limits.check_api_rate(world.space_a, now=turn + 0.1)
    late = 0
    for _ in range(5):
        with contextlib.suppress(LimitExceeded):
            limits.check_api_rate(world.space_a, now=turn - 0.5)
            late += 1
    assert late == 0
    with pytest.raises(LimitExceeded):
        limits.check_api_rate(world.space_a, now=turn + 0.2)


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "this-process"])
def test_api_requests_per_minute_pass_at_most_twice_the_limit_less_one_in_any_60_s(
    world: World, settings: Any, shared: bool
) -> None:
    """The bound docs/operations.md states: the previous minute's calls weigh as if spread
    over it, so calls bunched at its end let up to twice the limit less one into some 60 s
    (reached by a client calling as soon as one fits), never more."""
    settings.REDIS_URL = REDIS_URL if shared else ""
    limits._local_windows.clear()
    set_limits(world, api_requests_per_minute=5)
    turn = (int(time.time() // limits.WINDOW_S) + 2) * limits.WINDOW_S
    passed = [turn - 0.5] * 5
    for at in passed:  # the limit spent at the end of a minute
        limits.check_api_rate(world.space_a, now=at)
    for tick in range(480):  # then three calls every half second for four minutes
        at = turn + tick / 2
        for _ in range(3):
            with contextlib.suppress(LimitExceeded):
                limits.check_api_rate(world.space_a, now=at)
                passed.append(at)
    most = max(sum(1 for t in passed if start <= t < start + limits.WINDOW_S) for start in passed)
    assert most == 2 * 5 - 1


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "this-process"])
def test_api_requests_per_minute_retry_after_is_when_one_more_call_fits(
    world: World, settings: Any, shared: bool
) -> None:
    """A client that waits exactly Retry-After gets through, and not a second sooner: on whole
    seconds too, where the share of the minute before lands on a limit exactly."""
    settings.REDIS_URL = REDIS_URL if shared else ""
    limits._local_windows.clear()
    first = (int(time.time() // limits.WINDOW_S) + 2) * limits.WINDOW_S
    late = []
    for case, (maximum, at, wait) in enumerate((m, a, w) for m in (1, 3, 5) for a in range(60) for w in (0, 45)):
        set_limits(world, api_requests_per_minute=maximum)
        limits._limits_cache.clear()
        turn = first + case * 5 * limits.WINDOW_S  # minutes of its own
        for _ in range(maximum):
            limits.check_api_rate(world.space_a, now=turn + at)
        try:
            limits.check_api_rate(world.space_a, now=turn + at + wait)
            continue  # the minute before weighs little enough already
        except LimitExceeded as refused:
            retry = refused.retry_after_s
        assert 1 <= retry <= 2 * limits.WINDOW_S
        if retry > 1:
            with pytest.raises(LimitExceeded):
                limits.check_api_rate(world.space_a, now=turn + at + wait + retry - 1)
        try:
            limits.check_api_rate(world.space_a, now=turn + at + wait + retry)
        except LimitExceeded:
            late.append((maximum, at, wait, retry))
    assert not late, f"refused after waiting Retry-After (limit, at, waited, Retry-After): {late[:5]}"


def test_limits_are_set_by_platform_admins_and_read_by_members(world: World) -> None:
    url = reverse("console:space_limits", kwargs={"space_id": world.space_a.id})
    member = world.client_for("alice")
    page = member.get(url)
    assert page.status_code == 200
    assert b"platform default" in page.content
    assert member.post(url, {"live_sessions": "5"}).status_code == 403
    assert world.client_for("charlie").get(url).status_code == 404  # another space's admin
    root = world.client_for("root")
    assert root.post(url, {"live_sessions": "-1"}).status_code == 400
    response = root.post(url, {"live_sessions": "5", "api_requests_per_minute": ""})
    assert response.status_code == 302
    row = SpaceLimits.objects.get(space=world.space_a)
    assert (row.live_sessions, row.api_requests_per_minute) == (5, None)
    assert row.effective()["api_requests_per_minute"] == 1200
    event = AuditEvent.objects.get(action="space.limits")
    assert event.details["after"]["live_sessions"] == 5
    with pytest.raises(ServiceError):
        do_update_space_limits(world.space_a, actor=SYSTEM, nonsense=1)


def test_command_lists_paginate_with_a_cursor(world: World, agent: Agent) -> None:
    config = make_config(world.space_a, name="c")
    session = Session.objects.create(space=world.space_a, key="s", config=config)
    same_time = timezone.now()
    made = [
        BackgroundCommand.objects.create(session=session, shell=f"echo {n}", status=CommandStatus.EXITED)
        for n in range(7)
    ]
    # Ties on the time are ordered by id, so no row is skipped or repeated across pages.
    BackgroundCommand.objects.filter(pk__in=[c.pk for c in made[:4]]).update(started=same_time)
    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        response = agent.get("s", "commands", **params)
        assert response.status_code == 200, response.content
        body = json.loads(response.content)
        seen += [c["id"] for c in body["commands"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert sorted(seen) == sorted(str(c.pk) for c in made)
    assert len(seen) == 7
    for bad in ({"cursor": "nope!"}, {"cursor": "W10"}, {"limit": "0"}, {"limit": "501"}, {"limit": "x"}):
        refused = agent.get("s", "commands", **bad)
        assert refused.status_code == 400, bad
        assert json.loads(refused.content)["error"]["field"] in {"cursor", "limit"}
    assert json.loads(agent.get("s", "commands").content)["next_cursor"] is None
    assert uuid.UUID(seen[0])


@pytest.mark.django_db(transaction=True)
def test_racing_background_command_starts_never_pass_the_limit(world: World) -> None:
    """The authoritative count is taken with the insert: starts that all passed the early
    check while the space was below its limit are refused at the insert once it is full."""
    config = make_config(world.space_a, name="c")
    session = Session.objects.create(space=world.space_a, key="s", config=config)
    set_limits(world, background_commands=2)
    outcomes: list[str] = []

    def start(n: int) -> None:
        try:
            limits.check_background_commands(world.space_a)  # the early check: all pass (0 running)
            barrier.wait()
            with transaction.atomic():
                limits.check_background_commands(world.space_a, locked=True)
                BackgroundCommand.objects.create(session=session, shell=f"echo {n}")
            outcomes.append("started")
        except LimitExceeded:
            outcomes.append("refused")
        finally:
            connection.close()

    barrier = threading.Barrier(6)
    threads = [threading.Thread(target=start, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["refused"] * 4 + ["started"] * 2
    assert BackgroundCommand.objects.filter(session=session, status=CommandStatus.RUNNING).count() == 2


def _cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "forged",
    [
        ["2020-01-01T00:00:00+00:00", 1],
        ["2020-01-01T00:00:00+00:00", {"a": 1}],
        ["2020-01-01T00:00:00+00:00", ["x"]],
        {"2020-01-01T00:00:00+00:00": 0, "b": 1},
    ],
    ids=["int-id", "object-id", "list-id", "object"],
)
def test_a_forged_cursor_of_other_types_is_a_400_not_a_500(world: World, agent: Agent, forged: Any) -> None:
    config = make_config(world.space_a, name="c")
    Session.objects.create(space=world.space_a, key="s", config=config)
    for what in ("commands", "artifacts"):
        response = agent.get("s", what, cursor=_cursor(forged))
        assert response.status_code == 400, (what, response.status_code, response.content[:200])
        assert json.loads(response.content)["error"]["field"] == "cursor"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "when",
    ["2020-01-01T00:00:00", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2020-01-01"],
    ids=["naive", "year-1-east", "year-9999-west", "date-only"],
)
def test_a_cursor_at_odd_times_answers_a_page_or_a_400(world: World, agent: Agent, when: str) -> None:
    config = make_config(world.space_a, name="c")
    Session.objects.create(space=world.space_a, key="s", config=config)
    response = agent.get("s", "commands", cursor=_cursor([when, "00000000-0000-0000-0000-000000000000"]))
    assert response.status_code in (200, 400), (response.status_code, response.content[:300])


# An exec counted in by a process killed before its finally stops counting against the space's
# concurrent-exec limit once its own deadline has passed, even while the session keeps running
# other execs.


@pytest.mark.django_db(transaction=True)
def test_a_killed_exec_stops_counting_after_its_deadline_under_steady_traffic(world: World, monkeypatch: Any) -> None:
    make_config(world.space_a, is_default=True)
    session = get_or_create_session(world.space_a, "killed-exec")
    SpaceLimits.objects.update_or_create(space=world.space_a, defaults={"concurrent_execs": 2})
    grace_s = 1.0
    monkeypatch.setattr(runtime_module, "EXEC_GRACE", timedelta(seconds=grace_s))
    child = console_child(
        "from datetime import timedelta\n"
        "from sandboxes.models import Session\n"
        "from sandboxes.sessions import runtime\n"
        f"runtime.EXEC_GRACE = timedelta(seconds={grace_s})\n"
        f"session = Session.objects.select_related('space').get(pk={str(session.pk)!r})\n"
        "with runtime.Runtime().exec_in_flight(session, 1.0):\n"
        "    print('READY', flush=True)\n"
        "    time.sleep(120)\n"
    )
    kill_when_ready(child)
    killed_deadline = time.monotonic() + 1.0 + grace_s
    rt = runtime_module.Runtime()
    session = Session.objects.select_related("space").get(pk=session.pk)
    # The agent goes on: one short exec after another, well within each other's deadline.
    while time.monotonic() < killed_deadline + 2.0:
        with rt.exec_in_flight(session, 1.0):
            time.sleep(0.05)
        time.sleep(0.3)
    # The killed exec's own deadline is long past; only live execs count now.
    with rt.exec_in_flight(session, 1.0):
        try:
            with rt.exec_in_flight(session, 1.0):  # two live execs: within the limit of 2
                pass
        except LimitExceeded as refused:
            pytest.fail(f"the dead exec still counts: {refused}")


def test_a_lowered_limit_holds_against_execs_taken_under_the_higher_one(world: World) -> None:
    """Execs still running in places past a lowered limit count against it: no new exec
    starts until fewer than the new limit run."""
    config = make_config(world.space_a, is_default=True)
    session = Session.objects.create(space=world.space_a, key="lowered", config=config)
    set_limits(world, concurrent_execs=4)
    until = timezone.now() + timedelta(minutes=5)
    slots = [take_exec_slot(world.space_a, session, until) for _ in range(4)]
    for slot in slots:
        if slot.number is not None and slot.number < 2:
            limits.release_exec_slot(slot)  # the two left run in places 2 and 3
    set_limits(world, concurrent_execs=2)
    with pytest.raises(LimitExceeded):
        take_exec_slot(world.space_a, session, until)
    assert ExecSlot.objects.filter(space=world.space_a).count() == 2


def test_an_exec_ending_past_its_deadline_does_not_count_out_a_live_call(world: World) -> None:
    """An exec held up past its slot's deadline (a wedged engine call, while its process still
    beats) no longer counts: the session's count started again from the calls after it. When
    it does end, freeing its slot must not take one off that count, or a live call stops
    counting and a pause may freeze the sandbox under it (the rule `release_slots_of` keeps)."""
    from sandboxes.sessions.inflight import busy_reason, in_flight

    session = Session.objects.create(space=world.space_a, key="held-up", config=make_config(world.space_a))
    rt = runtime_module.Runtime()
    with contextlib.ExitStack() as held_up:
        held_up.enter_context(rt.exec_in_flight(session, 1.0))
        past = timezone.now() - timedelta(seconds=1)
        ExecSlot.objects.filter(session=session).update(deadline=past)  # its deadlines pass
        Session.objects.filter(pk=session.pk).update(exec_deadline=past)
        with in_flight(session):  # a live call: the count starts again from it
            held_up.close()  # the held-up exec ends now
            session.refresh_from_db()
            assert session.execs_in_flight == 1
            assert busy_reason(session.pk) is not None, "the live call no longer counts"
            assert not ExecSlot.objects.filter(session=session).exists()  # its slot freed all the same
        session.refresh_from_db()
        assert (session.execs_in_flight, session.exec_deadline) == (0, None)
