"""Inbound URLs on hosts of their own: with `INBOUND_BASE_URL` a wildcard origin such as
`https://*.sandboxes.example.net`, every port of every sandbox is issued its own origin,
`https://<label>-<port>.sandboxes.example.net/`, so a page of one sandbox is never
same-origin with another's (its storage, cookies and same-origin reads stay its own).

The label is opaque: 26 characters that encrypt the session's id under a key derived from
SECRET_KEY (one AES block: a keyed permutation of a unique value, unreadable and unforgeable
without the key), then 8 characters of a keyed tag of the session's current sandbox id. So
the proxy finds the session from the host alone, without a table of hosts, a sandbox id
never shows in a URL, a label cannot be guessed or made for another session, and a rebuilt
session (another sandbox) has another host: the old one answers 404 like any unknown host.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import re
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from django.conf import settings
from django.core import checks
from django.utils.crypto import salted_hmac

KEY_SALT = "sandboxes.inbound.host"
SESSION_CHARS = 26  # one 16-byte AES block in base32, without its padding
TAG_CHARS = 8  # 5 bytes of the sandbox tag in base32
LABEL_CHARS = SESSION_CHARS + TAG_CHARS
MAX_DOMAIN_CHARS = 253 - (LABEL_CHARS + len("-65535."))
_HOST_LABEL = re.compile(rf"^([a-z2-7]{{{LABEL_CHARS}}})-([1-9][0-9]{{0,4}})$")
_DNS_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
HOW_TO = (
    "INBOUND_BASE_URL is either empty (inbound URLs on the console's own origin, under CSP "
    "sandbox) or a wildcard origin, scheme://*.<domain>[:port], such as "
    "https://*.sandboxes.example.net, whose every name (<label>-<port>.sandboxes.example.net) "
    "reaches the console: a wildcard DNS record and a wildcard TLS certificate (docs/inbound.md)"
)


@dataclass(frozen=True)
class SharedDomain:
    """The parsed wildcard of INBOUND_BASE_URL."""

    scheme: str  # "https" or "http"
    domain: str  # lower case, without the "*." and without a port
    port: str  # ":8443", or "" for the scheme's default

    def url(self, label: str, port: int) -> str:
        return f"{self.scheme}://{label}-{port}.{self.domain}{self.port}/"


@dataclass(frozen=True)
class HostRoute:
    """A request's Host on the wildcard domain: the label and port it names, or `valid=False`
    for a name on the domain that is no label of ours (the proxy answers it 404)."""

    label: str
    port: int
    valid: bool


def setting_problem(value: str) -> str:
    """What is wrong with an INBOUND_BASE_URL value ("" when it is usable)."""
    if not value:
        return ""
    try:
        parts = urlsplit(value)
        explicit_port = parts.port
    except ValueError as exc:
        return f"INBOUND_BASE_URL={value!r} is not a URL ({exc}). {HOW_TO}."
    if parts.scheme not in ("http", "https"):
        return f"INBOUND_BASE_URL={value!r} must start with https:// (or http:// locally). {HOW_TO}."
    if parts.username is not None or parts.password is not None:
        return f"INBOUND_BASE_URL={value!r} must not carry a user name or password. {HOW_TO}."
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"INBOUND_BASE_URL={value!r} must be an origin only, without a path, query or fragment. {HOW_TO}."
    host = (parts.hostname or "").lower()
    if not host.startswith("*."):
        return (
            f"INBOUND_BASE_URL={value!r} names one host: every sandbox's pages would share one origin and "
            f"read each other's. {HOW_TO}."
        )
    domain = host[2:]
    if explicit_port == 0:
        return f"INBOUND_BASE_URL={value!r}: the port is 1 to 65535. {HOW_TO}."
    if not domain or "*" in domain or not all(_DNS_LABEL.match(name) for name in domain.split(".")):
        return f"INBOUND_BASE_URL={value!r}: {domain!r} is not a domain name. {HOW_TO}."
    if domain.rsplit(".", 1)[-1].isdigit() or _is_address(domain):
        return f"INBOUND_BASE_URL={value!r}: a wildcard needs a domain name, not an address. {HOW_TO}."
    if len(domain) > MAX_DOMAIN_CHARS:
        return f"INBOUND_BASE_URL={value!r}: the domain is over {MAX_DOMAIN_CHARS} characters. {HOW_TO}."
    for name, cookie_domain in (
        ("SESSION_COOKIE_DOMAIN", settings.SESSION_COOKIE_DOMAIN),
        ("CSRF_COOKIE_DOMAIN", settings.CSRF_COOKIE_DOMAIN),
    ):
        covered = (cookie_domain or "").lower().lstrip(".")
        if covered and (domain == covered or domain.endswith("." + covered)):
            return (
                f"{name}={cookie_domain!r} sends the console's cookie to every sandbox host of "
                f"INBOUND_BASE_URL={value!r}: leave it unset, or give inbound URLs a domain outside it."
            )
    for allowed in settings.ALLOWED_HOSTS:
        name = allowed.lower().split(":", 1)[0]
        if name.startswith(".") or name == "*":
            continue
        if name.endswith("." + domain):
            return (
                f"ALLOWED_HOSTS names {allowed!r}, a host under INBOUND_BASE_URL={value!r}: that host would "
                "be taken for a sandbox's; serve the console on a name outside the inbound domain."
            )
        if "." in name and (name == domain or domain.endswith("." + name)):
            # A console on the domain itself or a parent of it: every sandbox page could set
            # cookies for it (Domain=<name>), such as a session of the tenant's choosing. A
            # single label (localhost) is a top-level domain to browsers: nobody can.
            return (
                f"ALLOWED_HOSTS names {allowed!r}, the domain of INBOUND_BASE_URL={value!r} or a parent of it: "
                "every sandbox page could set the console's cookies; serve the console on a name outside it."
            )
    return ""


def check_setting(app_configs: object = None, **kwargs: object) -> list[checks.CheckMessage]:
    """The system check (`manage.py check`, migrate): an unusable INBOUND_BASE_URL is an error;
    the ASGI app refuses to start on it too (sandboxes/inbound/proxy.py)."""
    problem = setting_problem(settings.INBOUND_BASE_URL)
    return [checks.Error(problem, id="sandboxes.E001")] if problem else []


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _parsed(value: str) -> SharedDomain | None:
    if not value or setting_problem(value):
        return None
    parts = urlsplit(value)
    default = {"http": 80, "https": 443}[parts.scheme]
    port = f":{parts.port}" if parts.port is not None and parts.port != default else ""
    return SharedDomain(parts.scheme, (parts.hostname or "").lower()[2:], port)


def shared_domain() -> SharedDomain | None:
    """The wildcard of INBOUND_BASE_URL; None in the console-origin mode (or when the setting
    is unusable: the startup check refuses that with its reason)."""
    return _parsed(settings.INBOUND_BASE_URL)


# --- Labels ------------------------------------------------------------------------------


def _secrets() -> list[str | bytes]:
    """The key labels are made with, then the ones they are still read with: Django's
    rotation (`SECRET_KEY_FALLBACKS`), as for the signed links, so issued hosts outlive it."""
    return [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]


def _keys(secret: str | bytes) -> tuple[bytes, bytes]:
    block = salted_hmac(KEY_SALT, "session-block", secret=secret, algorithm="sha256").digest()
    tag = salted_hmac(KEY_SALT, "sandbox-tag", secret=secret, algorithm="sha256").digest()
    return block, tag


def _cipher(secret: str | bytes) -> Cipher[modes.ECB]:
    # ECB on exactly one block is a keyed permutation of that block (the session's id, unique
    # per session): nothing repeats that a mode would have to hide.
    return Cipher(algorithms.AES(_keys(secret)[0]), modes.ECB())  # noqa: S305


def _b32(data: bytes) -> str:
    return base64.b32encode(data).decode().rstrip("=").lower()


def _sandbox_tag(session_id: uuid.UUID, sandbox_id: str, secret: str | bytes) -> str:
    digest = hmac.new(_keys(secret)[1], session_id.bytes + b"|" + sandbox_id.encode(), "sha256").digest()
    return _b32(digest[:5])


def host_label(session_id: uuid.UUID, sandbox_id: str) -> str:
    """The opaque label of one sandbox of one session (its ports add "-<port>"), made with
    the current key."""
    secret = settings.SECRET_KEY
    encryptor = _cipher(secret).encryptor()
    block = encryptor.update(session_id.bytes) + encryptor.finalize()
    return _b32(block) + _sandbox_tag(session_id, sandbox_id, secret)


@dataclass(frozen=True)
class LabelRead:
    """What a label says under one key: the session id it names and its sandbox tag. Any
    block decrypts to some id, so only `matches` (the tag, under the same key) tells."""

    session_id: uuid.UUID
    tag: str
    secret: str | bytes

    def matches(self, session_id: uuid.UUID, sandbox_id: str) -> bool:
        expected = _sandbox_tag(session_id, sandbox_id, self.secret)
        return bool(sandbox_id) and hmac.compare_digest(self.tag.encode(), expected.encode())


def read_label(label: str) -> list[LabelRead]:
    """The label read under the current key and each fallback (in that order); empty when
    it is no label of ours."""
    if len(label) != LABEL_CHARS:
        return []
    head, tag = label[:SESSION_CHARS], label[SESSION_CHARS:]
    try:
        block = base64.b32decode(head.upper() + "======")
    except (binascii.Error, ValueError):
        return []
    if len(block) != 16 or _b32(block) != head:  # one spelling per label
        return []
    reads = []
    for secret in _secrets():
        decryptor = _cipher(secret).decryptor()
        reads.append(LabelRead(uuid.UUID(bytes=decryptor.update(block) + decryptor.finalize()), tag, secret))
    return reads


def host_url(domain: SharedDomain, session_id: uuid.UUID, sandbox_id: str, port: int) -> str:
    return domain.url(host_label(session_id, sandbox_id), port)


def host_route(host: str, domain: SharedDomain | None = None) -> HostRoute | None:
    """Where a request's Host header (as sent, with its port) points on the wildcard domain;
    None when it is not on that domain at all (the console's own business)."""
    domain = domain or shared_domain()
    if domain is None or not host:
        return None
    host = host.lower()
    name, _, port = host.rpartition(":") if not host.endswith("]") and ":" in host else (host, "", "")
    name = name.removesuffix(".")  # the same DNS name, in its absolute form
    if not name.endswith("." + domain.domain):
        return None
    first = name[: -len(domain.domain) - 1]
    match = _HOST_LABEL.match(first)
    default = {"http": "80", "https": "443"}[domain.scheme]
    port_matches = (f":{port}" if port else "") == domain.port or (not domain.port and port == default)
    if match is None or not port_matches or not 1 <= int(match.group(2)) <= 65535:
        return HostRoute("", 0, valid=False)
    return HostRoute(match.group(1), int(match.group(2)), valid=True)
