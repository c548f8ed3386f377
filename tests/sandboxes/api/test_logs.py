"""The log lines of a whole agent API turn on the real engine: each carries the request id of
the call it belongs to (the API line, the runtime's decision, the backend calls and the
adapter's own lines), says what was decided, and holds no secret (the API token, the
platform backend's key, the console's keys)."""

from __future__ import annotations

import base64
import json

import pytest
from django.conf import settings

from console.crypto import encrypt
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.models import SandboxConfig
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent
from tests.support.log_capture import Captured

PLATFORM_KEY = "platform-key-c0ffee-do-not-log"


def lines_of(captured: Captured, rid: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in captured.lines if json.loads(line).get("request_id") == rid]


@pytest.mark.docker
def test_a_turn_logs_its_decisions_under_each_calls_request_id_and_no_secret(
    world: World, session_config: SandboxConfig, captured: Captured
) -> None:
    backend = session_config.backend
    backend.api_key_encrypted = encrypt(PLATFORM_KEY)
    backend.save(update_fields=["api_key_encrypted", "updated"])
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    agent = Agent(world.space_a.id, token)

    def call(method: str, suffix: str, rid: str, body: object = None, key: str = "logged") -> object:
        headers = {**agent.headers, "X-Request-ID": rid}
        url = agent.url(key, suffix)
        if method == "delete":
            answer = agent.client.delete(url, headers=headers)
        elif method == "get":
            answer = agent.client.get(url, headers=headers)
        else:
            answer = agent.client.post(
                url, json.dumps(body) if body is not None else "", content_type="application/json", headers=headers
            )
        assert answer["X-Request-ID"] == rid
        assert answer.status_code < 300, answer.content
        return answer

    call("post", "turns/begin", "turn-begin")
    call("post", "resolve", "turn-resolve")
    call("post", "exec", "turn-exec", {"shell": "mkdir -p output && echo hi > output/a.txt"})
    call("post", "exec", "turn-stdin", {"argv": ["cat"], "stdin_b64": base64.b64encode(b"x").decode()})
    call("post", "artifacts/collect", "turn-collect")
    call("post", "turns/end", "turn-end")
    call("get", "", "turn-get")
    call("delete", "", "turn-delete")

    resolve = lines_of(captured, "turn-resolve")
    api_line = next(line for line in resolve if line["logger"] == "console.requests")
    assert api_line["status"] == 200
    assert api_line["route"] == "api:resolve"
    decided = next(line for line in resolve if line["logger"] == "sandboxes.sessions.runtime")
    assert decided["action"] == "created"
    assert decided["path"] == "slow"
    assert decided["session_key"] == "logged"
    sandbox_id = decided["sandbox_id"]
    assert sandbox_id
    calls = [line for line in resolve if line["logger"] == "sandboxes.catalog.observed"]
    operations = {line["operation"] for line in calls}
    assert "create" in operations
    assert "exec" not in operations  # the workspace is laid out inside the create, not by an exec
    executed = [line for line in lines_of(captured, "turn-exec") if line["logger"] == "sandboxes.catalog.observed"]
    assert any(line["operation"] == "exec" and line.get("sandbox_id") == sandbox_id for line in executed)
    assert all(isinstance(line["duration_ms"], float) for line in calls)
    # The adapter imports nothing of the project, and its line carries the id all the same.
    adapter = next(line for line in resolve if line["logger"] == "sandboxes.backends.docker.backend")
    assert adapter["sandbox_id"] == sandbox_id
    deleted = lines_of(captured, "turn-delete")
    assert any(line.get("operation") == "delete" and line.get("sandbox_id") == sandbox_id for line in deleted)
    assert any(line.get("action") == "bind" and line.get("sandbox_id") == sandbox_id for line in resolve)

    everything = "\n".join(captured.lines) + "\n".join(repr(vars(r)) for r in captured.records)
    assert len(captured.lines) > 20
    for secret in (token, token[4:], PLATFORM_KEY, settings.SECRET_KEY, settings.FIELD_ENCRYPTION_KEY):
        assert secret not in everything


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_websocket_logs_under_the_request_id_of_its_handshake(captured: Captured) -> None:
    import uuid

    from channels.testing import WebsocketCommunicator

    from console.asgi import application
    from tests.support.terminal_support import ORIGIN

    terminal_id = str(uuid.uuid4())
    headers = [ORIGIN, (b"host", b"localhost"), (b"x-request-id", b"ws-handshake-9")]
    communicator = WebsocketCommunicator(application, f"/ws/terminals/{terminal_id}/?ticket=forged", headers=headers)
    connected, _ = await communicator.connect()
    assert not connected
    await communicator.disconnect()
    refused = [r for r in captured.records if r.name == "sandboxes.terminal.consumer" and terminal_id in r.getMessage()]
    assert refused, [r.getMessage() for r in captured.records]
    assert {r.request_id for r in refused} == {"ws-handshake-9"}  # type: ignore[attr-defined]
