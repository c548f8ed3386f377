"""Encryption at rest for secrets such as backend API keys (Fernet, FIELD_ENCRYPTION_KEY).

Secrets are encrypted with FIELD_ENCRYPTION_KEY's first key and read with it or any key listed
after it (the setting FIELD_ENCRYPTION_OLD_KEYS; a MultiFernet), so a key can be rotated
without downtime: put the new key first, run `manage.py rotate_field_encryption_key`, then drop
the old key. Every model field named `*_encrypted` holds such a token.

Outside DEBUG the console refuses to start on the embedded default SECRET_KEY or without
FIELD_ENCRYPTION_KEY (`check_secrets`, called when the console app is ready). In DEBUG a
missing FIELD_ENCRYPTION_KEY is still derived from SECRET_KEY, for throwaway consoles only.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

REDACTED = "***"

# The key of settings/base.py when no SECRET_KEY is set: public, so never good for secrets.
DEFAULT_SECRET_KEY = "insecure-local-console-key-set-SECRET_KEY-in-production"  # noqa: S105

HOW_TO_MAKE_A_KEY = (
    "make one with `python -c 'import secrets; print(secrets.token_urlsafe(50))'` for SECRET_KEY and "
    "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'` for "
    "FIELD_ENCRYPTION_KEY, and set them in the environment (`make start` keeps its own in var/)"
)


def derived_key(secret_key: str) -> str:
    """The Fernet key earlier consoles derived from SECRET_KEY when FIELD_ENCRYPTION_KEY was unset."""
    return base64.urlsafe_b64encode(hashlib.sha256(("field-encryption:" + secret_key).encode()).digest()).decode()


def _key(value: str, name: str) -> Fernet:
    try:
        return Fernet(value.encode())
    except ValueError:
        raise ImproperlyConfigured(
            f"{name} is not a Fernet key (32 bytes, urlsafe base64); {HOW_TO_MAKE_A_KEY}."
        ) from None


def _fernet(primary: str, old_keys: tuple[str, ...], secret_key: str) -> MultiFernet:
    keys = [_key(primary, "FIELD_ENCRYPTION_KEY") if primary else Fernet(derived_key(secret_key).encode())]
    keys += [_key(old, "an old key in FIELD_ENCRYPTION_KEY") for old in old_keys]
    return MultiFernet(keys)


def fernet() -> MultiFernet:
    """Encrypts with FIELD_ENCRYPTION_KEY; decrypts with it or any of FIELD_ENCRYPTION_OLD_KEYS."""
    old_keys = tuple(getattr(settings, "FIELD_ENCRYPTION_OLD_KEYS", ()))
    return _fernet(settings.FIELD_ENCRYPTION_KEY, old_keys, settings.SECRET_KEY)


def check_secrets() -> None:
    """Refuse to run outside DEBUG on the public default SECRET_KEY or without FIELD_ENCRYPTION_KEY."""
    if settings.DEBUG:
        return
    problems = []
    if not settings.SECRET_KEY or settings.SECRET_KEY == DEFAULT_SECRET_KEY:
        problems.append("SECRET_KEY is the public embedded default")
    if not settings.FIELD_ENCRYPTION_KEY:
        problems.append("FIELD_ENCRYPTION_KEY is not set (stored API keys would be encrypted with a derived key)")
    if problems:
        raise ImproperlyConfigured(
            "The console refuses to start: " + "; ".join(problems) + f". Outside DEBUG, {HOW_TO_MAKE_A_KEY}."
        )
    fernet()  # a malformed key fails here, at start, not at the first secret


def encrypt(plaintext: str) -> str:
    if not plaintext:
        return ""
    return fernet().encrypt(plaintext.encode()).decode()


class SecretUnreadable(Exception):
    """The stored secret was encrypted with another key."""


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        return fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("the stored secret cannot be decrypted with FIELD_ENCRYPTION_KEY") from None


def rotate(token: str, *, extra_old_keys: tuple[str, ...] = ()) -> str:
    """`token` re-encrypted with FIELD_ENCRYPTION_KEY, read with any configured key or these."""
    if not token:
        return ""
    old_keys = (*getattr(settings, "FIELD_ENCRYPTION_OLD_KEYS", ()), *extra_old_keys)
    try:
        return _fernet(settings.FIELD_ENCRYPTION_KEY, old_keys, settings.SECRET_KEY).rotate(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable("the stored secret cannot be decrypted with any configured key") from None
