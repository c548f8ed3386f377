"""Network policy validation: every field's bad input, duplicates, shadowing, outbound off,
and the semantics of issue 13 (a non-empty allow list = only those; deny entries win)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from console.models import AuditEvent, NetworkPolicy
from console.network import parse_destination, parse_l7_rule, validate_policy

from .conftest import World


@pytest.mark.parametrize(
    ("entry", "normalised"),
    [
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("192.168.1.7", "192.168.1.7/32"),
        ("2001:db8::/32", "2001:db8::/32"),
        ("Example.COM", "example.com"),
        ("*.example.com", "*.example.com"),
        ("api.example.co.uk.", "api.example.co.uk"),
    ],
)
def test_valid_destinations(entry: str, normalised: str) -> None:
    assert parse_destination(entry).text == normalised


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("10.0.0.1/8", "host bits are set; did you mean 10.0.0.0/8"),
        ("10.0.0.0/33", "not a valid IP address or CIDR"),
        ("300.1.1.1", "not a valid IP address or CIDR"),
        ("exa mple.com", "cannot contain spaces"),
        ("example", "not a domain name"),
        ("ex_ample.com", "not a valid domain label"),
        ("-bad.example.com", "not a valid domain label"),
        ("api.*.example.com", "only allowed as a leading"),
        ("*example.com", "only allowed as a leading"),
        ("1.2.3", "not a valid IP address"),
    ],
)
def test_malformed_destinations(entry: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_destination(entry)


def test_outbound_off_refuses_lists_and_rules_with_an_explanation() -> None:
    result = validate_policy(
        allow_internet_access=False,
        allow_out=["example.com"],
        deny_out=["10.0.0.0/8"],
        l7_rules=["allow a.com"],
    )
    assert set(result.errors) == {"allow_out", "deny_out", "l7_rules"}
    off = validate_policy(
        allow_internet_access=False, allow_out=[], deny_out=[], l7_rules=[], allow_private=["10.0.0.0/8"]
    )
    assert "Outbound access is off" in off.errors["allow_private"][0]
    assert all("Outbound access is off" in errors[0] for errors in result.errors.values())


def test_duplicates_are_errors_even_when_spelled_differently() -> None:
    result = validate_policy(
        allow_internet_access=True,
        allow_out=[],
        deny_out=["10.0.0.0/8", "EXAMPLE.com", "example.com."],
        l7_rules=[],
    )
    assert result.errors["deny_out"] == ["entry 3: example.com duplicates entry 2"]


def test_an_allow_entry_under_a_deny_entry_has_no_effect_and_says_so() -> None:
    # Deny entries win: an allow entry a deny entry covers is dead; a deny entry inside an
    # allow entry carves a hole in it (its purpose), no warning.
    result = validate_policy(
        allow_internet_access=True,
        allow_out=["10.1.0.0/16", "api.example.com", "10.0.0.0/8"],
        deny_out=["10.0.0.0/8", "*.example.com"],
        l7_rules=[],
    )
    assert not result.errors
    assert "Allow entry 10.1.0.0/16 has no effect: deny entry 10.0.0.0/8 covers it and deny entries win." in (
        result.warnings
    )
    assert any(w.startswith("Allow entry api.example.com has no effect") for w in result.warnings)
    carve = validate_policy(
        allow_internet_access=True, allow_out=["*.example.com"], deny_out=["admin.example.com"], l7_rules=[]
    )
    assert carve.warnings == []


def test_the_old_deny_all_idiom_warns_that_it_now_refuses_everything() -> None:
    result = validate_policy(allow_internet_access=True, allow_out=["example.com"], deny_out=["0.0.0.0/0"], l7_rules=[])
    assert any("Deny entry 0.0.0.0/0 refuses every IPv4 destination" in w for w in result.warnings)


def test_an_allow_list_alone_needs_no_deny_list() -> None:
    result = validate_policy(allow_internet_access=True, allow_out=["example.com"], deny_out=[], l7_rules=[])
    assert result.warnings == []


def test_a_deny_entry_outside_every_allow_entry_has_no_effect() -> None:
    result = validate_policy(
        allow_internet_access=True, allow_out=["203.0.113.0/24"], deny_out=["198.51.100.0/24"], l7_rules=[]
    )
    assert any("Deny entry 198.51.100.0/24 has no effect" in w for w in result.warnings)
    # A domain deny entry beside CIDR allow entries: the name may resolve inside them.
    mixed = validate_policy(
        allow_internet_access=True, allow_out=["203.0.113.0/24"], deny_out=["evil.example"], l7_rules=[]
    )
    assert mixed.warnings == []


def test_allow_entries_opening_private_or_link_local_addresses_warn() -> None:
    result = validate_policy(allow_internet_access=True, allow_out=["0.0.0.0/0"], deny_out=[], l7_rules=[])
    assert any("also opens private addresses" in w for w in result.warnings)
    assert any("link-local and metadata addresses inside it stay denied" in w for w in result.warnings)
    inside = validate_policy(allow_internet_access=True, allow_out=["10.1.0.0/16"], deny_out=[], l7_rules=[])
    assert inside.warnings == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("8.8.8.0/24", "is not inside a private range"),
        ("169.254.169.254", "link-local and metadata addresses are always denied"),
        ("fe80::/64", "link-local and metadata addresses are always denied"),
        ("internal.example", "is not a CIDR"),
        ("10.0.0.1/8", "host bits are set"),
    ],
)
def test_private_exceptions_are_private_cidrs_only(entry: str, message: str) -> None:
    result = validate_policy(allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=[], allow_private=[entry])
    assert any(message in e for e in result.errors["allow_private"]), result.errors


def test_private_exceptions_normalise() -> None:
    result = validate_policy(
        allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=[], allow_private=["10.9.8.7", "fd00::/8"]
    )
    assert not result.errors
    assert result.allow_private == ["10.9.8.7/32", "fd00::/8"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("permit a.com", "must be 'allow' or 'deny'"),
        ("allow not_a_domain", "not a domain name"),
        ("allow a.com FETCH", "not an HTTP method"),
        ("allow a.com GET,GET", "listed twice"),
        ("allow a.com GET repos/", "must start with '/'"),
        ("allow", "expected 'allow|deny DOMAIN"),
        ("allow a.com GET / extra", "expected 'allow|deny DOMAIN"),
        ({"domain": "a.com", "methods": "GET", "action": "allow"}, "must be a list"),
        (42, "must be an object"),
    ],
)
def test_malformed_l7_rules(rule: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_l7_rule(rule)


def test_l7_rules_keep_order_and_refuse_repeats() -> None:
    result = validate_policy(
        allow_internet_access=True,
        allow_out=[],
        deny_out=[],
        l7_rules=[
            "deny api.github.com DELETE /",
            "allow api.github.com GET,POST /repos/",
            "allow *.pypi.org",
            "deny api.github.com DELETE",
        ],
    )
    assert result.errors == {"l7_rules": ["rule 4: repeats the match of rule 1"]}
    assert [r["domain"] for r in result.l7_rules] == [
        "api.github.com",
        "api.github.com",
        "*.pypi.org",
    ]
    assert result.l7_rules[1] == {
        "domain": "api.github.com",
        "methods": ["GET", "POST"],
        "path_prefix": "/repos/",
        "action": "allow",
    }


@pytest.mark.django_db
class TestPolicyForm:
    def url(self, world: World) -> str:
        return reverse("console:network_policy_edit", args=[world.space_a.id])

    @pytest.mark.parametrize(
        ("data", "field", "message"),
        [
            (
                {"allow_internet_access": "on", "deny_out": "10.0.0.1/8"},
                "deny_out",
                "host bits are set",
            ),
            (
                {"allow_internet_access": "on", "allow_out": "bad domain.com"},
                "allow_out",
                "cannot contain spaces",
            ),
            (
                {"allow_internet_access": "on", "l7_rules": "allow a.com YANK"},
                "l7_rules",
                "not an HTTP method",
            ),
            ({"deny_out": "10.0.0.0/8"}, "deny_out", "Outbound access is off"),
            ({"allow_out": "example.com"}, "allow_out", "Outbound access is off"),
            ({"l7_rules": "allow a.com"}, "l7_rules", "Outbound access is off"),
            (
                {"allow_internet_access": "on", "deny_out": "a.com\na.com"},
                "deny_out",
                "duplicates entry 1",
            ),
        ],
    )
    def test_bad_input_is_shown_on_the_field_and_nothing_is_saved(
        self, world: World, data: dict[str, str], field: str, message: str
    ) -> None:
        before = AuditEvent.objects.count()
        response = world.client_for("alice").post(self.url(world), data)
        assert response.status_code == 400
        form = response.context["form"]
        assert any(message in error for error in form.errors[field]), form.errors
        policy = NetworkPolicy.objects.get(space=world.space_a)
        assert policy.allow_internet_access is False
        assert policy.deny_out == []
        assert policy.allow_out == []
        assert AuditEvent.objects.count() == before

    def test_save_normalises_audits_and_describes(self, world: World) -> None:
        response = world.client_for("alice").post(
            self.url(world),
            {
                "allow_internet_access": "on",
                "deny_out": "evil.npmjs.org\n# comment line\n\n",
                "allow_out": "PyPI.org\n*.npmjs.org",
                "allow_private": "10.20.0.0/16",
                "l7_rules": "allow pypi.org GET /simple/",
                "allow_public_traffic": "",
            },
            follow=True,
        )
        assert response.status_code == 200
        policy = NetworkPolicy.objects.get(space=world.space_a)
        assert policy.allow_out == ["pypi.org", "*.npmjs.org"]
        assert policy.deny_out == ["evil.npmjs.org"]
        assert policy.allow_private == ["10.20.0.0/16"]
        assert policy.l7_rules == [
            {"domain": "pypi.org", "methods": ["GET"], "path_prefix": "/simple/", "action": "allow"}
        ]
        event = AuditEvent.objects.get(action="network_policy.update")
        assert event.details["before"]["allow_internet_access"] is False
        assert event.details["after"]["deny_out"] == ["evil.npmjs.org"]
        body = response.content.decode()
        assert "Outbound: on, only to pypi.org, *.npmjs.org (everything else is refused)." in body
        assert "Always refused, even where an allow entry matches: evil.npmjs.org." in body
        assert "Private addresses also allowed: 10.20.0.0/16." in body
        assert "HTTP rule 1: GET to pypi.org/simple/* is allowed." in body
        assert "Inbound: off" in body

    def test_warnings_are_shown_after_saving(self, world: World) -> None:
        response = world.client_for("alice").post(
            self.url(world),
            {"allow_internet_access": "on", "allow_out": "10.2.0.0/16", "deny_out": "10.0.0.0/8"},
            follow=True,
        )
        assert "Allow entry 10.2.0.0/16 has no effect" in response.content.decode()

    def test_htmx_post_with_errors_swaps_the_form_only(self, world: World) -> None:
        response = world.client_for("alice").post(
            self.url(world),
            {"allow_internet_access": "on", "deny_out": "nope"},
            HTTP_HX_REQUEST="true",
        )
        body = response.content.decode()
        assert response.status_code == 400
        assert body.lstrip().startswith('<form id="network-policy-form"')
        assert "<html" not in body

    def test_htmx_post_success_redirects_the_client(self, world: World) -> None:
        response = world.client_for("alice").post(
            self.url(world), {"allow_internet_access": "on"}, HTTP_HX_REQUEST="true"
        )
        assert response.status_code == 200
        assert response["HX-Redirect"].endswith(f"/spaces/{world.space_a.id}/#network")

    def test_form_round_trips_the_saved_policy(self, world: World) -> None:
        client = world.client_for("alice")
        client.post(self.url(world), {"allow_internet_access": "on", "l7_rules": "deny a.com * /admin"})
        form = client.get(self.url(world)).context["form"]
        assert form.initial["l7_rules"] == "deny a.com * /admin"


EVERYTHING = (
    "Outbound: on, to any destination except the always-denied ones (this host, link-local and metadata"
    " addresses, other sandboxes, private ranges)."
)


@pytest.mark.parametrize(
    ("allow_out", "deny_out", "expected"),
    [
        ([], [], [EVERYTHING]),
        (["a.com"], [], ["Outbound: on, only to a.com (everything else is refused)."]),
        ([], ["10.0.0.0/8"], [EVERYTHING, "Always refused, even where an allow entry matches: 10.0.0.0/8."]),
        (
            ["10.0.0.0/8"],
            ["10.1.0.0/16"],
            [
                "Outbound: on, only to 10.0.0.0/8 (everything else is refused).",
                "Always refused, even where an allow entry matches: 10.1.0.0/16.",
            ],
        ),
    ],
)
def test_describe_says_what_the_lists_do(allow_out: list[str], deny_out: list[str], expected: list[str]) -> None:
    from console.models import NetworkPolicy

    policy = NetworkPolicy(allow_internet_access=True, allow_out=allow_out, deny_out=deny_out, l7_rules=[])
    assert policy.describe()[:-1] == expected


@pytest.mark.django_db
def test_the_migration_keeps_old_deny_all_plus_allow_policies_meaning_only_these(world: World) -> None:
    import importlib

    from django.apps import apps

    migration = importlib.import_module("console.migrations.0003_network_policy_allow_private")
    NetworkPolicy.objects.filter(space=world.space_a).update(
        allow_internet_access=True, allow_out=["pypi.org"], deny_out=["0.0.0.0/0", "::/0", "198.51.100.0/24"]
    )
    NetworkPolicy.objects.filter(space=world.space_b).update(allow_internet_access=True, deny_out=["0.0.0.0/0"])
    migration.keep_allow_only_policies(apps, None)
    assert NetworkPolicy.objects.get(space=world.space_a).deny_out == ["198.51.100.0/24"]
    # Without an allow list, "deny everything" meant and still means exactly that.
    assert NetworkPolicy.objects.get(space=world.space_b).deny_out == ["0.0.0.0/0"]


def test_describe_says_what_https_can_check_of_each_rule() -> None:
    from console.models import NetworkPolicy

    rules = [
        {"domain": "pypi.org", "methods": ["GET"], "path_prefix": "/simple/", "action": "allow"},
        {"domain": "a.com", "methods": [], "path_prefix": "/admin", "action": "deny"},
        {"domain": "b.com", "methods": [], "path_prefix": "/", "action": "deny"},
    ]
    policy = NetworkPolicy(allow_internet_access=True, allow_out=[], deny_out=[], l7_rules=rules)
    https = "over HTTPS, where only the host is checked (SNI, no decryption):"
    assert policy.describe()[1:-1] == [
        "HTTP rule 1: GET to pypi.org/simple/* is allowed.",
        f"HTTP rule 1 {https} every request to pypi.org is allowed.",
        "HTTP rule 2: any method to a.com/admin* is denied.",
        f"HTTP rule 2 {https} it cannot be checked and does not apply.",
        "HTTP rule 3: any method to b.com/* is denied.",
    ]
