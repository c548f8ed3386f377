"""A GET never changes a sandbox: not the agent API's, not a page's, on the real Docker engine.

The API's file reads answer a session whose sandbox is paused, stopped or gone with a 409
(`session_not_running`) that names the POST that wakes it; an unknown session key is a 404
that makes no row and no container. The last test walks every GET route of the URLconf
(pages and API, from `get_resolver()`, as the authorization sweep does) against a paused
session and checks the engine after each request.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from django.core.files.base import ContentFile

from console.models import AuditEvent
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import META_INSTALLATION, ErrorKind, ListQuery, RemoteError, SandboxState
from sandboxes.models import Artifact, BackgroundCommand, CommandStatus, SandboxConfig, Session, Terminal
from sandboxes.sessions.provisioning import backend_for
from sandboxes.sessions.runtime import Runtime
from tests.console.test_authorization_sweep import FILLERS, Personas, build_target, http_routes
from tests.personas import World
from tests.sandboxes.api.test_agent_api import DOC, validate

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

KEY = "get-never-wakes"


class Agent:
    def __init__(self, space_id: Any, token: str) -> None:
        from django.test import Client

        self.client = Client()
        self.base = f"/api/v1/spaces/{space_id}/sessions"
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, suffix: str, key: str = KEY, **params: Any) -> Any:
        return self.client.get(f"{self.base}/{key}/{suffix}".rstrip("/"), params, headers=self.headers)

    def post(self, suffix: str, body: str = "", key: str = KEY) -> Any:
        return self.client.post(
            f"{self.base}/{key}/{suffix}", body, content_type="application/json", headers=self.headers
        )


@pytest.fixture
def agent(world: World, session_config: SandboxConfig) -> Agent:
    _, token = do_create_api_token(world.space_a, name="get-never-wakes", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


def engine_view(session: Session) -> tuple[Any, ...]:
    """The session's row and its sandbox as the engine says (None: no such container)."""
    session.refresh_from_db()
    backend = backend_for(session.config)
    try:
        state = backend.get(session.sandbox_id).state
    except RemoteError as exc:
        if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
            raise
        state = None  # gone: a state here
    return (session.state, session.sandbox_id, session.binding_version, state)


def installation_sandboxes(config: SandboxConfig) -> set[str]:
    from django.conf import settings

    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID})
    return {info.sandbox_id for info in backend_for(config).iter_sandboxes(query)}


def paused_session(agent: Agent) -> Session:
    resolved = agent.post("resolve")
    assert resolved.status_code == 200, resolved.content
    ran = agent.post("exec", '{"shell": "echo kept > /workspace/notes.txt"}')
    assert ran.json()["exit_code"] == 0, ran.content
    session = Session.objects.select_related("config", "space").get(key=KEY)
    Runtime().pause(session, actor=Actor(user=None))
    assert engine_view(session)[3] == SandboxState.PAUSED
    return session


def assert_not_running(response: Any, route: str) -> None:
    assert response.status_code == 409, (response.status_code, response.content)
    validate(response, "/spaces/{space_id}/sessions/{key}/" + route, "get")
    assert (
        "session_not_running"
        in DOC["paths"]["/spaces/{space_id}/sessions/{key}/" + route]["get"]["responses"]["409"]["description"]
    )
    error = response.json()["error"]
    assert error["code"] == "session_not_running"
    assert error["retryable"] is False
    assert "POST" in error["message"]
    assert "/resolve" in error["message"]


def test_a_get_of_a_paused_sessions_files_answers_409_and_leaves_it_paused(agent: Agent) -> None:
    session = paused_session(agent)
    before = engine_view(session)
    assert_not_running(agent.get("files", path=""), "files")
    assert_not_running(agent.get("files/content", path="notes.txt"), "files/content")
    assert engine_view(session) == before  # still paused, same sandbox, same binding
    assert not AuditEvent.objects.filter(action="session.resume").exists()
    # The message's POST wakes it; the same GETs then answer.
    assert agent.post("resolve").status_code == 200
    assert engine_view(session)[3] == SandboxState.RUNNING
    listing = agent.get("files", path="")
    assert listing.status_code == 200, listing.content
    assert "notes.txt" in {entry["name"] for entry in listing.json()["entries"]}
    assert agent.get("files/content", path="notes.txt").content == b"kept\n"


def test_a_get_of_a_session_whose_sandbox_is_gone_makes_no_new_one(agent: Agent, session_config: SandboxConfig) -> None:
    assert agent.post("resolve").status_code == 200
    session = Session.objects.select_related("config").get(key=KEY)
    old = session.sandbox_id
    backend_for(session.config).delete(old)  # gone behind the console's back
    assert_not_running(agent.get("files", path=""), "files")
    assert_not_running(agent.get("files/content", path="notes.txt"), "files/content")
    session.refresh_from_db()
    assert session.sandbox_id == old
    assert installation_sandboxes(session_config) == set()


def test_a_get_on_an_unknown_session_key_creates_no_row_and_no_container(
    agent: Agent, session_config: SandboxConfig
) -> None:
    before = installation_sandboxes(session_config)
    for suffix, params in (("", {}), ("files", {"path": ""}), ("files/content", {"path": "x"}), ("artifacts", {})):
        response = agent.get(suffix, key="never-seen", **params)
        assert response.status_code == 404, (suffix, response.content)
        assert response.json()["error"]["code"] == "not_found"
    assert not Session.objects.exists()
    assert installation_sandboxes(session_config) == before


def test_a_running_sessions_files_are_read_by_get(agent: Agent) -> None:
    assert agent.post("resolve").status_code == 200
    assert agent.post("exec", '{"shell": "echo hi > /workspace/out.txt"}').json()["exit_code"] == 0
    session = Session.objects.select_related("config").get(key=KEY)
    before = engine_view(session)
    assert agent.get("files/content", path="out.txt").content == b"hi\n"
    assert "out.txt" in {e["name"] for e in agent.get("files", path="").json()["entries"]}
    assert engine_view(session) == before


# --- Every GET route of the URLconf ---------------------------------------------------------

# Parameters that make the read views read (browse a folder, a file, a port), on every route.
READ_QUERY = "browse=1&path=notes.txt&port=8080"


def test_no_get_route_wakes_a_paused_session(world: World, agent: Agent, session_config: SandboxConfig) -> None:
    session = paused_session(agent)
    target = build_target(world)  # every other kind of object the URL keywords name
    artifact = Artifact(session=session, collection=uuid.uuid4(), path="output/a.txt", size=2, sha256="0" * 64)
    artifact.file.save("a.txt", ContentFile(b"hi"), save=False)
    artifact.save()
    command = BackgroundCommand.objects.create(session=session, shell="true", status=CommandStatus.EXITED, exit_code=0)
    terminal = Terminal.objects.create(session=session, user=world.bob)
    target = dataclasses.replace(
        target,
        session_id=str(session.id),
        session_key=session.key,
        artifact_id=str(artifact.id),
        command_id=str(command.id),
        terminal_id=str(terminal.id),
        config_id=str(session_config.id),
        backend_id=str(session_config.backend_id),
    )
    personas = Personas(world)
    routes = [r for r in http_routes() if all(k in FILLERS for k in r.kwargs)]
    assert len(routes) > 50  # the walk found the URLconf
    before = engine_view(session)
    sessions = Session.objects.count()
    sandboxes = installation_sandboxes(session_config)
    woke: list[str] = []
    reached_files = 0
    for route in routes:
        url = target.url(route)
        url += ("&" if "?" in url else "?") + READ_QUERY
        headers = {"authorization": f"Bearer {target.token_a}"} if route.is_api else {}
        response = personas.client("control", route).get(url, headers=headers)
        if route.name in ("api:files", "api:file_content"):
            reached_files += response.status_code == 409
        if (after := engine_view(session)) != before:
            woke.append(f"GET {route.name} ({response.status_code}): {before} -> {after}")
            Runtime().pause(session, actor=Actor(user=None))
            before = engine_view(session)
    assert not woke, "\n".join(woke)
    assert reached_files == 2  # the file reads got past access and lookup to the sandbox check
    assert Session.objects.count() == sessions
    assert installation_sandboxes(session_config) == sandboxes
