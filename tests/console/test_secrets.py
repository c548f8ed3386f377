"""Secrets at rest: no start on public keys, kept keys for `make start`, rotation, no echo.

The start-up cases run a real Python process on the console's settings (nothing else of
the console is started), so "refuses to start" is what an operator would see.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.urls import reverse

from console.crypto import DEFAULT_SECRET_KEY, check_secrets, decrypt, derived_key, encrypt
from console.models import AuditEvent
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.factories import make_backend, make_config
from tests.personas import World
from tests.sandboxes.catalog.test_configs import config_form_data

REPO = Path(__file__).resolve().parents[2]
KEY_VARS = ("SECRET_KEY", "FIELD_ENCRYPTION_KEY", "FIELD_ENCRYPTION_OLD_KEYS", "DEBUG")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEY_VARS and k != "DJANGO_SETTINGS_MODULE"}
    env.update(CONSOLE_VAR_DIR=str(tmp_path), DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", REDIS_URL="")
    env.update(extra)
    return env


def start_console(
    tmp_path: Path, settings_module: str = "console.settings.base", **env: str
) -> subprocess.CompletedProcess[str]:
    """Set Django up as Daphne or manage.py would, in a fresh process."""
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('started')"],
        cwd=REPO,
        env=clean_env(tmp_path, DJANGO_SETTINGS_MODULE=settings_module, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- Refusing to start -----------------------------------------------------------------------


def test_outside_debug_the_console_refuses_to_start_on_the_default_secret_key(tmp_path: Path) -> None:
    result = start_console(tmp_path, FIELD_ENCRYPTION_KEY=Fernet.generate_key().decode())
    assert result.returncode != 0
    assert "refuses to start" in result.stderr
    assert "SECRET_KEY is the public embedded default" in result.stderr
    assert "secrets.token_urlsafe" in result.stderr  # says how to make one


def test_outside_debug_the_console_refuses_to_start_without_a_field_encryption_key(tmp_path: Path) -> None:
    result = start_console(tmp_path, SECRET_KEY="a-real-secret-key-for-this-test-only")
    assert result.returncode != 0
    assert "FIELD_ENCRYPTION_KEY is not set" in result.stderr
    assert "Fernet.generate_key()" in result.stderr


def test_the_console_starts_with_both_keys_and_in_debug_without_them(tmp_path: Path) -> None:
    both = start_console(tmp_path, SECRET_KEY="a-real-secret-key", FIELD_ENCRYPTION_KEY=Fernet.generate_key().decode())
    assert both.returncode == 0, both.stderr
    assert start_console(tmp_path, DEBUG="true").returncode == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"SECRET_KEY": "a-real-secret-key-for-this-test-only", "FIELD_ENCRYPTION_KEY": "not-a-key"},
            "not a Fernet key",
        ),
        ({"FIELD_ENCRYPTION_KEY": Fernet.generate_key().decode()}, "SECRET_KEY is the public embedded default"),
    ],
)
def test_a_refused_start_is_a_message_not_a_traceback(tmp_path: Path, env: dict[str, str], message: str) -> None:
    result = start_console(tmp_path, **env)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_a_malformed_field_encryption_key_is_refused_at_start(settings: Any) -> None:
    settings.FIELD_ENCRYPTION_KEY = "not-a-fernet-key"
    with pytest.raises(ImproperlyConfigured, match="not a Fernet key"):
        check_secrets()


def test_the_test_settings_keep_their_own_keys(settings: Any) -> None:
    assert settings.SECRET_KEY != DEFAULT_SECRET_KEY
    assert settings.FIELD_ENCRYPTION_KEY
    check_secrets()


# --- `make start` keeps its keys in var/ -------------------------------------------------------


def source_keys(tmp_path: Path, **env: str) -> tuple[str, str, str]:
    result = subprocess.run(
        [
            "bash",
            "-c",
            'set -euo pipefail; source scripts/keys.sh; echo "$SECRET_KEY|$FIELD_ENCRYPTION_KEY|$LEGACY_SECRET_KEY"',
        ],
        cwd=REPO,
        env={**clean_env(tmp_path, **env), "PYTHON_BIN": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    secret, field_key, legacy = result.stdout.strip().splitlines()[-1].split("|")
    return secret, field_key, legacy


def test_make_start_generates_the_keys_once_keeps_them_in_var_and_starts_on_them(tmp_path: Path) -> None:
    secret, field_key, legacy = source_keys(tmp_path)
    assert len(secret) >= 50
    assert secret != DEFAULT_SECRET_KEY
    Fernet(field_key.encode())  # a valid key
    assert legacy == DEFAULT_SECRET_KEY  # a console from before may hold secrets under the derived key
    for name in ("secret-key", "field-encryption-key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    assert source_keys(tmp_path) == (secret, field_key, "")  # the next start: same keys
    # The embedded settings read the kept keys, so manage.py and Daphne start on them.
    result = start_console(tmp_path, "console.settings.dev")
    assert result.returncode == 0, result.stderr


def test_keys_set_in_the_environment_win_over_kept_ones(tmp_path: Path) -> None:
    source_keys(tmp_path)
    field_key = Fernet.generate_key().decode()
    assert source_keys(tmp_path, SECRET_KEY="from-env", FIELD_ENCRYPTION_KEY=field_key) == ("from-env", field_key, "")


# --- Rotation -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_rotation_re_encrypts_stored_secrets_with_the_new_key(world: World, settings: Any) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEY = old
    config = make_config(world.space_a, kind="e2b", api_key="sk-rotate-me")
    legacy = make_config(world.space_b, kind="e2b")
    legacy_token = Fernet(derived_key(DEFAULT_SECRET_KEY).encode()).encrypt(b"sk-from-before").decode()
    SandboxConfig.objects.filter(pk=legacy.pk).update(api_key_encrypted=legacy_token)

    settings.FIELD_ENCRYPTION_KEY, settings.FIELD_ENCRYPTION_OLD_KEYS = new, [old]
    call_command("rotate_field_encryption_key", "--legacy-secret-key", DEFAULT_SECRET_KEY)

    settings.FIELD_ENCRYPTION_OLD_KEYS = []  # the old key is dropped: only the new one reads them
    backend = PlatformBackend.objects.get(pk=config.backend_id)  # make_config puts the key on it
    legacy.refresh_from_db()
    assert decrypt(backend.api_key_encrypted) == "sk-rotate-me"
    assert decrypt(legacy.api_key_encrypted) == "sk-from-before"  # a space's own key, on the config
    assert Fernet(new.encode()).decrypt(backend.api_key_encrypted.encode()) == b"sk-rotate-me"
    event = AuditEvent.objects.get(action="secrets.rotate")
    assert event.details == {"rotated": 2, "unreadable": []}


@pytest.mark.django_db
def test_rotation_reports_a_secret_no_key_reads_and_leaves_it_unchanged(world: World, settings: Any) -> None:
    config = make_config(world.space_a, kind="e2b")
    stray = Fernet(Fernet.generate_key()).encrypt(b"sk-lost").decode()
    SandboxConfig.objects.filter(pk=config.pk).update(api_key_encrypted=stray)
    readable = make_config(world.space_b, kind="e2b", api_key="sk-fine")
    with pytest.raises(CommandError, match="could not be read with any configured key"):
        call_command("rotate_field_encryption_key")
    config.refresh_from_db()
    assert config.api_key_encrypted == stray
    assert decrypt(PlatformBackend.objects.get(pk=readable.backend_id).api_key_encrypted) == "sk-fine"


def test_the_current_key_encrypts_and_old_keys_still_read(settings: Any) -> None:
    old = Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEY = old
    token = encrypt("sk-1")
    settings.FIELD_ENCRYPTION_KEY, settings.FIELD_ENCRYPTION_OLD_KEYS = Fernet.generate_key().decode(), [old]
    assert decrypt(token) == "sk-1"
    with pytest.raises(Exception):  # noqa: B017, PT011 - InvalidToken: the new token is not the old key's
        Fernet(old.encode()).decrypt(encrypt("sk-2").encode())


# --- Typed secrets are never rendered back ---------------------------------------------------


def own_key_backend(world: World) -> PlatformBackend:
    """An E2B backend on a public address literal (nothing is resolved or sent) that lets
    spaces bring their own key."""
    backend: PlatformBackend = make_backend(
        world.space_a,
        kind="e2b",
        endpoint="https://[2606:4700::1]",
        domain="e2b.example.com",
        api_key="platform-key",
        allow_space_api_key=True,
    )
    return backend


@pytest.mark.django_db
def test_a_config_form_that_fails_validation_does_not_echo_the_typed_api_key(world: World) -> None:
    typed = "sk-typed-secret-0123456789"
    url = reverse("sandboxes:config_create", args=[world.space_a.id])
    data = config_form_data(own_key_backend(world), api_key=typed, cpus="0")
    response = world.client_for("alice").post(url, data)
    assert response.status_code == 400
    assert "cpus" in response.context["form"].errors
    assert typed not in response.content.decode()


@pytest.mark.django_db
def test_an_edit_form_shows_the_stored_key_redacted_and_never_a_retyped_one(world: World) -> None:
    config = make_config(world.space_a, backend=own_key_backend(world))
    SandboxConfig.objects.filter(pk=config.pk).update(api_key_encrypted=encrypt("sk-stored"))
    url = reverse("sandboxes:config_edit", args=[config.id])
    page = world.client_for("alice").get(url).content.decode()
    assert 'value="***"' in page
    assert "sk-stored" not in page
    typed = "sk-retyped-secret-987654321"
    data = config_form_data(config.backend, api_key=typed, cpus="0")
    response = world.client_for("alice").post(url, data)
    assert response.status_code == 400
    assert typed not in response.content.decode()
    assert "sk-stored" not in response.content.decode()


@pytest.mark.django_db
def test_a_backend_form_that_fails_validation_does_not_echo_the_typed_tls_key(world: World) -> None:
    """The TLS client key is a secret like the API key ("never shown again"): a form sent
    back for another field's error must not carry it in the page."""
    from tests.sandboxes.catalog.test_platform_backends import backend_form

    typed_key = "-----BEGIN PRIVATE KEY-----\nTYPEDSECRETKEYMATERIAL0123456789\n-----END PRIVATE KEY-----"
    data = backend_form(
        endpoint="tcp://127.0.0.1:2376",
        allow_private_endpoints="on",
        tls_cert="-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
        tls_key=typed_key,
        max_cpus="0",  # the error that sends the form back
    )
    response = world.client_for("root").post(reverse("sandboxes:backend_create"), data)
    assert response.status_code == 400
    assert "max_cpus" in response.context["form"].errors
    assert "TYPEDSECRETKEYMATERIAL" not in response.content.decode()


@pytest.mark.parametrize(
    "url",
    ["https://deploy:s3cr3t-pass@api.example.com/", "tcp://u:s3cr3t-pass@[::1", "http://:s3cr3t-pass@h:99999/"],
)
def test_guard_errors_never_repeat_a_password_in_the_url(url: str) -> None:
    """Guard messages end up in form errors, health details, job logs and audit rows."""
    from sandboxes.backends.base import RemoteError
    from sandboxes.backends.guard import split_endpoint

    with pytest.raises(RemoteError) as raised:
        split_endpoint(url)
    assert "s3cr3t-pass" not in raised.value.message
