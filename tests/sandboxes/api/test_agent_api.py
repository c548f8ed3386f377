"""The agent API: tokens, authz, bad input, the full turn flow on Docker, and OpenAPI."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import jsonschema
import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from openapi_spec_validator import validate as validate_openapi

from console.models import AuditEvent
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token, hash_token
from sandboxes.api.urls import openapi_document
from sandboxes.models import ApiToken, SandboxConfig, Session
from tests.factories import make_config
from tests.personas import World

pytestmark = pytest.mark.django_db

DOC = openapi_document("http://testserver/api/v1")


def validate(response: Any, path: str, method: str) -> None:
    """The response matches the OpenAPI description of (path, method, status)."""
    operation = DOC["paths"][path][method]
    spec = operation["responses"][str(response.status_code)]
    content = spec.get("content", {}).get("application/json")
    if content is None:
        return
    schema = {**content["schema"], "components": DOC["components"]}
    jsonschema.validate(json.loads(response.content), schema)


class Agent:
    """An API client holding one space's token."""

    def __init__(self, space_id: Any, token: str) -> None:
        self.client = Client()
        self.space_id = space_id
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"}

    def url(self, key: str, suffix: str = "") -> str:
        # As the OpenAPI description writes them: the session itself without a trailing slash.
        session = f"/api/v1/spaces/{self.space_id}/sessions/{key}"
        return f"{session}/{suffix}" if suffix else session

    def post(self, key: str, suffix: str, body: Any = None) -> Any:
        data = json.dumps(body) if body is not None else ""
        return self.client.post(self.url(key, suffix), data, content_type="application/json", headers=self.headers)

    def get(self, key: str, suffix: str = "", **params: Any) -> Any:
        return self.client.get(self.url(key, suffix), params, headers=self.headers)

    def put(self, key: str, suffix: str, data: bytes) -> Any:
        return self.client.put(
            self.url(key, suffix), data, content_type="application/octet-stream", headers=self.headers
        )

    def delete(self, key: str) -> Any:
        return self.client.delete(self.url(key), headers=self.headers)


@pytest.fixture
def agent_a(world: World) -> Agent:
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    return Agent(world.space_a.id, token)


@pytest.fixture
def agent_b(world: World) -> Agent:
    _, token = do_create_api_token(world.space_b, name="agent-b", actor=Actor(user=world.charlie))
    return Agent(world.space_b.id, token)


# --- Tokens ------------------------------------------------------------------------------


def test_token_is_shown_once_stored_hashed_and_revocable(world: World) -> None:
    client = world.client_for("alice")
    url = reverse("sandboxes:token_list", args=[world.space_a.id])
    response = client.post(url, {"name": "ci-agent"})
    secret = response.context["created_secret"]
    assert secret.startswith("sck_")
    assert secret in response.content.decode()
    assert response["Cache-Control"] == "no-store"
    token = ApiToken.objects.get(name="ci-agent")
    assert token.token_hash == hash_token(secret)
    assert secret not in str(ApiToken.objects.values_list()[::1])
    assert secret not in client.get(url).content.decode()  # never shown again
    agent = Agent(world.space_a.id, secret)
    assert agent.get("nobody").status_code == 404  # authenticated: unknown session
    client.post(reverse("sandboxes:token_revoke", args=[world.space_a.id, token.id]))
    assert agent.get("nobody").status_code == 401
    assert AuditEvent.objects.filter(action__in=["api_token.create", "api_token.revoke"]).count() == 2


@pytest.mark.parametrize("persona", ["bob", "carol", "charlie"])
def test_only_space_admins_manage_tokens(world: World, persona: str) -> None:
    url = reverse("sandboxes:token_list", args=[world.space_a.id])
    expected = 404 if persona == "charlie" else 403
    assert world.client_for(persona).post(url, {"name": "x"}).status_code == expected
    assert not ApiToken.objects.exists()


# --- Authz and bad input -----------------------------------------------------------------

ROUTES: list[tuple[str, str]] = [
    ("get", ""),
    ("patch", ""),
    ("delete", ""),
    ("post", "resolve"),
    ("post", "turns/begin"),
    ("post", "turns/end"),
    ("post", "exec"),
    ("put", "input/a.txt"),
    ("get", "files"),
    ("get", "files/content"),
    ("get", "artifacts"),
    ("post", "artifacts/collect"),
    ("get", "commands"),
    ("post", "commands"),
    ("get", "commands/00000000-0000-0000-0000-000000000000/output"),
    ("post", "commands/00000000-0000-0000-0000-000000000000/stdin"),
    ("post", "commands/00000000-0000-0000-0000-000000000000/kill"),
]


def call(agent: Agent, method: str, suffix: str, key: str = "s1") -> Any:
    url = agent.url(key, suffix)
    if method == "put":
        return agent.client.put(url, b"x", content_type="application/octet-stream", headers=agent.headers)
    return getattr(agent.client, method)(url, headers=agent.headers)


@pytest.mark.parametrize(("method", "suffix"), ROUTES)
def test_a_token_of_space_b_gets_404_on_space_a(world: World, agent_b: Agent, method: str, suffix: str) -> None:
    intruder = Agent(world.space_a.id, agent_b.token)
    response = call(intruder, method, suffix)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert not Session.objects.exists()


@pytest.mark.parametrize(("method", "suffix"), ROUTES)
def test_no_token_is_401(world: World, method: str, suffix: str) -> None:
    agent = Agent(world.space_a.id, "not-a-token")
    assert call(agent, method, suffix).status_code == 401


@pytest.mark.parametrize(("method", "suffix"), [r for r in ROUTES if r[1] not in {"resolve", "turns/begin"}])
def test_unknown_session_is_404(agent_a: Agent, method: str, suffix: str) -> None:
    assert call(agent_a, method, suffix, key="never-seen").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"argv": ["echo"], "shell": "echo"}, "argv"),
        ({}, "argv"),
        ({"argv": []}, "argv"),
        ({"argv": "echo hi"}, "argv"),
        ({"argv": ["echo", 1]}, "argv"),
        ({"shell": "true", "env": {"A": 1}}, "env"),
        ({"shell": "true", "timeout_s": 0}, "timeout_s"),
        ({"shell": "true", "timeout_s": True}, "timeout_s"),
        ({"shell": "true", "stdin_b64": "%%%"}, "stdin_b64"),
        ({"shell": "true", "cwd": "relative"}, "cwd"),
        ({"shell": "true", "max_output_bytes": 10**9}, "max_output_bytes"),
    ],
)
def test_bad_exec_input_is_400_naming_the_field(world: World, agent_a: Agent, body: dict[str, Any], field: str) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    Session.objects.create(space=world.space_a, key="s1", config=SandboxConfig.objects.get())
    response = agent_a.post("s1", "exec", body)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field
    validate(response, "/spaces/{space_id}/sessions/{key}/exec", "post")


def test_body_that_is_not_json_is_400(world: World, agent_a: Agent) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    response = agent_a.client.post(
        agent_a.url("s1", "resolve"), "{nope", content_type="application/json", headers=agent_a.headers
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "body"


def test_invalid_session_key_is_400(world: World, agent_a: Agent) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    response = agent_a.post("bad key!", "resolve")
    assert response.status_code in (400, 404)  # a space in the URL may not even route
    response = agent_a.post("-dash-first", "resolve")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "key"


def test_space_without_config_is_a_clear_400(agent_a: Agent) -> None:
    response = agent_a.post("s1", "resolve")
    assert response.status_code == 400
    assert "has no sandbox config" in response.json()["error"]["message"]


def test_backend_unavailable_maps_to_503_retryable(world: World, agent_a: Agent) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock", is_default=True)
    response = agent_a.post("s1", "resolve")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "unavailable"
    assert error["retryable"] is True
    validate(response, "/spaces/{space_id}/sessions/{key}/resolve", "post")


# --- OpenAPI -------------------------------------------------------------------------------


def described_routes() -> set[str]:
    return set(DOC["paths"])


def urlconf_routes() -> set[str]:
    """Every route of the URLconf under /api/v1/, written as the description writes it."""
    (api,) = [r for r in get_resolver().url_patterns if isinstance(r, URLResolver) and str(r.pattern) == "api/v1/"]
    routes = set()
    for pattern in api.url_patterns:
        assert isinstance(pattern, URLPattern)
        route = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        routes.add(route.rstrip("/"))
    return routes - {"/openapi.json"}


def test_openapi_describes_every_route_of_the_urlconf() -> None:
    assert urlconf_routes() == described_routes()
    assert len(described_routes()) == 19


def test_openapi_document_is_a_valid_openapi_document() -> None:
    validate_openapi(DOC)  # raises with the first fault it finds
    for path, operations in DOC["paths"].items():
        for method, operation in operations.items():
            assert operation["summary"], (path, method)
            errors = {status for status in operation["responses"] if status >= "400"}
            assert {"401", "404"} <= errors, (path, method)  # every route authenticates
            assert all(operation["responses"][s]["description"] for s in errors), (path, method)


@pytest.mark.django_db
def test_the_session_answers_with_and_without_a_trailing_slash(world: World, agent_a: Agent) -> None:
    config = make_config(world.space_a, is_default=True)
    Session.objects.create(space=world.space_a, key="slashes", config=config)
    documented = agent_a.url("slashes")
    assert agent_a.client.get(documented, headers=agent_a.headers).json()["key"] == "slashes"
    assert agent_a.client.get(documented + "/", headers=agent_a.headers).json()["key"] == "slashes"


def test_openapi_is_served_and_valid_json(client: Client) -> None:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    assert document["servers"] == [{"url": "http://testserver/api/v1"}]
    validate_openapi(document)
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


# --- The whole turn on the real engine ---------------------------------------------------------


@pytest.fixture
def docker_space(session_config: SandboxConfig) -> SandboxConfig:
    return session_config


P = "/spaces/{space_id}/sessions/{key}"


@pytest.mark.docker
def test_a_turn_through_the_api(agent_a: Agent, docker_space: SandboxConfig) -> None:
    begun = agent_a.post("turn-1", "turns/begin")
    assert begun.status_code == 200
    validate(begun, P + "/turns/begin", "post")
    resolved = agent_a.post("turn-1", "resolve")
    assert resolved.status_code == 200, resolved.content
    validate(resolved, P + "/resolve", "post")
    assert resolved.json()["action"] == "created"
    assert resolved.json()["state"] == "running"

    uploaded = agent_a.put("turn-1", "input/data/numbers.txt", b"3\n4\n5\n")
    assert uploaded.status_code == 201, uploaded.content
    validate(uploaded, P + "/input/{path}", "put")

    ran = agent_a.post(
        "turn-1",
        "exec",
        {"shell": "python3 -c \"print(sum(int(x) for x in open('input/data/numbers.txt')))\""},
    )
    assert ran.status_code == 200
    validate(ran, P + "/exec", "post")
    assert ran.json()["stdout"].strip() == "12"

    piped = agent_a.post(
        "turn-1",
        "exec",
        {"argv": ["sh", "-c", "cat > output/report.txt; id -u"], "stdin_b64": base64.b64encode(b"total 12\n").decode()},
    )
    assert piped.json()["stdout"] == "1000\n"
    denied = agent_a.post("turn-1", "exec", {"shell": "echo x > input/data/numbers.txt"})
    assert denied.json()["exit_code"] != 0  # input/ is read-only to the session user
    refused = agent_a.put("turn-1", "files/content?path=input/evil.txt", b"x")
    assert refused.status_code == 400

    wrote = agent_a.client.put(
        agent_a.url("turn-1", "files/content") + "?path=output/bin.dat",
        bytes(range(256)),
        content_type="application/octet-stream",
        headers=agent_a.headers,
    )
    assert wrote.status_code == 201
    read = agent_a.get("turn-1", "files/content", path="output/bin.dat")
    assert read.content == bytes(range(256))
    listing = agent_a.get("turn-1", "files", path="output")
    validate(listing, P + "/files", "get")
    assert {e["name"] for e in listing.json()["entries"]} == {"report.txt", "bin.dat"}
    escape = agent_a.get("turn-1", "files/content", path="../etc/passwd")
    assert escape.status_code == 400
    assert escape.json()["error"]["field"] == "path"

    agent_a.post("turn-1", "exec", {"shell": "ln -s /etc/passwd output/link"})
    collected = agent_a.post("turn-1", "artifacts/collect")
    assert collected.status_code == 200
    validate(collected, P + "/artifacts/collect", "post")
    body = collected.json()
    assert sorted(a["path"] for a in body["artifacts"]) == ["bin.dat", "report.txt"]
    assert any("link" in r and "symlink" in r for r in body["refused"])
    report = next(a for a in body["artifacts"] if a["path"] == "report.txt")
    download = agent_a.client.get(report["download_url"].replace("http://testserver", ""), headers=agent_a.headers)
    assert download.getvalue() == b"total 12\n"

    ended = agent_a.post("turn-1", "turns/end")
    validate(ended, P + "/turns/end", "post")
    state = agent_a.get("turn-1")
    validate(state, P, "get")
    assert state.json()["sandbox_id"] == resolved.json()["sandbox_id"]
    assert agent_a.delete("turn-1").status_code == 204
    assert agent_a.get("turn-1").status_code == 404


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db(transaction=True)  # the output pump writes from its own thread
def test_background_commands_through_the_api(agent_a: Agent, docker_space: SandboxConfig) -> None:
    import time

    assert agent_a.post("bg", "resolve").status_code == 200
    started = agent_a.post("bg", "commands", {"shell": "for i in 1 2 3; do echo line$i; sleep 0.3; done"})
    assert started.status_code == 201, started.content
    validate(started, P + "/commands", "post")
    command_id = started.json()["id"]
    after: int | None = None
    text = ""
    deadline = time.monotonic() + 30
    while True:
        params = {"after": after} if after is not None else {}
        page = agent_a.get("bg", f"commands/{command_id}/output", **params)
        validate(page, P + "/commands/{command_id}/output", "get")
        body = page.json()
        text += "".join(chunk["text"] for chunk in body["chunks"])
        after = body["next_after"]
        if body["finished"]:
            break
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert [line.strip() for line in text.splitlines() if line.strip()] == ["line1", "line2", "line3"]
    assert body["exit_code"] == 0

    reader = agent_a.post("bg", "commands", {"argv": ["head", "-n", "1"]})
    reader_id = reader.json()["id"]
    fed = agent_a.post("bg", f"commands/{reader_id}/stdin", {"data_b64": base64.b64encode(b"hello\n").decode()})
    validate(fed, P + "/commands/{command_id}/stdin", "post")
    deadline = time.monotonic() + 30
    while not (out := agent_a.get("bg", f"commands/{reader_id}/output").json())["finished"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "hello" in "".join(chunk["text"] for chunk in out["chunks"])

    sleeper = agent_a.post("bg", "commands", {"shell": "sleep 600"}).json()["id"]
    killed = agent_a.post("bg", f"commands/{sleeper}/kill")
    validate(killed, P + "/commands/{command_id}/kill", "post")
    assert killed.json()["status"] == "killed"
    listed = agent_a.get("bg", "commands")
    validate(listed, P + "/commands", "get")
    assert len(listed.json()["commands"]) == 3
    bad = agent_a.get("bg", f"commands/{sleeper}/output", after="x")
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "after"
