"""The Sessions UI: personas, filters, the binding inspector, actions, files, on real Docker."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from console.jobs import run_job
from console.models import AdminJob, AuditEvent
from sandboxes.backends.base import ExecRequest, SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import SandboxConfig, Session, SessionState
from sandboxes.sessions.runtime import Runtime
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db


@pytest.fixture
def offline_session(world: World) -> Session:
    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    session: Session = Session.objects.create(space=world.space_a, key="offline-1", config=config)
    return session


def session_urls(session: Session) -> dict[str, str]:
    return {
        "detail": reverse("sandboxes:session_detail", args=[session.id]),
        "pause": reverse("sandboxes:session_action", args=[session.id, "pause"]),
        "resume": reverse("sandboxes:session_action", args=[session.id, "resume"]),
        "rebuild": reverse("sandboxes:session_action", args=[session.id, "rebuild"]),
        "delete": reverse("sandboxes:session_action", args=[session.id, "delete"]),
        "upload": reverse("sandboxes:session_upload", args=[session.id]),
        "download": reverse("sandboxes:session_download", args=[session.id]) + "?path=x",
        "collect": reverse("sandboxes:session_collect", args=[session.id]),
    }


@pytest.mark.parametrize("view", ["detail", "pause", "resume", "rebuild", "delete", "upload", "download", "collect"])
def test_outsider_gets_404_on_every_session_page(world: World, offline_session: Session, view: str) -> None:
    client = world.client_for("charlie")
    # POST-only routes answer GET with 405 before any lookup, revealing nothing; read-only
    # pages (detail, download) answer POST with 405 likewise.
    assert client.get(session_urls(offline_session)[view]).status_code in (404, 405)
    assert client.post(session_urls(offline_session)[view]).status_code in (404, 405)


@pytest.mark.parametrize("view", ["pause", "resume", "rebuild", "delete", "upload", "collect"])
def test_viewers_cannot_act_on_sessions(world: World, offline_session: Session, view: str) -> None:
    assert world.client_for("carol").post(session_urls(offline_session)[view]).status_code == 403
    assert not AuditEvent.objects.filter(action__startswith="session.").exists()


def test_members_cannot_delete_sessions(world: World, offline_session: Session) -> None:
    assert world.client_for("bob").post(session_urls(offline_session)["delete"]).status_code == 403
    assert Session.objects.filter(pk=offline_session.pk).exists()


def test_viewer_sees_the_session_and_an_offline_backend_is_a_message(world: World, offline_session: Session) -> None:
    page = world.client_for("carol").get(session_urls(offline_session)["detail"])
    assert page.status_code == 200
    assert "Binding inspector" in page.content.decode()
    assert "Viewers do not browse session files" in page.content.decode()
    assert "on: made with this session's next sandbox" in page.content.decode()  # none created yet
    response = world.client_for("bob").post(session_urls(offline_session)["resume"], follow=True)
    assert "The backend said unavailable" in response.content.decode()


def test_session_list_filters_scope_and_query_bound(
    world: World, offline_session: Session, django_assert_max_num_queries: Any
) -> None:
    config_b = make_config(world.space_b)
    Session.objects.create(space=world.space_b, key="b-secret", config=config_b)
    for i in range(200):
        Session.objects.create(space=world.space_a, key=f"bulk-{i:03d}", config=offline_session.config)
    client = world.client_for("alice")
    with django_assert_max_num_queries(8):
        page = client.get(reverse("sandboxes:session_list"))
    assert "b-secret" not in page.content.decode()
    assert (
        world.client_for("charlie").get(reverse("sandboxes:session_list"), {"space": str(world.space_a.id)}).status_code
        == 404
    )
    filtered = client.get(
        reverse("sandboxes:session_list"), {"q": "offline"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="session-results"
    )
    body = filtered.content.decode()
    assert "offline-1" in body
    assert "bulk-001" not in body
    assert "<html" not in body
    Session.objects.filter(pk=offline_session.pk).update(stale_at="2026-01-01T00:00:00Z")
    stale = client.get(reverse("sandboxes:session_list"), {"state": "stale"}).content.decode()
    assert "offline-1" in stale
    assert "bulk-001" not in stale


@pytest.fixture
def live_session(world: World, session_config: SandboxConfig) -> Session:
    return Runtime().resolve(world.space_a, "ui-1").session


@pytest.mark.docker
def test_pause_and_resume_from_the_ui_keep_the_files(world: World, live_session: Session) -> None:
    client = world.client_for("bob")
    urls = session_urls(live_session)
    Runtime().exec(live_session, ExecRequest(shell="echo survived > /workspace/notes.txt"))
    client.post(urls["pause"])
    live_session.refresh_from_db()
    assert live_session.state == SessionState.PAUSED
    assert get_backend(live_session.config).get(live_session.sandbox_id).state == SandboxState.PAUSED
    page = client.get(urls["detail"]).content.decode()
    assert live_session.sandbox_id in page
    assert "Paused" in page
    assert f'kept in <span class="copyable"><code>{live_session.workspace_volume}</code>' in page
    client.post(urls["resume"])
    live_session.refresh_from_db()
    assert live_session.state == SessionState.RUNNING
    browse = client.get(urls["detail"], {"browse": "1"}).content.decode()
    assert "notes.txt" in browse
    download = client.get(reverse("sandboxes:session_download", args=[live_session.id]), {"path": "notes.txt"})
    assert download.content == b"survived\n"
    assert AuditEvent.objects.filter(action__in=["session.pause", "session.resume"]).count() == 2


@pytest.mark.docker
def test_upload_to_input_and_collect_output_from_the_ui(world: World, live_session: Session) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = world.client_for("bob")
    urls = session_urls(live_session)
    client.post(urls["upload"], {"file": SimpleUploadedFile("brief.md", b"# brief\n")})
    result = Runtime().exec(
        live_session, ExecRequest(shell="cat input/brief.md > output/copy.md; stat -c %a input/brief.md")
    )
    assert result.stdout == b"444\n"
    response = client.post(urls["collect"], follow=True)
    assert "Collected 1 file(s)" in response.content.decode()
    artifact = live_session.artifacts.get()
    downloaded = client.get(reverse("sandboxes:artifact_download", args=[live_session.id, artifact.id]))
    assert downloaded.getvalue() == b"# brief\n"


@pytest.mark.docker
def test_rebuild_and_delete_confirm_first(world: World, live_session: Session) -> None:
    client = world.client_for("alice")
    urls = session_urls(live_session)
    assert "Rebuild session ui-1?" in client.get(urls["rebuild"]).content.decode()
    old = live_session.sandbox_id
    client.post(urls["rebuild"])
    live_session.refresh_from_db()
    assert live_session.sandbox_id != old
    assert "Delete session ui-1?" in client.get(urls["delete"]).content.decode()
    client.post(urls["delete"])
    job = AdminJob.objects.get(kind="sandboxes.teardown_session", params__target=str(live_session.pk))
    run_job(str(job.id))  # on_commit does not fire inside a test transaction
    assert not Session.objects.filter(pk=live_session.pk).exists()


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db(transaction=True)  # the output pump writes from its own thread
def test_background_command_from_the_session_page(world: World, session_config: SandboxConfig) -> None:
    import time

    from sandboxes.models import BackgroundCommand

    session = Runtime().resolve(world.space_a, "ui-cmd").session
    client = world.client_for("bob")
    response = client.post(reverse("sandboxes:command_start", args=[session.id]), {"shell": "echo from-the-page"})
    command = BackgroundCommand.objects.get(session=session)
    assert response["Location"] == reverse("sandboxes:command_detail", args=[session.id, command.id])
    url = reverse("sandboxes:command_detail", args=[session.id, command.id])
    deadline = time.monotonic() + 30
    while True:
        partial = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="command-output")
        if partial.status_code == 286:  # finished: HTMX stops polling
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "from-the-page" in partial.content.decode()
    page = client.get(session.get_absolute_url()).content.decode()
    assert "echo from-the-page" in page
    assert world.client_for("carol").get(url).status_code == 403
    assert world.client_for("charlie").get(url).status_code == 404


def _sandbox_state(session: Session) -> tuple[Any, ...]:
    session.refresh_from_db()
    info = get_backend(session.config).get(session.sandbox_id)
    return (session.state, session.sandbox_id, session.binding_version, info.state)


@pytest.mark.docker
def test_browsing_a_paused_session_offers_a_resume_and_leaves_it_paused(world: World, live_session: Session) -> None:
    client = world.client_for("bob")
    urls = session_urls(live_session)
    Runtime().exec(live_session, ExecRequest(shell="echo kept > /workspace/notes.txt"))
    client.post(urls["pause"])
    before = _sandbox_state(live_session)
    assert before[3] == SandboxState.PAUSED
    page = client.get(urls["detail"], {"browse": "1", "path": "output"}).content.decode()
    assert "Resume and browse" in page
    assert 'name="path" value="output"' in page
    assert _sandbox_state(live_session) == before  # the GET resumed nothing
    # The offer is a POST: it resumes and comes back to the listing.
    response = client.post(urls["resume"], {"browse": "1", "path": ""})
    assert response.status_code == 302
    assert "browse=1" in response["Location"]
    assert "notes.txt" in client.get(response["Location"]).content.decode()
    assert _sandbox_state(live_session)[3] == SandboxState.RUNNING


@pytest.mark.docker
def test_downloading_from_a_paused_session_leaves_it_paused(world: World, live_session: Session) -> None:
    client = world.client_for("bob")
    urls = session_urls(live_session)
    Runtime().exec(live_session, ExecRequest(shell="echo kept > /workspace/notes.txt"))
    client.post(urls["pause"])
    before = _sandbox_state(live_session)
    download = reverse("sandboxes:session_download", args=[live_session.id])
    response = client.get(download, {"path": "notes.txt"})
    assert response.status_code == 302  # back to the session page, with the resume offer
    assert "browse=1" in response["Location"]
    assert _sandbox_state(live_session) == before
    assert not AuditEvent.objects.filter(action="session.resume").exists()


@pytest.mark.docker
def test_browsing_a_session_whose_sandbox_is_gone_creates_none(world: World, live_session: Session) -> None:
    client = world.client_for("bob")
    urls = session_urls(live_session)
    old = live_session.sandbox_id
    get_backend(live_session.config).delete(old)  # gone behind the console's back
    page = client.get(urls["detail"], {"browse": "1"}).content.decode()
    assert "Resume and browse" in page
    live_session.refresh_from_db()
    assert live_session.sandbox_id == old  # no new sandbox was made by the GET
    download = client.get(reverse("sandboxes:session_download", args=[live_session.id]), {"path": "x"})
    assert download.status_code == 302
    live_session.refresh_from_db()
    assert live_session.sandbox_id == old
