"""The settings E2B declares (`sandboxes/backends/e2b/settings.py`): control-plane URL, sandbox
domain, data-plane URL, the API key as a secret, spaces' own keys, the protocol pin, and the
typed options the adapter reads (from typed options or the old string bag)."""

from __future__ import annotations

import pytest

from sandboxes.backends import describe
from sandboxes.backends.base import BackendConfig, ErrorKind, RemoteError
from sandboxes.backends.e2b.backend import E2BBackend
from sandboxes.backends.e2b.common import PROTOCOL_V1, PROTOCOL_V2
from sandboxes.backends.e2b.settings import SCHEMA, E2BOptions
from sandboxes.backends.settings import Given, Scope, SettingType

GOOD = {"endpoint": "https://api.e2b.example.test", "domain": "e2b.example.test", "api_key": "e2b_key"}


def test_e2b_declares_its_endpoint_domain_key_and_protocol() -> None:
    assert describe("e2b") is SCHEMA
    declared = {(s.scope, s.name): (s.type, s.secret) for s in SCHEMA.settings}
    assert declared == {
        (Scope.BACKEND, "endpoint"): (SettingType.ENDPOINT, False),
        (Scope.BACKEND, "domain"): (SettingType.TEXT, False),
        (Scope.BACKEND, "sandbox_url"): (SettingType.URL, False),
        (Scope.BACKEND, "api_key"): (SettingType.TEXT, True),
        (Scope.BACKEND, "allow_space_api_key"): (SettingType.BOOL, False),
        (Scope.CONFIG, "api_key"): (SettingType.TEXT, True),
        (Scope.CONFIG, "protocol_pin"): (SettingType.CHOICE, False),
    }
    # The pin offers detection and exactly the protocols the adapter speaks.
    offered = [value for value, _ in SCHEMA.setting("protocol_pin", Scope.CONFIG).choices]
    assert offered[0] == ""
    assert set(offered[1:]) == {PROTOCOL_V1, PROTOCOL_V2}


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"endpoint": ""}, "endpoint", "E2B backends need their control-plane URL."),
        ({"endpoint": "ftp://api.e2b.example.test"}, "endpoint", "starts with https://"),
        ({"domain": ""}, "domain", "E2B backends need their sandbox domain."),
        ({"domain": "not a domain"}, "domain", "is not a domain name"),
        ({"sandbox_url": "envd.example.test"}, "sandbox_url", "starts with https://"),
        ({"api_key": ""}, "api_key", "need an API key (or let spaces bring their own)"),
        ({"allow_space_api_key": True, "allow_private_endpoints": True}, "allow_space_api_key", "public endpoints"),
    ],
)
def test_bad_e2b_settings_are_named_in_words(changes: dict[str, object], field: str, message: str) -> None:
    problems = SCHEMA.problems(Given({**GOOD, **changes}))
    assert message in problems[field], problems


def test_a_domain_is_saved_in_one_spelling() -> None:
    assert SCHEMA.normalized({"domain": " E2B.Example.Test. "})["domain"] == "e2b.example.test"
    assert SCHEMA.problems(Given({**GOOD, "domain": "E2B.Example.Test."})) == {}


def test_a_stored_key_kept_with_stars_or_spaces_keys_need_no_platform_key() -> None:
    assert SCHEMA.problems(Given(GOOD)) == {}
    kept = Given({**GOOD, "api_key": "***"}, stored_secrets=frozenset({"api_key"}))
    assert SCHEMA.problems(kept) == {}
    assert "api_key" in SCHEMA.problems(Given({**GOOD, "api_key": "***"}))  # *** with nothing stored
    assert SCHEMA.problems(Given({**GOOD, "api_key": "", "allow_space_api_key": True})) == {}


def test_the_adapter_reads_its_typed_options_as_the_old_string_bag_gave_them() -> None:
    bag = {"sandbox_url": "http://127.0.0.1:9/", "sandbox_timeout": "900", "protocol": "e2b-v1",
           "protocol_pinned": "1", "retries": "0", "request_timeout": "2.5", "tls_key": "not E2B's"}  # fmt: skip
    typed = E2BOptions.parse(bag)
    assert typed == E2BOptions(sandbox_url="http://127.0.0.1:9/", sandbox_timeout=900, protocol="e2b-v1",
                               protocol_pinned=True, retries=0, request_timeout=2.5)  # fmt: skip
    for options in (bag, typed):
        config = BackendConfig(kind="e2b", endpoint="http://127.0.0.1:9", domain="e2b.example.test", options=options)
        backend = E2BBackend(config)
        assert backend.options == typed
        assert (backend.sandbox_url, backend.sandbox_ttl, backend.retries) == ("http://127.0.0.1:9", 900, 0)
        assert (backend.protocol, backend.protocol_pinned, backend.request_timeout) == ("e2b-v1", True, 2.5)
        backend.close()


@pytest.mark.parametrize(
    ("bag", "named"),
    [
        ({"retries": "-1"}, "retries"),
        ({"sandbox_timeout": "soon"}, "sandbox_timeout"),
        ({"protocol": "cube-0.5"}, "protocol"),
        ({"protocol_pinned": "perhaps"}, "protocol_pinned"),
    ],
)
def test_an_option_the_adapter_cannot_use_is_an_invalid_error(bag: dict[str, str], named: str) -> None:
    with pytest.raises(RemoteError) as caught:
        E2BBackend(BackendConfig(kind="e2b", endpoint="http://127.0.0.1:9", domain="e2b.example.test", options=bag))
    assert caught.value.kind == ErrorKind.INVALID
    assert named in caught.value.message
