"""The authorization sweep: every URL pattern and websocket route x every persona.

The patterns come from the URLconf itself (`django.urls.get_resolver()`, walked
recursively) and from the websocket routing, never from a hand-kept list, so a new URL is
swept the day it is added. Each URL keyword is filled from `FILLERS` with an object of the
target space (space A); a keyword without a filler fails the sweep, so a new kind of URL
forces this file to learn it.

Personas: anonymous, an outsider (a user of no space), the viewer of A, a member of B and
the admin of B. Expectations:

- anonymous: redirected to the login page (401 for the agent API and JSON endpoints);
- outsider, member and admin of another space: 404 on anything of space A;
- the viewer: never writes (a POST answers 403, 404 or 405);
- nobody: a 5xx, a change to any row, or (on pages that are not space A's) a trace of
  space A in the page.

The admin of A runs every GET first as a control, so a 404 above means "refused", not
"the filler pointed at nothing". The sweep prints its figures (patterns x personas and
deviations) and fails listing every deviation.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.core.files.base import ContentFile
from django.db import connection, transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from console.models import AdminJob, AuditEvent, Membership, Role
from console.services import SYSTEM
from sandboxes.api.tokens import do_create_api_token
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import (
    Artifact,
    BackgroundCommand,
    CommandStatus,
    EgressEvent,
    Session,
    SessionGrant,
    SessionImage,
    Terminal,
)
from skills.models import SkillFile, SkillImage
from tests.factories import add_member, make_config, make_user
from tests.personas import World
from tests.support.skills import make_version

MARKER = "zeta-target"  # in every name of space A's objects: must never show outside A
UNREACHABLE_ENGINE = "unix:///tmp/no-such-docker-engine.sock"  # pages must not depend on a backend
PERSONAS = ("anonymous", "outsider", "viewer", "member_b", "admin_b")
OTHER_SPACE = ("outsider", "member_b", "admin_b")
# Routes open to everyone by design; they are still swept for 5xx and for changes.
# The favicon is the same for everyone, logged in or not (browsers ask for it before a login).
PUBLIC = {"login", "logout", "api:openapi", "console:invite_accept", "favicon"}
# Actions on one's own account, open to every logged-in user; they end the login session
# they are sent with (each request gets a client of its own) and write only an audit row.
OWN_ACCOUNT = {"console:logout_everywhere"}
LOGS_OUT = {"logout", *OWN_ACCOUNT}
# Patterns of Django's own admin site are guarded by is_staff (none of the personas is).
SKIPPED_NAMESPACES = {"admin"}
METHODS = ("GET", "POST", "PUT", "DELETE")
# Query strings some pages need to have a subject at all (for every persona alike).
QUERIES = {
    "skills:image_uninstall": "?skill=sweep-skill",
    "sandboxes:network_explain": "?destination=sweep.example",
    "api:network_explain": "?destination=sweep.example",
}

# URL keyword -> (attribute of the Target holding the value, whether it names an object of
# the target space). Keywords of the global skill catalog are not space-scoped.
FILLERS: dict[str, tuple[str, bool]] = {
    "space_id": ("space_id", True),
    "config_id": ("config_id", True),
    "session_id": ("session_id", True),
    "key": ("session_key", True),
    "artifact_id": ("artifact_id", True),
    "command_id": ("command_id", True),
    "token_id": ("token_id", True),
    "membership_id": ("membership_id", True),
    "job_id": ("job_id", True),
    "image_id": ("image_id", True),
    "terminal_id": ("terminal_id", True),
    "action": ("action", False),
    "path": ("path", False),
    "skill_id": ("skill_id", False),
    "version_id": ("version_id", False),
    "file_id": ("file_id", False),
    "backend_id": ("backend_id", False),
    "event_id": ("event_id", True),
    "grant_id": ("grant_id", True),
    "user_id": ("user_id", False),
    "token": ("invite_token", False),
}


@dataclass(frozen=True)
class Route:
    route: str  # as in the URLconf, e.g. "sessions/<uuid:session_id>/"
    name: str  # "namespace:name", or the route when unnamed
    kwargs: tuple[str, ...]

    @property
    def is_api(self) -> bool:
        return self.route.startswith("api/") and self.name != "api:openapi"

    @property
    def platform(self) -> bool:
        """A platform admins' page: 404 for everyone else, space admins included."""
        return self.route.startswith("platform/")

    @property
    def scoped(self) -> bool:
        return any(FILLERS[k][1] for k in self.kwargs if k in FILLERS)


def walk(patterns: list[Any], prefix: str = "", namespace: str | None = None) -> Iterator[Route]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            inner = ":".join(n for n in (namespace, entry.namespace) if n) or None
            if entry.namespace in SKIPPED_NAMESPACES:
                continue
            yield from walk(entry.url_patterns, prefix + str(entry.pattern), inner)
        elif isinstance(entry, URLPattern):
            route = prefix + str(entry.pattern)
            name = f"{namespace}:{entry.name}" if namespace and entry.name else entry.name or route
            yield Route(route, name, tuple(entry.pattern.converters))


def http_routes() -> list[Route]:
    return list(walk(get_resolver().url_patterns))


def websocket_routes() -> list[Route]:
    from console.routing import websocket_urlpatterns

    return list(walk(list(websocket_urlpatterns)))


@dataclass
class Target:
    """Objects of every kind in space A, and what the personas hold."""

    space_id: str
    config_id: str
    session_id: str
    session_key: str
    artifact_id: str
    command_id: str
    token_id: str
    membership_id: str
    job_id: str
    image_id: str
    terminal_id: str
    skill_id: str
    version_id: str
    file_id: str
    backend_id: str
    event_id: str
    grant_id: str
    token_a: str
    token_b: str
    terminal: Terminal
    ids: tuple[str, ...]  # of space A's objects, for the leak check
    action: str = "pause"
    path: str = "notes.txt"
    user_id: str = ""
    invite_token: str = "sweep-no-such-invitation"

    def url(self, route: Route) -> str:
        def fill(match: re.Match[str]) -> str:
            return str(getattr(self, FILLERS[match.group(1)][0]))

        return "/" + re.sub(r"<(?:\w+:)?(\w+)>", fill, route.route) + QUERIES.get(route.name, "")


def build_target(world: World) -> Target:
    space = world.space_a
    space.name = f"{MARKER} space"
    space.save(update_fields=["name"])
    config = make_config(space, name=f"{MARKER} config", endpoint=UNREACHABLE_ENGINE)
    session = Session.objects.create(space=space, config=config, key=f"{MARKER}-session")
    artifact = Artifact(session=session, collection=uuid.uuid4(), path=f"output/{MARKER}.txt", size=5, sha256="0" * 64)
    artifact.file.save(f"{MARKER}.txt", ContentFile(b"hello"), save=False)
    artifact.save()
    command = BackgroundCommand.objects.create(
        session=session, shell=f"echo {MARKER}", status=CommandStatus.EXITED, exit_code=0
    )
    token, token_a = do_create_api_token(space, name=f"{MARKER} token", actor=SYSTEM)
    _, token_b = do_create_api_token(world.space_b, name="b token", actor=SYSTEM)
    membership = Membership.objects.get(space=space, user=world.bob)
    job = AdminJob.objects.create(kind="diagnostics", space=space, params={"note": MARKER})
    # Two ready generations, the second current: rollback and uninstall pages have a subject.
    fingerprint = config_fingerprint(config)
    manifest = [{"name": "sweep-skill"}]
    image = SkillImage.objects.create(
        space=space,
        config=config,
        generation=1,
        status="ready",
        subject=MARKER,
        snapshot_id="snap-zeta1",
        fingerprint=fingerprint,
        manifest=manifest,
    )
    SkillImage.objects.create(
        space=space,
        config=config,
        generation=2,
        status="ready",
        subject=MARKER,
        snapshot_id="snap-zeta2",
        fingerprint=fingerprint,
        manifest=manifest,
        parent=image,
    )
    SessionImage.objects.create(space=space, config=config, snapshot_id="snap-zeta2", fingerprint=fingerprint)
    AuditEvent.objects.create(action="space.update", space=space, space_name=space.name, details={"name": MARKER})
    terminal = Terminal.objects.create(session=session, user=world.bob)
    event = EgressEvent.objects.create(
        time=timezone.now(),
        space=space,
        session=session,
        sandbox_id=f"{MARKER}-sandbox",
        layer="dns",
        destination=f"{MARKER}.example",
        rule="not in the allow list",
    )
    grant = SessionGrant.objects.create(session=session, entry=f"{MARKER}.example")
    version = make_version("sweep-skill")
    skill_file = SkillFile.objects.create(
        version=version, path="SKILL.md", mode=0o644, size=5, sha256="1" * 64, content=b"hello"
    )
    ids = (space.id, config.id, session.id, artifact.id, command.id, token.id, job.id, image.id, terminal.id, event.id)
    return Target(
        space_id=str(space.id),
        config_id=str(config.id),
        backend_id=str(config.backend_id),
        session_id=str(session.id),
        session_key=session.key,
        artifact_id=str(artifact.id),
        command_id=str(command.id),
        token_id=str(token.id),
        membership_id=str(membership.id),
        job_id=str(job.id),
        image_id=str(image.id),
        terminal_id=str(terminal.id),
        skill_id=str(version.skill_id),
        version_id=str(version.id),
        file_id=str(skill_file.id),
        event_id=str(event.id),
        grant_id=str(grant.id),
        token_a=token_a,
        token_b=token_b,
        terminal=terminal,
        ids=tuple(str(i) for i in ids),
        user_id=str(world.bob.pk),
    )


class Personas:
    """A logged-in client per persona (the admin of A as "control")."""

    def __init__(self, world: World) -> None:
        member_b = make_user("mona")
        add_member(world.space_b, member_b, Role.MEMBER)
        self.users = {
            "outsider": make_user("olga"),
            "viewer": world.carol,
            "member_b": member_b,
            "admin_b": world.charlie,
            "control": world.alice,
            "platform": world.root,
            "admin_a": world.alice,
        }
        self.clients = {name: self.fresh(name) for name in self.users if name != "control"}
        self.clients["anonymous"] = self.fresh("anonymous")
        self.clients["control"] = self.clients["admin_a"]

    def fresh(self, name: str) -> Client:
        client = Client()
        if name in self.users:
            client.force_login(self.users[name])
        return client

    def client(self, name: str, route: Route) -> Client:
        # Logging out ends the session it is sent with: give it a session of its own.
        if route.name in LOGS_OUT:
            return self.fresh(name)
        # A platform page's control is a platform admin; the admin of A is then one more
        # persona that must be refused.
        if route.platform and name == "control":
            return self.clients["platform"]
        return self.clients[name]


WATCHED_APPS = ("console", "sandboxes", "skills", "auth")


def watched_models() -> list[Any]:
    return [model for model in apps.get_models() if model._meta.app_label in WATCHED_APPS]


def snapshot() -> dict[str, Any]:
    """Every row the console keeps (sessions of Django's own and login attempts aside).

    On PostgreSQL one query digests each table; elsewhere the rows themselves are compared.
    """
    models = watched_models()
    if connection.vendor == "postgresql":
        quote = connection.ops.quote_name
        sql = " UNION ALL ".join(
            f"SELECT %s, md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {quote(m._meta.db_table)} t"  # noqa: S608 - table names from the models
            for m in models
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [m._meta.label for m in models])
            return dict(cursor.fetchall())
    state = {}
    for model in models:
        rows = model.objects.order_by("pk").values_list()
        state[model._meta.label] = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in rows]
    return state


def changed_models(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(label for label in before if before[label] != after.get(label))


@dataclass
class Outcome:
    status: int  # 0: the view raised
    location: str
    json: bool
    body: str
    changed: list[str]
    error: str = ""


def attempt(client: Client, method: str, url: str, headers: dict[str, str]) -> Outcome:
    """One request in a savepoint rolled back afterwards, so no request sees another's writes."""
    before = snapshot()
    with transaction.atomic():
        try:
            if method in ("POST", "PUT") and url.startswith("/api/"):
                response = client.generic(method, url, b"{}", content_type="application/json", headers=headers)
            else:
                response = client.generic(method, url, b"", headers=headers)
        except Exception as exc:
            transaction.set_rollback(True)
            return Outcome(0, "", False, "", [], error=f"{type(exc).__name__}: {exc}")
        try:
            after = snapshot()
        except Exception as exc:
            after, exc_text = before, f"{type(exc).__name__}: {exc}"
        else:
            exc_text = ""
        transaction.set_rollback(True)
    body = b"" if getattr(response, "streaming", False) else response.content
    return Outcome(
        response.status_code,
        response.get("Location", ""),
        response.get("Content-Type", "").startswith("application/json"),
        body.decode("utf-8", "replace"),
        changed_models(before, after),
        error=exc_text,
    )


def api_headers(persona: str, target: Target) -> dict[str, str]:
    # The API takes space tokens only: a browser session never authenticates it.
    if persona in ("member_b", "admin_b"):
        return {"authorization": f"Bearer {target.token_b}"}
    return {}


def judge(route: Route, persona: str, method: str, outcome: Outcome, target: Target) -> str | None:
    """Why this outcome breaks the rules, or None."""
    if outcome.status in (0, 500):
        return f"{outcome.status or 'raised'} {outcome.error}".strip()
    if outcome.error:
        return outcome.error
    if route.name in OWN_ACCOUNT and persona != "anonymous" and set(outcome.changed) <= {"console.AuditEvent"}:
        return None if outcome.status in (302, 405) else f"{outcome.status}, expected 302/405"
    if outcome.changed:
        return f"{outcome.status}, changed {', '.join(outcome.changed)}"
    if route.name in PUBLIC:
        return None
    status = outcome.status
    if persona == "anonymous":
        if route.is_api:
            return None if status in (401, 405) else f"{status}, expected 401"
        to_login = status == 302 and outcome.location.startswith("/login/")
        if to_login or (status == 401 and outcome.json) or status == 405:
            return None
        return f"{status} {outcome.location}, expected a redirect to the login page"
    if route.platform and persona != "anonymous":
        return None if status in (404, 405) else f"{status}, expected 404 (platform admins only)"
    if route.is_api:
        expected = (404, 405) if persona in ("member_b", "admin_b") else (401, 405)
        return None if status in expected else f"{status}, expected {' or '.join(map(str, expected))}"
    if route.scoped and persona in OTHER_SPACE:
        return None if status in (404, 405) else f"{status}, expected 404"
    if persona == "viewer" and method != "GET" and status not in (403, 404, 405):
        return f"{status}, expected 403/404/405 (a viewer never writes)"
    if persona in OTHER_SPACE:
        trace = MARKER in outcome.body.lower() or any(i in outcome.body for i in target.ids)
        if trace:
            return f"{status}, the page shows space A's objects"
    return None


def control_problem(route: Route, target: Target, client: Client) -> str | None:
    """The admin of A must reach every GET of A's objects (else the fillers prove nothing)."""
    headers = {"authorization": f"Bearer {target.token_a}"} if route.is_api else {}
    outcome = attempt(client, "GET", target.url(route), headers)
    if outcome.status in (0, 500):  # 502-504: the (unreachable) backend's answer, mapped
        return f"control (admin of A): {outcome.status or 'raised'} {outcome.error}"
    if (route.scoped or route.platform) and outcome.status in (401, 403, 404):
        return f"control (admin of A): {outcome.status}, so the filler reaches nothing"
    return None


@pytest.mark.django_db
def test_every_url_keyword_has_a_filler() -> None:
    missing = {f"{r.name}: <{k}>" for r in http_routes() + websocket_routes() for k in r.kwargs if k not in FILLERS}
    assert not missing, f"URL keywords without a filler in FILLERS (add one): {sorted(missing)}"


@pytest.fixture
def no_heartbeat_meanwhile() -> Iterator[None]:
    """No row changes but the requests' own while the sweep runs.

    A test run earlier in this process may have registered it (`console.processes`): its
    heartbeat thread then writes console.WorkerProcess every few seconds, a change no request
    made. It is stopped (and waited for) for the sweep; the next test that needs this process
    registers it again, with a heartbeat of its own."""
    import threading

    from console import processes

    processes.stop_heartbeat()
    for thread in threading.enumerate():
        if thread.name == "console-heartbeat":
            thread.join(timeout=60)
    yield
    processes._forget_in_child()  # what a new process starts from: not registered


@pytest.mark.django_db
def test_authorization_sweep_over_every_url_pattern(
    world: World, capsys: pytest.CaptureFixture[str], record_property: Any, no_heartbeat_meanwhile: None
) -> None:
    target = build_target(world)
    personas = Personas(world)
    routes = [r for r in http_routes() if all(k in FILLERS for k in r.kwargs)]
    assert len(routes) > 50  # the walk found the URLconf, not an empty list
    deviations: list[str] = []
    requests = 0
    for route in routes:
        url = target.url(route)
        if problem := control_problem(route, target, personas.client("control", route)):
            deviations.append(f"{route.name} {url}: {problem}")
        for persona in PERSONAS + (("admin_a",) if route.platform else ()):
            headers = api_headers(persona, target) if route.is_api else {}
            for method in METHODS:
                outcome = attempt(personas.client(persona, route), method, url, headers)
                requests += 1
                if reason := judge(route, persona, method, outcome, target):
                    deviations.append(f"{method} {route.name} as {persona}: {reason}")
    record_property("sweep_patterns", len(routes))
    record_property("sweep_personas", len(PERSONAS))
    record_property("sweep_deviations", len(deviations))
    with capsys.disabled():
        print(
            f"\nauthorization sweep: {len(routes)} URL patterns x {len(PERSONAS)} personas = "
            f"{len(routes) * len(PERSONAS)} pairs ({requests} requests, methods {'/'.join(METHODS)}); "
            f"deviations: {len(deviations)}"
        )
        for deviation in deviations:
            print("  DEVIATION", deviation)
    assert not deviations, "\n".join(deviations)


async def handshake(application: Any, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the websocket handshake is accepted (connect and close in one event loop)."""
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    if connected:
        await communicator.disconnect()
    return bool(connected)


@pytest.mark.django_db(transaction=True)
def test_authorization_sweep_over_every_websocket_route(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    from console.asgi import application
    from sandboxes.terminal.tickets import issue_ticket

    target = build_target(world)
    personas = Personas(world)
    routes = websocket_routes()
    assert routes
    deviations: list[str] = []
    for route in routes:
        for persona in PERSONAS:
            # With no ticket, and with a valid ticket of A's terminal (as if it had leaked).
            for ticket in ("", issue_ticket(target.terminal)):
                headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
                cookie = personas.clients[persona].cookies.get("sessionid")
                if cookie is not None:
                    headers.append((b"cookie", f"sessionid={cookie.value}".encode()))
                path = target.url(route) + (f"?ticket={ticket}" if ticket else "")
                communicator = WebsocketCommunicator(application, path, headers=headers)
                connected, _ = async_to_sync(communicator.connect)(timeout=10)
                if connected:
                    async_to_sync(communicator.disconnect)()
                    deviations.append(f"{route.name} as {persona} ({'leaked ticket' if ticket else 'no ticket'})")
    # Control: the terminal's own user with a fresh ticket gets in, so the refusals above are refusals.
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    bob = Client()
    bob.force_login(world.bob)
    headers.append((b"cookie", f"sessionid={bob.cookies['sessionid'].value}".encode()))
    path = target.url(routes[0]) + f"?ticket={issue_ticket(target.terminal)}"
    assert async_to_sync(handshake)(application, path, headers), (
        "control: the terminal's own user could not connect either"
    )
    with capsys.disabled():
        print(
            f"\nwebsocket sweep: {len(routes)} routes x {len(PERSONAS)} personas = {len(routes) * len(PERSONAS)} "
            f"pairs (each without and with a leaked ticket); deviations: {len(deviations)}"
        )
    assert not deviations, deviations


# --- Malformed input never answers 500 ----------------------------------------------------------

PARAM_READS = re.compile(
    r"""request\.(?:GET|POST)(?:\.get\(|\[)["'](\w+)["']|(?:int|bool|str)_param\(request,\s*["'](\w+)["']"""
)
BAD_VALUES = ("not-a-uuid\u2028../../etc/passwd", "-99999999999999999999999")


def parameter_names() -> list[str]:
    """Every query/form parameter the views read, found in their source (not a kept list)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    names: set[str] = set()
    for app in ("console", "sandboxes", "skills"):
        for source in (root / app).rglob("*.py"):
            for match in PARAM_READS.finditer(source.read_text()):
                names.add(match.group(1) or match.group(2))
    return sorted(names)


@pytest.mark.django_db
def test_malformed_parameters_never_answer_500(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    target = build_target(world)
    personas = Personas(world)
    names = parameter_names()
    assert {"version", "terminal_id", "path", "config"} <= set(names)
    routes = [r for r in http_routes() if all(k in FILLERS for k in r.kwargs) and r.name != "logout"]
    problems: list[str] = []
    requests = 0
    for route in routes:
        base = target.url(route).split("?")[0]
        headers = {"authorization": f"Bearer {target.token_a}"} if route.is_api else {}
        client = personas.client("control", route)  # the admin of A: past every access check
        for name in names:  # one at a time, so an early 400 on one cannot hide another
            error = probe(client, "GET", f"{base}?{urlencode({name: BAD_VALUES[0]})}", None, headers)
            requests += 1
            if error:
                problems.append(f"GET {route.name} ?{name}=…: {error}")
        for value in BAD_VALUES:
            error = probe(client, "POST", base, dict.fromkeys(names, value), headers, as_json=route.is_api)
            requests += 1
            if error:
                problems.append(f"POST {route.name} (every field {value[:12]}…): {error}")
    with capsys.disabled():
        print(
            f"\nmalformed-input sweep: {len(routes)} URL patterns x {len(names)} parameters "
            f"({requests} requests as the admin of A); 500s: {len(problems)}"
        )
        for problem in problems:
            print("  500", problem)
    assert not problems, "\n".join(problems)


def probe(
    client: Client,
    method: str,
    url: str,
    data: dict[str, str] | None,
    headers: dict[str, str],
    *,
    as_json: bool = False,
) -> str | None:
    """A 500 (or an exception out of the view) for this request, rolled back afterwards; else None."""
    with transaction.atomic():
        try:
            if method == "GET":
                response = client.get(url, headers=headers)
            elif as_json:
                response = client.post(url, json.dumps(data), content_type="application/json", headers=headers)
            else:
                response = client.post(url, data, headers=headers)
        except Exception as exc:
            return f"raised {type(exc).__name__}: {exc}"
        finally:
            transaction.set_rollback(True)
    return "500" if response.status_code == 500 else None
