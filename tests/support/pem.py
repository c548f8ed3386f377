"""Real PEM material for tests of TLS settings: a self-signed certificate and its key, made
once per process with `cryptography` (the console parses what an admin pastes)."""

from __future__ import annotations

import datetime
import functools

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@functools.cache
def self_signed(name: str = "console.test") -> tuple[str, str]:
    """(certificate PEM, unencrypted PKCS#8 key PEM), each without a final newline."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM).decode().strip()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return cert_pem, key_pem.strip()


CERT, KEY = self_signed()
# A line of each body: what a page or a log must never show.
CERT_BODY, KEY_BODY = CERT.splitlines()[1], KEY.splitlines()[1]
