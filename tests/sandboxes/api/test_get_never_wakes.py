"""A GET never changes a sandbox: not the agent API's, not a page's, on the real Docker engine.

The API's file reads answer a session whose sandbox is paused, stopped or gone with a 409
(`session_not_running`) that names the POST that wakes it; an unknown session key is a 404
that makes no row and no container. The last test walks every GET route of the URLconf
(pages and API, from `get_resolver()`, as the authorization sweep does) against a paused
session and checks the engine after each request.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import docker
import pytest
from django.core.files.base import ContentFile
from django.utils import timezone

from console.models import AuditEvent
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.base import META_INSTALLATION, ErrorKind, ListQuery, RemoteError, SandboxState
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import Artifact, BackgroundCommand, CommandStatus, SandboxConfig, Session, Terminal
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
    backend = get_backend(session.config)
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
    return {info.sandbox_id for info in get_backend(config).iter_sandboxes(query)}


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
    get_backend(session.config).delete(old)  # gone behind the console's back
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


# A file GET racing a pause answers like a paused session: files_view checks the sandbox is
# running, then execs the helper in it, and a pause landing between the two (the idle sweep, a
# member's Pause, the engine) makes the exec fail on a paused container. The answer is still the
# documented 409 session_not_running, never a 500, never a wake.


def _thaw(container_id: str) -> None:
    """Thaw the container's freezer cgroup (v1 or v2) behind the engine's back. An exec whose
    `runc init` joined the cgroup as it froze stays frozen, and the engine then holds the
    container's lock for ever (docker/for-linux#891): every later inspect, unpause or removal
    of it hangs, and with them the rest of the run. Thawing lets that exec finish."""
    roots = [Path("/sys/fs/cgroup/freezer/docker"), Path("/sys/fs/cgroup/docker"), Path("/sys/fs/cgroup/system.slice")]
    for path in (roots[0] / container_id / "freezer.state", roots[1] / container_id / "cgroup.freeze"):
        if path.exists():
            path.write_text("THAWED" if path.name == "freezer.state" else "0")
    scope = roots[2] / f"docker-{container_id}.scope" / "cgroup.freeze"
    if scope.exists():
        scope.write_text("0")


def _unpause(container: Any) -> None:
    """Unpause, thawing the cgroup first if the engine does not answer within 5 s."""
    done, thawed = threading.Event(), threading.Event()

    def rescue() -> None:
        if not done.is_set():
            _thaw(container.id)
            thawed.set()

    watchdog = threading.Timer(5, rescue)
    watchdog.start()
    try:
        container.unpause()
    except docker.errors.APIError:
        if not thawed.is_set():  # the thaw may leave the engine nothing to resume
            raise
    finally:
        done.set()
        watchdog.cancel()


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_a_file_get_racing_a_pause_answers_session_not_running(agent: Agent) -> None:
    assert agent.post("resolve").status_code == 200
    session = Session.objects.get(key=KEY)
    container = docker.from_env().containers.get(session.sandbox_id)
    stop = threading.Event()

    def flip() -> None:  # running for a moment, then paused for a while (as a Pause stays)
        while not stop.is_set():
            container.pause()
            time.sleep(0.3)
            _unpause(container)
            time.sleep(0.005)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    seen: Counter[tuple[int, str]] = Counter()
    try:
        for _ in range(40):
            response = agent.get("files", path="")
            code = response.json().get("error", {}).get("code", "") if response.status_code != 200 else ""
            seen[(response.status_code, code)] += 1
    finally:
        stop.set()
        flipper.join()
    print(dict(seen))
    wrong: dict[Any, int] = {k: n for k, n in seen.items() if k[0] != 200 and k != (409, "session_not_running")}
    assert not wrong, f"answers other than 200 and 409 session_not_running: {dict(seen)}"


# No safe request (GET, HEAD, OPTIONS) changes a session or its sandbox: a paused session, one
# whose sandbox is gone behind the console's back (where a wake would be a rebuild), one stopped
# by the engine; neither the row's last_activity (an old value, so a touch shows) nor the
# session's audit trail.
SAFE_METHODS = ("get", "head", "options")
LONG_AGO = timezone.now() - datetime.timedelta(days=2)


def snapshot(session: Session) -> tuple[Any, ...]:
    session.refresh_from_db()
    return (
        *engine_view(session),
        session.last_activity,
        Terminal.objects.filter(session=session).count(),
        AuditEvent.objects.filter(target_id=str(session.id)).count(),
    )


def walk_safe_methods(world: World, session: Session, config: SandboxConfig, restore: Any) -> list[str]:
    target = build_target(world)
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
        config_id=str(config.id),
        backend_id=str(config.backend_id),
    )
    Session.objects.filter(pk=session.pk).update(last_activity=LONG_AGO)
    personas = Personas(world)
    routes = [r for r in http_routes() if all(k in FILLERS for k in r.kwargs)]
    assert len(routes) > 50
    before = snapshot(session)
    sessions = Session.objects.count()
    sandboxes = installation_sandboxes(config)
    changed: list[str] = []
    for route in routes:
        url = target.url(route)
        url += ("&" if "?" in url else "?") + READ_QUERY
        headers = {"authorization": f"Bearer {target.token_a}"} if route.is_api else {}
        for method in SAFE_METHODS:
            client = personas.client("control", route)
            response = getattr(client, method)(url, headers=headers)
            assert response.status_code < 500, (method, route.name, response.status_code)
            if (after := snapshot(session)) != before:
                changed.append(f"{method.upper()} {route.name} ({response.status_code}): {before} -> {after}")
                restore(session)
                Session.objects.filter(pk=session.pk).update(last_activity=LONG_AGO)
                before = snapshot(session)
    assert Session.objects.count() == sessions
    if installation_sandboxes(config) != sandboxes:
        changed.append(f"sandboxes of the installation: {sandboxes} -> {installation_sandboxes(config)}")
    return changed


def test_no_safe_request_changes_a_paused_session(world: World, agent: Agent, session_config: SandboxConfig) -> None:
    session = paused_session(agent)

    def repause(s: Session) -> None:
        Runtime().pause(s, actor=Actor(user=None))

    changed = walk_safe_methods(world, session, session_config, repause)
    assert not changed, "\n".join(changed)


def test_no_safe_request_rebuilds_a_session_whose_sandbox_is_gone(
    world: World,
    agent: Agent,
    session_config: SandboxConfig,
) -> None:
    assert agent.post("resolve").status_code == 200
    session = Session.objects.select_related("config", "space").get(key=KEY)
    engine = docker.from_env()
    engine.containers.get(session.sandbox_id).remove(force=True)  # gone behind the console's back

    def cannot_restore(s: Session) -> None:
        raise AssertionError("a safe request brought a gone sandbox back")

    changed = walk_safe_methods(world, session, session_config, cannot_restore)
    assert not changed, "\n".join(changed)


def test_no_safe_request_starts_a_stopped_sandbox(world: World, agent: Agent, session_config: SandboxConfig) -> None:
    assert agent.post("resolve").status_code == 200
    session = Session.objects.select_related("config", "space").get(key=KEY)
    engine = docker.from_env()
    engine.containers.get(session.sandbox_id).stop(timeout=1)  # stopped by the engine (a host restart)

    def restop(s: Session) -> None:
        engine.containers.get(s.sandbox_id).stop(timeout=1)

    changed = walk_safe_methods(world, session, session_config, restop)
    assert not changed, "\n".join(changed)
