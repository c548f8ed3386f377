"""What an E2B backend takes from the admins (`SCHEMA`) and the typed options its adapter
reads (`E2BOptions`); no Django, no HTTP client (the console reads it to build its forms).
Cube's schema (`sandboxes/backends/cube/settings.py`) is built from these settings."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..settings import Given, Options, Scope, Setting, SettingsSchema, SettingType

# The wire protocols the adapter speaks (`common.PROTOCOL_V2`, `common.PROTOCOL_V1`), by label.
PROTOCOLS = {
    "e2b-v2": "E2B: SDK /v2 create (E2B cloud)",
    "e2b-v1": "E2B: published-spec operations only (self-hosted)",
}
DETECT = ("", "Detect from the server")
DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$|^localhost$")


@dataclass(frozen=True, kw_only=True)
class E2BOptions(Options):
    """What the E2B adapter reads besides endpoint, domain and key (docs/backends.md). None:
    the adapter's default (`common`)."""

    sandbox_url: str = ""  # one data-plane (envd) URL for every sandbox, routed by header
    request_timeout: float | None = None  # seconds per control-plane call
    retries: int | None = None  # retries of an idempotent call
    sandbox_timeout: int | None = None  # the TTL create and connect send (the config's idle timeout)
    protocol: str = ""  # recorded or pinned wire protocol ("" = learn it from the server)
    protocol_pinned: bool = False  # `protocol` is the admin's pin, not a detection
    inbound_url: str = ""  # unused by E2B (its own inbound URLs); offered to every kind


def _endpoint_problem(endpoint: str) -> str | None:
    if endpoint.startswith(("https://", "http://")):
        return None
    return "The control-plane URL starts with https:// (or http:// on a private network)."


def _domain_spelling(domain: str) -> str:
    return domain.strip().lower().rstrip(".")


def _domain_problem(domain: str) -> str | None:
    if DOMAIN.match(_domain_spelling(domain)):
        return None
    return f"{domain!r} is not a domain name (e.g. e2b.app)."


def _url_problem(url: str) -> str | None:
    if url.startswith(("https://", "http://")):
        return None
    return "The data-plane URL starts with https:// (or http://)."


def check(given: Given, schema: SettingsSchema) -> dict[str, str]:
    """An API key, unless spaces bring their own; and spaces' own keys to public endpoints only."""
    problems: dict[str, str] = {}
    allow_own = bool(given.get("allow_space_api_key"))
    if not given.has_secret("api_key") and not allow_own:
        problems["api_key"] = f"{schema.label} backends need an API key (or let spaces bring their own)."
    if allow_own and given.get("allow_private_endpoints"):
        problems["allow_space_api_key"] = "Spaces' own keys go to public endpoints only: turn private endpoints off."
    return problems


def protocol_pin(protocols: dict[str, str]) -> Setting:
    return Setting(
        "protocol_pin",
        "Protocol",
        SettingType.CHOICE,
        scope=Scope.CONFIG,
        choices=(DETECT, *protocols.items()),
        help="The wire protocol to speak. Empty: detect it from the server's answers.",
    )


ENDPOINT = Setting(
    "endpoint",
    "Control-plane URL",
    SettingType.ENDPOINT,
    required=True,
    help="The control-plane URL starts with https:// (or http:// on a private network).",
    validate=_endpoint_problem,
)
DOMAIN_SETTING = Setting(
    "domain",
    "Sandbox domain",
    required=True,
    help="The sandboxes' (data-plane) domain, e.g. e2b.app.",
    validate=_domain_problem,
    normalize=_domain_spelling,
)
SANDBOX_URL = Setting(
    "sandbox_url",
    "Data-plane URL",
    SettingType.URL,
    help="Optional: one data-plane (envd) URL for every sandbox, routed by header "
    "(a Cube proxy, or a test server). Empty: https://49983-<sandbox>.<domain>.",
    validate=_url_problem,
)
# Providers' keys are tens of characters; a longer paste is a mistake (or an attempt to fill the
# database), refused in words rather than stored.
API_KEY_MAX_LENGTH = 512
API_KEY = Setting(
    "api_key",
    "API key",
    secret=True,
    max_length=API_KEY_MAX_LENGTH,
    help="Stored encrypted; leave *** to keep the stored key.",
)
ALLOW_SPACE_API_KEY = Setting(
    "allow_space_api_key",
    "Spaces may bring their own API key",
    SettingType.BOOL,
    help="On a public endpoint: a space's config may use its own API key instead of this "
    "backend's (always through the SSRF guard, never with private endpoints).",
)
OWN_API_KEY = Setting(
    "api_key",
    "Own API key",
    scope=Scope.CONFIG,
    secret=True,
    max_length=API_KEY_MAX_LENGTH,
    help="The platform lets spaces bring their own key to this backend (public endpoints only). "
    "Stored encrypted; leave *** to keep the stored key, empty to use the platform's.",
)

SCHEMA = SettingsSchema(
    label="E2B",
    options=E2BOptions,
    check=check,
    settings=(
        ENDPOINT,
        DOMAIN_SETTING,
        SANDBOX_URL,
        API_KEY,
        ALLOW_SPACE_API_KEY,
        OWN_API_KEY,
        protocol_pin(PROTOCOLS),
    ),
)
