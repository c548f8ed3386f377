"""Real PEM material for tests of TLS settings: a self-signed certificate and its key, made
once per process (tests/support/tls_engine.py issues them; the console parses what an admin
pastes)."""

from __future__ import annotations

import functools

from cryptography.hazmat.primitives import serialization

from tests.support.tls_engine import _issue, _key_pem


@functools.cache
def self_signed(name: str = "console.test") -> tuple[str, str]:
    """(certificate PEM, unencrypted PKCS#8 key PEM), each without a final newline."""
    certificate, key = _issue(name, None, None, ca=True, server=False)
    return certificate.public_bytes(serialization.Encoding.PEM).decode().strip(), _key_pem(key).strip()


CERT, KEY = self_signed()
# A line of each body: what a page or a log must never show.
CERT_BODY, KEY_BODY = CERT.splitlines()[1], KEY.splitlines()[1]
