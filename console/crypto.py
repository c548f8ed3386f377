"""Encryption at rest for secrets such as backend API keys (Fernet, FIELD_ENCRYPTION_KEY)."""

from __future__ import annotations

import base64
import functools
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

REDACTED = "***"


@functools.cache
def _fernet(key_setting: str, secret_key: str) -> Fernet:
    if key_setting:
        return Fernet(key_setting.encode())
    # No explicit key: derive one from SECRET_KEY so the embedded console works; rotating
    # SECRET_KEY then makes stored API keys unreadable (they must be entered again).
    derived = base64.urlsafe_b64encode(hashlib.sha256(("field-encryption:" + secret_key).encode()).digest())
    return Fernet(derived)


def fernet() -> Fernet:
    return _fernet(settings.FIELD_ENCRYPTION_KEY, settings.SECRET_KEY)


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
