"""Login throttling, settings behind TLS, the websocket Origin check, bad ids that were 500s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator
from cryptography.fernet import Fernet
from django.test import Client
from django.urls import reverse

from console.security import OriginValidator
from sandboxes.models import Session
from tests.factories import make_config, make_user
from tests.personas import World

REPO = Path(__file__).resolve().parents[2]

# --- Login throttling ------------------------------------------------------------------------


def login(username: str, password: str, ip: str = "198.51.100.7") -> Any:
    client = Client(REMOTE_ADDR=ip)
    response = client.post(reverse("login"), {"username": username, "password": password})
    return client, response


@pytest.mark.django_db
def test_a_login_is_locked_out_after_repeated_failures_even_with_the_right_password(settings: Any) -> None:
    make_user("dora")  # password "pw-dora"
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert login("dora", "wrong")[1].status_code == 200  # the form again, with an error
    _, locked = login("dora", "wrong")
    assert locked.status_code == 429
    assert b"Too many failed logins" in locked.content
    client, response = login("dora", "pw-dora")
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    # The lock is per username and address: the same user elsewhere still logs in.
    client, response = login("dora", "pw-dora", ip="203.0.113.9")
    assert response.status_code == 302
    assert "_auth_user_id" in client.session


@pytest.mark.django_db
def test_a_successful_login_resets_the_failure_count(settings: Any) -> None:
    make_user("erin")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        login("erin", "wrong")
    assert login("erin", "pw-erin")[1].status_code == 302
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        login("erin", "wrong")
    assert login("erin", "pw-erin")[1].status_code == 302


@pytest.mark.django_db
def test_behind_trusted_proxies_the_forwarded_address_is_the_one_throttled(settings: Any) -> None:
    settings.FORWARDED_FOR_PROXIES = 1
    make_user("finn")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.20").post(
            reverse("login"), {"username": "finn", "password": "wrong"}
        )
    same = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.20")
    assert same.post(reverse("login"), {"username": "finn", "password": "pw-finn"}).status_code == 429
    other = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.21")
    assert other.post(reverse("login"), {"username": "finn", "password": "pw-finn"}).status_code == 302


# --- Settings behind TLS ---------------------------------------------------------------------

TLS_SETTINGS = (
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_SSL_REDIRECT",
    "WEBSOCKET_ALLOWED_ORIGINS",
)


def settings_with(tmp_path: Path, **env: str) -> dict[str, Any]:
    script = (
        "import json, django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{k: getattr(settings, k) for k in {TLS_SETTINGS!r}}}))"
    )
    base_env = {
        k: v for k, v in os.environ.items() if k not in TLS_SETTINGS and k not in {"CONSOLE_TLS", "CONSOLE_TUNING"}
    }
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={
            **base_env,
            "DJANGO_SETTINGS_MODULE": "console.settings.base",
            "SECRET_KEY": "s" * 50,
            "FIELD_ENCRYPTION_KEY": Fernet.generate_key().decode(),
            "CONSOLE_VAR_DIR": str(tmp_path),
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    values: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return values


def test_console_tls_turns_on_secure_cookies_and_hsts_and_the_proxy_header_is_read(tmp_path: Path) -> None:
    plain = settings_with(tmp_path)
    assert plain["SESSION_COOKIE_SECURE"] is False
    assert plain["SECURE_HSTS_SECONDS"] == 0
    assert plain["SECURE_PROXY_SSL_HEADER"] is None
    tls = settings_with(
        tmp_path,
        CONSOLE_TLS="true",
        SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https",
        CSRF_TRUSTED_ORIGINS="https://console.example.com",
    )
    assert tls["SESSION_COOKIE_SECURE"] is True
    assert tls["CSRF_COOKIE_SECURE"] is True
    assert tls["SECURE_HSTS_SECONDS"] == 31_536_000
    assert tls["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert tls["WEBSOCKET_ALLOWED_ORIGINS"] == ["https://console.example.com"]
    tuned = settings_with(tmp_path, CONSOLE_TLS="true", CONSOLE_TUNING="security.hsts_seconds=600")
    assert tuned["SECURE_HSTS_SECONDS"] == 600
    # HSTS is sent only over TLS, whatever its tuned length.
    assert settings_with(tmp_path, CONSOLE_TUNING="security.hsts_seconds=600")["SECURE_HSTS_SECONDS"] == 0


@pytest.mark.django_db
def test_behind_a_tls_proxy_responses_carry_hsts_and_login_cookies_are_secure(settings: Any) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    make_user("gus")
    client = Client(HTTP_X_FORWARDED_PROTO="https")
    page = client.get(reverse("login"))
    assert page["Strict-Transport-Security"].startswith("max-age=31536000")
    response = client.post(reverse("login"), {"username": "gus", "password": "pw-gus"})
    assert response.status_code == 302
    assert response.cookies["sessionid"]["secure"] is True
    assert "Strict-Transport-Security" not in Client().get(reverse("login"))  # plain http: no HSTS


# --- The websocket Origin check ---------------------------------------------------------------


class Accept(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()


async def handshake(origin: str | None, host: str = "127.0.0.1:8000", **scope: Any) -> bool:
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin is not None else [])
    communicator = WebsocketCommunicator(OriginValidator(Accept.as_asgi()), "/ws/x/", headers=headers)
    communicator.scope.update(scope)
    connected, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return connected


@pytest.mark.asyncio
@pytest.mark.django_db  # Channels' consumer closes stale database connections on every event
async def test_the_websocket_origin_check_compares_the_port() -> None:
    assert await handshake("http://127.0.0.1:8000")
    assert not await handshake("http://127.0.0.1:9000")  # same host, another port: another origin
    assert not await handshake("http://127.0.0.1")  # port 80


@pytest.mark.asyncio
@pytest.mark.django_db  # Channels' consumer closes stale database connections on every event
async def test_the_websocket_origin_check_compares_scheme_and_host() -> None:
    assert not await handshake("https://127.0.0.1:8000")
    assert not await handshake("http://localhost:8000")  # allowed host, but not the one asked for
    assert not await handshake("http://evil.example:8000", host="evil.example:8000")  # not in ALLOWED_HOSTS
    assert not await handshake(None)
    assert not await handshake("null")


@pytest.mark.asyncio
@pytest.mark.django_db  # Channels' consumer closes stale database connections on every event
async def test_a_tls_handshake_and_trusted_origins_are_accepted(settings: Any) -> None:
    assert await handshake("https://localhost", host="localhost", scheme="wss")
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    headers_scope = {
        "headers": [(b"host", b"localhost"), (b"origin", b"https://localhost"), (b"x-forwarded-proto", b"https")]
    }
    communicator = WebsocketCommunicator(OriginValidator(Accept.as_asgi()), "/ws/x/")
    communicator.scope.update(headers_scope)
    assert (await communicator.connect(timeout=5))[0]
    await communicator.disconnect()
    settings.WEBSOCKET_ALLOWED_ORIGINS = ["https://console.example.com:8443"]
    assert await handshake("https://console.example.com:8443")
    assert not await handshake("https://console.example.com")


def test_the_console_routes_websockets_through_the_full_origin_check() -> None:
    from console.asgi import application
    from sandboxes.inbound.proxy import InboundRouter

    routed = application.application_mapping["websocket"]
    # Only /inbound/… (sandbox ports, their own credential and origin rule) passes beside it.
    assert isinstance(routed, InboundRouter)
    assert isinstance(routed.app, OriginValidator)


# --- Bad ids answer 404/400, not 500 ----------------------------------------------------------


@pytest.mark.django_db
def test_a_malformed_terminal_id_is_a_404_not_a_500(world: World) -> None:
    session = Session.objects.create(space=world.space_a, key="t-1", config=make_config(world.space_a))
    url = reverse("sandboxes:terminal_create", kwargs={"session_id": session.id})
    response = world.client_for("bob").post(url, {"terminal_id": "not-a-uuid"})
    assert response.status_code == 404
    assert response.json() == {"error": "No such terminal."}


@pytest.mark.django_db
def test_a_malformed_version_on_the_skill_image_page_is_ignored_not_a_500(world: World) -> None:
    make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock")
    url = reverse("skills:image_detail", kwargs={"space_id": world.space_a.id}) + "?version=not-a-uuid"
    assert world.client_for("carol").get(url).status_code == 200


@pytest.mark.django_db
def test_a_rollback_while_the_backend_is_unreachable_is_a_message_not_a_500(world: World) -> None:
    from sandboxes.catalog.bridge import config_fingerprint
    from skills.models import SkillImage

    config = make_config(world.space_a, endpoint="unix:///tmp/no-such-docker.sock")
    image = SkillImage.objects.create(
        space=world.space_a,
        config=config,
        generation=1,
        status="ready",
        snapshot_id="snap-1",
        fingerprint=config_fingerprint(config),
    )
    url = reverse("skills:image_rollback", kwargs={"space_id": world.space_a.id, "image_id": image.id})
    response = world.client_for("alice").post(url, follow=True)
    assert response.status_code == 200
    assert "could not be asked whether the snapshot is still there" in response.content.decode()
