"""The settings Docker declares (`sandboxes/backends/docker/settings.py`): its endpoints and
what the endpoint guard judges of them, TLS material as secrets and its checks, its limits,
and the typed options the adapter reads (from typed options or the old string bag)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from sandboxes.backends import describe
from sandboxes.backends.base import BackendConfig, ErrorKind, RemoteError
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.docker.settings import ENDPOINT_RULE, SCHEMA, DockerOptions, dialled
from sandboxes.backends.settings import Given, Scope, SettingType
from tests.support.pem import CERT, CERT_BODY, KEY, KEY_BODY, self_signed


def test_docker_declares_its_endpoint_tls_secrets_and_limits() -> None:
    assert describe("docker") is SCHEMA
    declared = {(s.scope, s.name): (s.type, s.secret) for s in SCHEMA.settings}
    assert declared == {
        (Scope.BACKEND, "endpoint"): (SettingType.ENDPOINT, False),
        (Scope.BACKEND, "tls_ca"): (SettingType.PEM, True),
        (Scope.BACKEND, "tls_cert"): (SettingType.PEM, True),
        (Scope.BACKEND, "tls_key"): (SettingType.PEM, True),
        (Scope.BACKEND, "clear_tls"): (SettingType.BOOL, False),
        (Scope.BACKEND, "max_pids"): (SettingType.INT, False),
        (Scope.BACKEND, "max_disk_mb"): (SettingType.INT, False),
        (Scope.CONFIG, "pids_limit"): (SettingType.INT, False),
        (Scope.CONFIG, "disk_mb"): (SettingType.INT, False),
    }
    # The secrets it declares are the secret fields of its options (never in their repr).
    assert {s.name for s in SCHEMA.secrets()} == DockerOptions.secret_names()
    assert KEY_BODY not in repr(DockerOptions(tls_key=KEY, tls_cert=CERT))
    assert SCHEMA.setting("max_disk_mb").label_with_unit == "Most disk per sandbox (MiB)"


@pytest.mark.parametrize(
    ("endpoint", "problem"),
    [
        ("https://docker.example.test", ENDPOINT_RULE),
        ("/var/run/docker.sock", ENDPOINT_RULE),
        ("unix:///etc/passwd", "a regular file"),
        ("unix:///nonexistent/docker.sock", "does not exist"),
    ],
)
def test_an_endpoint_docker_cannot_dial_is_refused_in_words(endpoint: str, problem: str) -> None:
    problems = SCHEMA.problems(Given({"endpoint": endpoint}))
    assert problem.lower() in problems["endpoint"].lower()


def test_the_guard_judges_what_docker_dials() -> None:
    assert dialled("tcp://127.0.0.1:2376") == "tcp://127.0.0.1:2376"
    assert dialled("ssh://admin@[::1]:2222") == "tcp://[::1]:2222"
    assert dialled("ssh://admin@engine.example.test") == "tcp://engine.example.test:22"
    assert dialled("unix:///run/docker.sock") is None  # nothing leaves the host
    assert SCHEMA.problems(Given({"endpoint": ""})) == {}  # empty: the local socket


def test_tls_material_goes_with_a_tcp_endpoint_and_a_certificate_with_its_key() -> None:
    assert SCHEMA.problems(Given({"endpoint": "", "tls_key": KEY, "tls_cert": CERT})) == {
        "tls_cert": "TLS client certificates are for Docker tcp:// endpoints."
    }
    only_cert = SCHEMA.problems(Given({"endpoint": "tcp://127.0.0.1:2376", "tls_cert": CERT}))
    assert only_cert == {"tls_key": "A client certificate needs its key, and a key its certificate."}
    # A stored pair: a new certificate alone replaces the stored one.
    stored = Given({"endpoint": "tcp://127.0.0.1:2376", "tls_cert": CERT}, frozenset({"tls_cert", "tls_key"}))
    assert SCHEMA.problems(stored) == {}
    not_pem = SCHEMA.problems(Given({"endpoint": "tcp://127.0.0.1:2376", "tls_cert": "cert", "tls_key": KEY}))
    assert not_pem == {"tls_cert": "Paste the PEM text (-----BEGIN CERTIFICATE…)."}


def test_a_client_key_needs_a_certificate_typed_or_stored_and_a_ca_is_no_certificate() -> None:
    # Only a CA stored: a key typed alone was accepted and never used (no certificate to pair).
    ca_only = Given({"endpoint": "tcp://127.0.0.1:2376", "tls_key": KEY}, frozenset({"tls_ca"}))
    assert SCHEMA.problems(ca_only) == {"tls_key": "A client certificate needs its key, and a key its certificate."}
    # A stored pair: a new key alone replaces the stored one.
    pair = Given({"endpoint": "tcp://127.0.0.1:2376", "tls_key": KEY}, frozenset({"tls_cert", "tls_key"}))
    assert SCHEMA.problems(pair) == {}
    # A CA alone (the engine's certificate checked, no client certificate) is whole.
    assert SCHEMA.problems(Given({"endpoint": "tcp://127.0.0.1:2376", "tls_ca": CERT})) == {}


def test_removing_the_stored_tls_material_and_typing_new_material_at_once_is_refused() -> None:
    # The switch removes after the typed material is set: what was typed was dropped silently.
    stored = frozenset({"tls_ca", "tls_cert", "tls_key"})
    both = Given({"endpoint": "tcp://127.0.0.1:2376", "clear_tls": True, "tls_cert": CERT, "tls_key": KEY}, stored)
    assert SCHEMA.problems(both) == {
        "clear_tls": "Either remove the stored TLS material or give new material, not both."
    }
    # The switch alone, or with *** kept in the fields, removes them.
    alone = Given({"endpoint": "tcp://127.0.0.1:2376", "clear_tls": True, "tls_cert": "***"}, stored)
    assert SCHEMA.problems(alone) == {}


def test_the_key_field_takes_a_private_key_not_a_certificate_nor_an_encrypted_key() -> None:
    key = SCHEMA.setting("tls_key")
    assert key.validate is not None
    assert key.validate(KEY) is None
    sec1 = serialization.load_pem_private_key(KEY.encode(), None).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    assert b"-----BEGIN EC PRIVATE KEY" in sec1
    assert key.validate(sec1.decode()) is None
    # Certificate and key swapped (or the certificate pasted twice): saved, then every
    # connection failed on the engine's side.
    assert key.validate(CERT) == "Paste the client key's PEM text (-----BEGIN PRIVATE KEY…); a certificate is no key."
    # docker-py gives the key no passphrase: an encrypted key cannot be used.
    encrypted = KEY.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY")
    assert key.validate(encrypted) == "The key is encrypted: Docker's client takes no passphrase; paste it unencrypted."


def test_tls_material_is_parsed_not_only_looked_at_for_its_begin_line() -> None:
    ca, cert, key = (SCHEMA.setting(name).validate for name in ("tls_ca", "tls_cert", "tls_key"))
    assert ca is not None
    assert cert is not None
    assert key is not None
    unparsable = "This PEM text is not a {} that parses: paste it whole, as the file holds it."
    for check in (ca, cert):
        assert check(CERT) is None
        assert check(CERT + "\n" + self_signed("other.test")[0]) is None  # a bundle
        assert check("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----") == (
            unparsable.format("certificate")
        )
        assert check(CERT.replace(CERT_BODY, CERT_BODY[::-1])) == unparsable.format("certificate")
    assert key("-----BEGIN PRIVATE KEY-----\nMIIEfake\n-----END PRIVATE KEY-----") == unparsable.format("private key")
    protected = serialization.load_pem_private_key(KEY.encode(), None).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    assert key(protected.decode()) == "The key is encrypted: Docker's client takes no passphrase; paste it unencrypted."


def test_the_adapter_reads_its_typed_options_as_the_old_string_bag_gave_them(tmp_path: Path) -> None:
    bag = {"network": "n-test", "timeout": "7", "control_timeout": "2.5", "proxy_dns": "127.0.0.1, 127.0.0.2",
           "egress_log_max_bytes": "4096", "disk_dir": str(tmp_path), "template_build_disk_mb": "64",
           "host_firewall": "external", "inbound_url": "/in/", "sandbox_url": "ignored: not Docker's"}  # fmt: skip
    typed = DockerOptions.parse(bag)
    assert typed == DockerOptions(
        network="n-test",
        timeout=7,
        control_timeout=2.5,
        proxy_dns=("127.0.0.1", "127.0.0.2"),
        egress_log_max_bytes=4096,
        disk_dir=str(tmp_path),
        template_build_disk_mb=64,
        host_firewall="external",
        inbound_url="/in/",
    )
    for options in (bag, typed):
        backend = DockerBackend(BackendConfig(kind="docker", endpoint="tcp://127.0.0.1:9", options=options))
        assert backend.options == typed
        assert (backend.engine.api_timeout, backend.engine.control_timeout) == (7, 2.5)
        assert backend.networks.prefix == "n-test"
        assert (backend.disk.root, backend.disk.build_disk_mb) == (tmp_path, 64)
        assert backend.outbound.settings.proxy_dns == ("127.0.0.1", "127.0.0.2")
        backend.close()


@pytest.mark.parametrize(
    ("bag", "named"),
    [
        ({"timeout": "ten"}, "timeout"),
        ({"control_timeout": "0"}, "control_timeout"),
        ({"host_firewall": "off"}, "host_firewall"),
    ],
)
def test_an_option_the_adapter_cannot_use_is_an_invalid_error(bag: dict[str, str], named: str) -> None:
    with pytest.raises(RemoteError) as caught:
        DockerBackend(BackendConfig(kind="docker", endpoint="tcp://127.0.0.1:9", options=bag))
    assert caught.value.kind == ErrorKind.INVALID
    assert named in caught.value.message
