"""The network policy form: bad input shown on its field with nothing saved, saving
normalises and audits, warnings shown, HTMX swaps, what the form says a domain entry means,
and the space page's description. (The validation itself is netpolicy's: tests/netpolicy.)"""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import AuditEvent, NetworkPolicy

from .conftest import World


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

    def test_the_form_says_what_a_plain_and_a_wildcard_domain_mean(self, world: World) -> None:
        body = world.client_for("alice").get(self.url(world)).content.decode()
        assert "A plain domain (example.com) is the name AND all its subdomains" in body
        assert "*.example.com is its subdomains only, never example.com itself" in body

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
