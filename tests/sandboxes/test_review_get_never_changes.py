"""Review of issue 12 (a): no safe request (GET, HEAD, OPTIONS) changes a session or its sandbox.

The lead's walk (`test_api_get_never_wakes.py`) sends GETs against a *paused* session and
compares the state, sandbox id, binding version and engine state. These tests widen it:
HEAD and OPTIONS as well as GET; a session whose sandbox is gone behind the console's back
(where a wake would be a rebuild) and one stopped by the engine; and the row's
`last_activity` (an old value, so a touch shows) and the session's audit trail, as an admin
reading the idle sweep would object to a page view that keeps a session from idling.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from typing import Any

import docker
import pytest
from django.core.files.base import ContentFile
from django.utils import timezone

from console.models import AuditEvent
from console.services import Actor
from sandboxes.models import Artifact, BackgroundCommand, CommandStatus, SandboxConfig, Session, Terminal
from sandboxes.sessions.runtime import Runtime
from tests.console.test_authorization_sweep import FILLERS, Personas, build_target, http_routes
from tests.personas import World
from tests.sandboxes.api.test_get_never_wakes import (
    KEY,
    Agent,
    agent,  # noqa: F401  (fixture)
    engine_view,
    installation_sandboxes,
    paused_session,
)

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

READ_QUERY = "browse=1&path=notes.txt&port=8080"
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


def test_no_safe_request_changes_a_paused_session(world: World, agent: Agent, session_config: SandboxConfig) -> None:  # noqa: F811
    session = paused_session(agent)

    def repause(s: Session) -> None:
        Runtime().pause(s, actor=Actor(user=None))

    changed = walk_safe_methods(world, session, session_config, repause)
    assert not changed, "\n".join(changed)


def test_no_safe_request_rebuilds_a_session_whose_sandbox_is_gone(
    world: World,
    agent: Agent,  # noqa: F811
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


def test_no_safe_request_starts_a_stopped_sandbox(world: World, agent: Agent, session_config: SandboxConfig) -> None:  # noqa: F811
    assert agent.post("resolve").status_code == 200
    session = Session.objects.select_related("config", "space").get(key=KEY)
    engine = docker.from_env()
    engine.containers.get(session.sandbox_id).stop(timeout=1)  # stopped by the engine (a host restart)

    def restop(s: Session) -> None:
        engine.containers.get(s.sandbox_id).stop(timeout=1)

    changed = walk_safe_methods(world, session, session_config, restop)
    assert not changed, "\n".join(changed)
