"""Actions on several sessions from the sessions list: one confirmation that lists what will
happen, only sessions the user may act on (a forged id of another tenant is a 404), CSRF, the
one job that does a confirmed action (its progress inline with HTMX, each session's outcome,
a partial failure named), and a real pause and resume of two Docker sessions in one action
each."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.models import AdminJob, AuditEvent, JobStatus
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions.bulk import MAX_SESSIONS
from sandboxes.sessions.reaper import idle_sweep
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import lifecycle_lock
from tests.factories import make_config
from tests.personas import World
from tests.support.jobs import run_to_end

pytestmark = pytest.mark.django_db

BULK = reverse("sandboxes:session_bulk")
LIST = reverse("sandboxes:session_list")


@pytest.fixture
def offline(world: World) -> dict[str, Session]:
    """Sessions of both spaces on an engine that is not there: nothing can really happen."""
    config_a = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    config_b = make_config(world.space_b, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    return {
        "a1": Session.objects.create(space=world.space_a, key="a-run", config=config_a, state="running"),
        "a2": Session.objects.create(space=world.space_a, key="a-paused", config=config_a, state="paused"),
        "b1": Session.objects.create(space=world.space_b, key="b-secret", config=config_b, state="running"),
    }


def test_the_first_post_only_lists_what_will_happen(world: World, offline: dict[str, Session]) -> None:
    client = world.client_for("bob")
    ids = [str(offline["a1"].id), str(offline["a2"].id)]
    page = client.post(BULK, {"action": "pause", "session": ids, "next": f"{LIST}?state=running"})
    assert page.status_code == 200
    body = page.content.decode()
    assert "Pause 1 session?" in body
    assert "<code>a-run</code> in Space A: its sandbox is paused (memory kept)" in body
    assert "<code>a-paused</code>: it is paused, not running" in body  # left alone, said why
    assert f'name="session" value="{offline["a1"].id}"' in body
    assert f'name="session" value="{offline["a2"].id}"' not in body
    assert 'name="confirm" value="1"' in body
    assert f'href="{LIST}?state=running"' in body  # Cancel goes back to the list as it was
    assert AuditEvent.objects.filter(action="session.pause").count() == 0
    assert Session.objects.get(pk=offline["a1"].pk).state == "running"


@pytest.mark.parametrize("who", ["charlie", "bob"])
def test_a_forged_id_of_another_tenant_is_a_404_for_the_whole_request(
    world: World, offline: dict[str, Session], who: str
) -> None:
    client = world.client_for(who)
    own = offline["b1"] if who == "charlie" else offline["a1"]
    foreign = offline["a1"] if who == "charlie" else offline["b1"]
    for data in (
        {"action": "pause", "session": [str(own.id), str(foreign.id)], "confirm": "1"},
        {"action": "pause", "session": [str(foreign.id)]},
        {"row": f"pause:{foreign.id}"},
        {"row": f"delete:{foreign.id}", "confirm": "1"},
    ):
        assert client.post(BULK, data).status_code == 404, data
    assert client.post(BULK, {"action": "pause", "session": ["not-a-uuid"]}).status_code == 404
    assert client.post(BULK, {"action": "explode", "session": [str(own.id)]}).status_code == 404
    assert not AuditEvent.objects.filter(action__startswith="session.").exists()
    assert not AuditEvent.objects.filter(action="job.start").exists()


def test_roles_decide_per_session(world: World, offline: dict[str, Session]) -> None:
    ids = [str(offline["a1"].id)]
    viewer = world.client_for("carol").post(BULK, {"action": "resume", "session": ids}).content.decode()
    assert "Resume 0 sessions?" in viewer
    assert "you are viewer in Space A; members may resume" in viewer
    member = world.client_for("bob").post(BULK, {"action": "delete", "session": ids, "confirm": "1"})
    assert member.status_code == 302
    assert Session.objects.filter(pk=offline["a1"].pk).exists()
    assert not AuditEvent.objects.filter(action="job.start").exists()
    admin = world.client_for("alice").post(BULK, {"action": "delete", "session": ids}).content.decode()
    assert "Delete 1 session?" in admin
    assert "artifacts and row are deleted" in admin


def test_nothing_ticked_and_too_many_are_messages(world: World, offline: dict[str, Session]) -> None:
    client = world.client_for("bob")
    empty = client.post(BULK, {"action": "pause"}, follow=True)
    assert "Tick at least one session first." in empty.content.decode()
    outside = client.post(BULK, {"action": "pause", "session": [str(offline["a1"].id)], "next": "https://evil.test/"})
    assert "evil.test" not in outside.content.decode()  # Cancel and the return go to the list
    assert f'href="{LIST}"' in outside.content.decode()
    many = [str(offline["a1"].id)] + [str(uuid.uuid4()) for _ in range(MAX_SESSIONS)]
    too_many = client.post(BULK, {"action": "pause", "session": many}, follow=True).content.decode()
    assert f"At most {MAX_SESSIONS} sessions at once" in too_many


def test_the_actions_need_the_csrf_token(world: World, offline: dict[str, Session]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.bob)
    data = {"action": "pause", "session": [str(offline["a1"].id)], "confirm": "1"}
    assert client.post(BULK, data).status_code == 403
    page = client.get(LIST).content.decode()
    assert 'name="csrfmiddlewaretoken"' in page
    token = client.cookies["csrftoken"].value
    answered = client.post(BULK, {**data, "csrfmiddlewaretoken": token})
    assert answered.status_code == 302  # tried (the engine is not there: a message says so)


def test_a_row_pause_fails_in_words_when_the_engine_is_away(world: World, offline: dict[str, Session]) -> None:
    page = world.client_for("bob").post(BULK, {"row": f"pause:{offline['a1'].id}"}, follow=True).content.decode()
    assert "a-run:" in page
    assert "message-error" in page


def test_the_list_offers_actions_only_where_the_role_allows(world: World, offline: dict[str, Session]) -> None:
    viewer = world.client_for("carol").get(LIST).content.decode()
    assert 'name="session"' not in viewer
    assert "With the ticked sessions" not in viewer
    member = world.client_for("bob").get(LIST).content.decode()
    assert f'id="pick-{offline["a1"].id}"' in member
    assert f'value="pause:{offline["a1"].id}"' in member
    assert f'value="delete:{offline["a1"].id}"' not in member  # admins delete
    admin = world.client_for("alice").get(LIST).content.decode()
    assert f'value="delete:{offline["a1"].id}"' in admin
    assert 'class="state state-running"' in admin
    assert 'class="state state-paused"' in admin


def test_out_of_date_is_its_own_badge(world: World, offline: dict[str, Session]) -> None:
    Session.objects.filter(pk=offline["a1"].pk).update(stale_at=timezone.now())
    page = world.client_for("alice").get(LIST, {"state": "stale"}).content.decode()
    assert 'class="state state-stale"' in page
    assert "out of date" in page
    assert "a-paused" not in page


def test_labels_are_edited_on_the_page_and_filter_the_list(world: World, offline: dict[str, Session]) -> None:
    client = world.client_for("bob")
    url = reverse("sandboxes:session_labels", args=[offline["a1"].id])
    client.post(url, {"labels": "nightly team=ml nightly"})
    session = Session.objects.get(pk=offline["a1"].pk)
    assert session.label_list == ["nightly", "team=ml"]
    refused = client.post(url, {"labels": "ok bad label<script>"}, follow=True).content.decode()
    assert "is not allowed" in refused
    assert Session.objects.get(pk=offline["a1"].pk).label_list == ["nightly", "team=ml"]
    assert world.client_for("carol").post(url, {"labels": "x"}).status_code == 403
    assert world.client_for("charlie").post(url, {"labels": "x"}).status_code == 404
    listed = client.get(LIST, {"label": "team=ml"}).content.decode()
    assert "a-run" in listed
    assert "a-paused" not in listed
    assert client.get(LIST, {"label": "team"}).content.decode().count("<code>a-") == 0  # whole labels only
    assert AuditEvent.objects.filter(action="session.update").count() == 1


def test_labels_from_the_api_are_checked(world: World, offline: dict[str, Session]) -> None:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    url = f"/api/v1/spaces/{world.space_a.id}/sessions/new-one/resolve"
    for labels, words in ((["ok", "no spaces"], "is not allowed"), ("nightly", "wrong type"), ([1], "must be")):
        answer = Client().post(
            url,
            json.dumps({"labels": labels}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 400, labels
        assert words in answer.json()["error"]["message"]
    assert not Session.objects.filter(key="new-one").exists()


def test_keep_awake_is_bounded_and_shown(world: World, offline: dict[str, Session]) -> None:
    client = world.client_for("bob")
    url = reverse("sandboxes:session_keep_awake", args=[offline["a1"].id])
    Session.objects.filter(pk=offline["a1"].pk).update(last_activity=timezone.now())
    assert "idles in" in client.get(LIST).content.decode()
    client.post(url, {"hours": "2"})
    until = Session.objects.get(pk=offline["a1"].pk).keep_awake_until
    assert until is not None
    assert timedelta(hours=1.9) < until - timezone.now() <= timedelta(hours=2)
    assert "kept awake" in client.get(LIST).content.decode()
    assert "Choose how long" in client.post(url, {"hours": "500"}, follow=True).content.decode()
    client.post(url, {"hours": "0"})
    assert Session.objects.get(pk=offline["a1"].pk).keep_awake_until is None


def test_usage_cells_only_for_the_users_sessions(world: World, offline: dict[str, Session]) -> None:
    usage = reverse("sandboxes:session_usage")
    ids = {"id": [str(offline["a1"].id), str(offline["b1"].id), "junk"]}
    body = world.client_for("bob").get(usage, ids).content.decode()
    assert f'id="cpu-{offline["a1"].id}"' in body
    assert str(offline["b1"].id) not in body
    page = world.client_for("bob").get(LIST).content.decode()
    assert f"{usage}?id={offline['a1'].id}" in page  # the running rows' figures are fetched after the page


@pytest.fixture
def two_live(world: World, session_config: SandboxConfig) -> list[Session]:
    runtime = Runtime()
    return [runtime.resolve(world.space_a, key, labels=["bulk"]).session for key in ("bulk-1", "bulk-2")]


@pytest.mark.docker
def test_two_sessions_pause_and_resume_in_one_action_each(world: World, two_live: list[Session]) -> None:
    client = world.client_for("bob")
    ids = [str(session.id) for session in two_live]
    assert all(session.label_list == ["bulk"] for session in two_live)
    page = client.get(LIST, {"label": "bulk"}).content.decode()
    assert page.count('name="session"') == 2
    usage = client.get(reverse("sandboxes:session_usage"), {"id": ids}).content.decode()
    assert usage.count(" %</span>") == 2  # a CPU figure for each running sandbox
    confirm = client.post(BULK, {"action": "pause", "session": ids}).content.decode()
    assert "Pause 2 sessions?" in confirm
    assert 'hx-post="' + BULK in confirm  # with HTMX the job's progress replaces it
    started = client.post(BULK, {"action": "pause", "session": ids, "confirm": "1"})
    job = AdminJob.objects.get(kind="sessions.bulk")
    assert started.status_code == 302
    assert started["Location"] == job.get_absolute_url()  # without JavaScript: the job's page
    assert Session.objects.get(pk=ids[0]).state == SessionState.RUNNING  # nothing ran in the request
    finished = run_to_end(str(job.id))
    assert finished.status == JobStatus.SUCCEEDED, finished.error
    assert finished.space == world.space_a
    assert [(row["name"], row["status"], row["message"]) for row in finished.result["outcomes"]] == [
        ("bulk-1", "done", "paused"),
        ("bulk-2", "done", "paused"),
    ]
    page = client.get(job.get_absolute_url()).content.decode()
    assert "bulk-1: done: paused" in page  # the log, line per session
    backend = get_backend(two_live[0].config)
    for session in two_live:
        session.refresh_from_db()
        assert session.state == SessionState.PAUSED
        assert backend.get(session.sandbox_id).state == SandboxState.PAUSED
    inline = client.post(BULK, {"action": "resume", "session": ids, "confirm": "1"}, headers={"HX-Request": "true"})
    body = inline.content.decode()
    assert 'id="job-status"' in body
    assert "every 2s" in body  # polls the job until it ends
    resumed = run_to_end(str(AdminJob.objects.filter(kind="sessions.bulk").latest("created").id))
    assert resumed.status == JobStatus.SUCCEEDED, resumed.error
    assert resumed.result["done"] == 2
    polled = client.get(resumed.get_absolute_url(), headers={"HX-Request": "true", "HX-Target": "job-status"})
    assert polled.status_code == 286  # finished: HTMX stops polling
    assert "bulk-2" in polled.content.decode()
    for session in two_live:
        session.refresh_from_db()
        assert session.state == SessionState.RUNNING
        assert backend.get(session.sandbox_id).state == SandboxState.RUNNING
    assert AuditEvent.objects.filter(action="session.pause").count() == 2
    assert AuditEvent.objects.filter(action="session.resume").count() == 2
    # Kept awake, the first stays running though idle for long; the second is idled.
    Session.objects.filter(pk__in=ids).update(last_activity=timezone.now() - timedelta(days=1))
    client.post(reverse("sandboxes:session_keep_awake", args=[ids[0]]), {"hours": "1"})
    assert idle_sweep() == 1
    assert backend.get(two_live[0].sandbox_id).state == SandboxState.RUNNING
    assert backend.get(two_live[1].sandbox_id).state == SandboxState.PAUSED


@pytest.mark.docker
def test_a_partial_failure_names_the_failed_session_and_keeps_the_rest(world: World, two_live: list[Session]) -> None:
    away = make_config(world.space_a, name="away", endpoint="unix:///tmp/no-such-docker.sock")
    lost = Session.objects.create(space=world.space_a, key="engine-away", config=away, state="running")
    ids = [str(two_live[0].id), str(lost.id), str(two_live[1].id)]
    world.client_for("bob").post(BULK, {"action": "pause", "session": ids, "confirm": "1"})
    job = run_to_end(str(AdminJob.objects.get(kind="sessions.bulk").id))
    assert job.status == JobStatus.FAILED
    assert "Pause: 1 of 3 failed (engine-away:" in job.error
    outcomes = {row["name"]: row["status"] for row in job.result["outcomes"]}
    assert outcomes == {"bulk-1": "done", "engine-away": "failed", "bulk-2": "done"}
    assert (job.result["done"], job.result["failed"], job.result["skipped"]) == (2, 1, 0)
    for session in two_live:
        session.refresh_from_db()
        assert session.state == SessionState.PAUSED  # the one failure stopped neither


def test_the_job_plans_again_when_it_runs(world: World, offline: dict[str, Session]) -> None:
    """A session deleted, or a state changed, between the confirmation and the job: said, not done."""
    ids = [str(offline["a1"].id), str(offline["a2"].id)]
    world.client_for("alice").post(BULK, {"action": "delete", "session": ids, "confirm": "1"})
    job = AdminJob.objects.get(kind="sessions.bulk")
    assert job.params == {"action": "delete", "sessions": ids}
    Session.objects.filter(pk=offline["a2"].pk).delete()
    finished = run_to_end(str(job.id))
    rows = {row["name"]: row for row in finished.result["outcomes"]}
    assert rows[ids[1]]["status"] == "skipped"
    assert rows[ids[1]]["message"] == "it no longer exists"
    assert rows["a-run"]["status"] in {"done", "failed"}  # the engine is away: said either way
    assert finished.result["skipped"] == 1


def test_a_job_over_two_spaces_is_followed_by_its_starter_only(world: World, offline: dict[str, Session]) -> None:
    from console.models import Membership, Role

    Membership.objects.create(user=world.bob, space=world.space_b, role=Role.VIEWER)
    ids = [str(offline["a1"].id), str(offline["b1"].id)]
    confirm = world.client_for("bob").post(BULK, {"action": "pause", "session": ids}).content.decode()
    assert "Pause 1 session?" in confirm  # a viewer in B
    assert "you are viewer in Space B; members may pause" in confirm
    world.client_for("bob").post(BULK, {"action": "pause", "session": ids, "confirm": "1"})
    job = AdminJob.objects.get(kind="sessions.bulk")
    assert job.space is None
    assert world.client_for("bob").get(job.get_absolute_url()).status_code == 200
    assert world.client_for("charlie").get(job.get_absolute_url()).status_code == 404
    finished = run_to_end(str(job.id))
    rows = {row["name"]: row["status"] for row in finished.result["outcomes"]}
    assert rows["b-secret"] == "skipped"
    assert rows["a-run"] == "failed"  # the engine is away
    assert finished.status == JobStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_a_session_deleted_while_the_job_waits_for_it_is_skipped_not_failed(
    world: World, offline: dict[str, Session]
) -> None:
    """Deleted by someone else (a second submit, its own delete) after the job read its rows:
    the job says it no longer exists, as when it was gone before the job began."""
    session = offline["a1"]
    runtime = Runtime()
    _, lock, _ = runtime.keys(session)
    with lifecycle_lock(runtime.store, lock, holder="another delete"):
        world.client_for("alice").post(BULK, {"action": "delete", "session": [str(session.id)], "confirm": "1"})
        job = AdminJob.objects.get(kind="sessions.bulk")
        deadline = time.monotonic() + 30
        while AdminJob.objects.get(pk=job.pk).status != JobStatus.RUNNING:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.02)
        time.sleep(1)  # the job has read its sessions and waits for this lock
        Session.objects.filter(pk=session.pk).delete()
    finished = run_to_end(str(job.id))
    assert [(row["name"], row["status"], row["message"]) for row in finished.result["outcomes"]] == [
        ("a-run", "skipped", "it no longer exists")
    ]
    assert finished.status == JobStatus.SUCCEEDED, finished.error
