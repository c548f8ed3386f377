"""What a Docker backend takes from the admins (`SCHEMA`) and the typed options its adapter
reads (`DockerOptions`); no Django, no Docker SDK (the console reads it to build its forms)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from ..settings import Given, Options, Scope, Setting, SettingsSchema, SettingType, disk_settings, secret_field
from ..unix_socket import SCHEME as UNIX_SCHEME
from ..unix_socket import unix_socket_problem

SCHEMES = ("tcp://", "unix://", "ssh://")
ENDPOINT_RULE = "A Docker endpoint is empty (local socket), unix:///path, tcp://host:port or ssh://."
TLS = ("tls_ca", "tls_cert", "tls_key")


@dataclass(frozen=True, kw_only=True)
class DockerOptions(Options):
    """What the Docker adapter reads besides the endpoint (docs/backends.md). Empty or None:
    the adapter's default (its modules hold them: `common`, `image`, `repair`, `disk`,
    `inbound`, `egress`)."""

    network: str = ""  # prefix of the per-space bridge networks
    base_image: str = ""  # the template a build names none of
    timeout: int | None = None  # seconds per engine call
    control_timeout: float | None = None  # seconds per pause, unpause and inspect
    host_firewall: str = "auto"  # "auto" or "external" (docs/network.md)
    dns_upstream: str = ""  # the resolver the space networks' dnsmasq forwards to
    proxy_dns: tuple[str, ...] = ()  # the proxy's resolvers (empty: from dns_upstream)
    egress_state_dir: str = ""
    proxy_state_dir: str = ""
    egress_log_max_bytes: int | None = None
    disk_dir: str = ""  # the host folder of the bounded file systems
    template_build_disk_mb: int | None = None
    inbound_url: str = ""  # the console's route to sandbox ports
    snapshot_max_layers: int | None = None  # past this depth a snapshot is flattened (snapshots.py)
    tls_ca: str = secret_field()
    tls_cert: str = secret_field()
    tls_key: str = secret_field()


def _endpoint_problem(endpoint: str) -> str | None:
    if not endpoint.startswith(SCHEMES):
        return ENDPOINT_RULE
    if endpoint.startswith(UNIX_SCHEME):
        return unix_socket_problem(endpoint)
    return None


def dialled(endpoint: str) -> str | None:
    """What the endpoint guard judges: ssh://user@host[:port] as tcp://host:port, a unix
    socket not at all (nothing leaves the host)."""
    if endpoint.startswith(UNIX_SCHEME):
        return None
    if not endpoint.startswith("ssh://"):
        return endpoint
    parts = urlsplit(endpoint)
    if not parts.hostname:
        raise ValueError(f"{endpoint!r}: no host name")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"tcp://{host}:{parts.port or 22}"


def _certificates_problem(value: str) -> str | None:
    """One or more certificates (a CA bundle, or a client certificate), each one parsed."""
    if "-----BEGIN CERTIFICATE" not in value:
        return "Paste the PEM text (-----BEGIN CERTIFICATE…)."
    try:
        x509.load_pem_x509_certificates(value.encode())
    except ValueError:
        return "This PEM text is not a certificate that parses: paste it whole, as the file holds it."
    return None


_PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")
_ENCRYPTED = "The key is encrypted: Docker's client takes no passphrase; paste it unencrypted."


def _key_problem(value: str) -> str | None:
    """A client key: a private key's PEM block (RSA, EC or PKCS#8) that parses, never a
    certificate, and unencrypted (docker-py's TLSConfig gives the key no passphrase)."""
    if "-----BEGIN ENCRYPTED PRIVATE KEY" in value or "Proc-Type: 4,ENCRYPTED" in value:
        return _ENCRYPTED
    if not _PRIVATE_KEY.search(value):
        return "Paste the client key's PEM text (-----BEGIN PRIVATE KEY…); a certificate is no key."
    try:
        serialization.load_pem_private_key(value.encode(), password=None)
    except TypeError:  # it asks for a password
        return _ENCRYPTED
    except (ValueError, UnsupportedAlgorithm):
        return "This PEM text is not a private key that parses: paste it whole, as the file holds it."
    return None


def _check(given: Given, schema: SettingsSchema) -> dict[str, str]:
    """TLS material goes with a tcp:// endpoint, a client certificate with its key (typed now
    or stored; a CA is neither), and new material is not typed while the stored is removed
    (the removal would drop it)."""
    problems: dict[str, str] = {}
    typed = {name for name in TLS if given.get(name) and given.get(name) != "***"}
    if typed and not str(given.get("endpoint") or "").startswith("tcp://"):
        problems["tls_cert"] = "TLS client certificates are for Docker tcp:// endpoints."
    if typed and given.get("clear_tls"):
        problems["clear_tls"] = "Either remove the stored TLS material or give new material, not both."
        return problems
    held = typed | (given.stored_secrets & {"tls_cert", "tls_key"})
    if typed and ("tls_cert" in held) != ("tls_key" in held):
        problems["tls_key"] = "A client certificate needs its key, and a key its certificate."
    return problems


MAX_DISK, DISK = disk_settings("the config page says where it holds.")

SCHEMA = SettingsSchema(
    label="Docker",
    options=DockerOptions,
    check=_check,
    settings=(
        Setting(
            "endpoint",
            "Endpoint",
            SettingType.ENDPOINT,
            help=ENDPOINT_RULE,
            validate=_endpoint_problem,
            dials=dialled,
        ),
        Setting(
            "tls_ca",
            "TLS CA certificate (PEM)",
            SettingType.PEM,
            secret=True,
            validate=_certificates_problem,
            help="A tcp:// endpoint with TLS: the CA the engine's certificate is checked against. "
            "Stored encrypted; leave *** (or empty) to keep it.",
        ),
        Setting(
            "tls_cert",
            "TLS client certificate (PEM)",
            SettingType.PEM,
            secret=True,
            validate=_certificates_problem,
            help="A tcp:// endpoint with TLS: the console's client certificate. "
            "Stored encrypted; leave *** (or empty) to keep it.",
        ),
        Setting(
            "tls_key",
            "TLS client key (PEM)",
            SettingType.PEM,
            secret=True,
            validate=_key_problem,
            help="Stored encrypted, never shown again; leave *** (or empty) to keep it.",
        ),
        Setting(
            "clear_tls",
            "Remove the stored TLS material",
            SettingType.BOOL,
            clears=TLS,
            help="Ticked: the stored CA, client certificate and key are removed on save.",
        ),
        Setting(
            "max_pids",
            "Most processes per sandbox",
            SettingType.INT,
            minimum=16,
            maximum=100_000,
            help="The most processes a config on this backend may allow a sandbox.",
        ),
        MAX_DISK,
        Setting(
            "pids_limit",
            "Process limit",
            SettingType.INT,
            scope=Scope.CONFIG,
            minimum=16,
            maximum=100_000,
            help="Most processes per sandbox.",
        ),
        DISK,
    ),
)
