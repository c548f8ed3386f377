"""What a refusal offers, decided once (`sandboxes.network.advice.refusal_advice`) and shown the
same everywhere: explain (page and API) follows netpolicy's meaning of a plain domain and
carries the advice; a refusal of the Docker host or of another sandbox offers no approval and
says why, and an approval posted anyway is refused with that reason (never "Saved and
applied"); a deny-list hit offers to edit the deny list on the session page and on the Egress
page alike. Database and pages only: no name is resolved, no traffic is sent.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEvent, NetworkPolicy
from console.services import SYSTEM, Actor, ServiceError
from netpolicy import Offer
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.capabilities import EgressRefusal
from sandboxes.models import EgressEvent, Session, SessionGrant
from sandboxes.network.advice import event_advice, refusal_advice
from sandboxes.network.approvals import do_allow_for_session, do_allow_for_space
from sandboxes.network.log import record_refusals
from tests.factories import make_config, set_policy
from tests.personas import World

NEVER = "the Docker host and other sandboxes are never reachable"


def refused(world: World, destination: str, rule: str, *, layer: str = "packet") -> EgressEvent:
    """A refusal of `destination` recorded for a session of space A, with the words it was
    refused with (as the backend logs them)."""
    config = make_config(world.space_a)
    session = Session.objects.filter(space=world.space_a, key="refused").first() or Session.objects.create(
        space=world.space_a, config=config, key="refused", sandbox_id="sbx-refused"
    )
    record_refusals(
        config.backend,
        [
            EgressRefusal(
                at=timezone.now() - timedelta(seconds=1),
                sandbox_id=session.sandbox_id,
                layer=layer,
                destination=destination,
                rule=rule,
            )
        ],
    )
    return EgressEvent.objects.filter(destination=destination).latest("time")


def session_url(event: EgressEvent) -> str:
    assert event.session is not None
    return event.session.get_absolute_url()


# --- Explain follows a plain domain's meaning, on the page and in the API ---------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("lists", "allowed", "rule"),
    [
        ({"allow_out": ["example.com"]}, True, "allow entry example.com"),
        ({"deny_out": ["example.com"]}, False, "deny entry example.com (deny entries win)"),
    ],
)
def test_explain_covers_a_plain_domains_subdomains_on_the_page_and_in_the_api(
    world: World, lists: dict[str, list[str]], allowed: bool, rule: str
) -> None:
    set_policy(world.space_a, **lists)
    page = world.client_for("carol").get(
        reverse("sandboxes:network_explain", args=[world.space_a.id]), {"destination": "api.example.com"}
    )
    assert page.status_code == 200
    body = page.content.decode()
    assert f"would be {'allowed' if allowed else 'refused'}" in body
    assert rule in body
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    answer = Client().get(
        f"/api/v1/spaces/{world.space_a.id}/network/explain",
        {"destination": "api.example.com"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 200, answer.content
    data = answer.json()
    assert (data["allowed"], data["rule"], data["layer"]) == (allowed, rule, "dns")
    # The answer carries what a refusal would offer: here, edit the deny list (or nothing).
    assert data["advice"]["offer"] == ("none" if allowed else "edit_deny")
    assert data["advice"]["can_approve"] is False


@pytest.mark.django_db
def test_explain_says_what_a_refusal_of_a_private_address_would_offer(world: World) -> None:
    set_policy(world.space_a)
    _, token = do_create_api_token(world.space_a, name="agent", actor=Actor(user=world.alice))
    data = (
        Client()
        .get(
            f"/api/v1/spaces/{world.space_a.id}/network/explain",
            {"destination": "10.20.30.40:5432"},
            headers={"Authorization": f"Bearer {token}"},
        )
        .json()
    )
    assert data["allowed"] is False
    assert data["advice"] == {
        "offer": "private",
        "can_approve": True,
        "entry": "10.20.30.40/32",
        "text": "Add 10.20.30.40/32 to the private addresses also allowed (the space keeps allowing everything else).",
    }


# --- The Docker host and other sandboxes: no approval, and why ---------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("destination", "rule"),
    [
        ("172.17.0.1:80", "always denied: the Docker host"),
        ("172.18.0.1:443", "always denied: the Docker host"),
        ("172.17.0.1:8080", "always-denied destination (the host itself or a sandbox network)"),  # older words
        ("172.19.0.2:80", "always denied: other sandbox"),
        ("172.19.0.2:5432", "other sandbox"),  # older words
    ],
)
def test_a_refusal_of_the_host_or_another_sandbox_offers_no_approval_and_says_why(
    world: World, destination: str, rule: str
) -> None:
    set_policy(world.space_a)
    event = refused(world, destination, rule)
    advice = event_advice(event)
    assert (advice.offer, advice.can_approve) == (Offer.NONE, False)
    assert NEVER in advice.text
    admin = world.client_for("alice")
    egress = admin.get(reverse("sandboxes:egress_list", args=[world.space_a.id])).content.decode()
    assert NEVER in egress
    assert reverse("sandboxes:egress_allow_space", args=[world.space_a.id, event.id]) not in egress
    session_page = admin.get(session_url(event)).content.decode()
    assert NEVER in session_page
    assert reverse("sandboxes:egress_allow_space", args=[world.space_a.id, event.id]) not in session_page
    confirm = admin.get(reverse("sandboxes:egress_allow_space", args=[world.space_a.id, event.id]))
    assert NEVER in confirm.content.decode()
    assert "<form" not in confirm.content.decode().split('class="card"')[1]


@pytest.mark.django_db
@pytest.mark.parametrize("scope", ["space", "session"])
@pytest.mark.parametrize(
    ("destination", "rule"),
    [("172.17.0.1:80", "always denied: the Docker host"), ("172.19.0.2:80", "always denied: other sandbox")],
)
def test_approving_the_host_or_another_sandbox_is_refused_with_the_reason_and_saves_nothing(
    world: World, scope: str, destination: str, rule: str
) -> None:
    set_policy(world.space_a)
    event = refused(world, destination, rule)
    before = NetworkPolicy.objects.get(space=world.space_a)
    audits = AuditEvent.objects.count()
    url = reverse(f"sandboxes:egress_allow_{scope}", args=[world.space_a.id, event.id])
    response = world.client_for("alice").post(url)
    assert response.status_code == 302
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert any(NEVER in m for m in said), said
    assert not any("Saved and applied" in m or "allowed for" in m for m in said), said
    after = NetworkPolicy.objects.get(space=world.space_a)
    assert (after.allow_out, after.allow_private) == (before.allow_out, before.allow_private) == ([], [])
    assert not SessionGrant.objects.exists()
    assert AuditEvent.objects.count() == audits
    with pytest.raises(ServiceError, match=NEVER):
        (do_allow_for_space if scope == "space" else do_allow_for_session)(event, actor=SYSTEM)


@pytest.mark.django_db
def test_an_allow_only_space_still_offers_nothing_for_the_host(world: World) -> None:
    # An allow list would take a /32 for the host's address, and enforcement would still refuse it.
    set_policy(world.space_a, allow_out=["pypi.org"])
    event = refused(world, "172.17.0.1:80", "always denied: the Docker host")
    assert event_advice(event).offer == Offer.NONE
    with pytest.raises(ServiceError, match=NEVER):
        do_allow_for_space(event, actor=SYSTEM)
    assert NetworkPolicy.objects.get(space=world.space_a).allow_out == ["pypi.org"]


# --- A deny-list hit offers the same on the session page and on the Egress page ----------------


@pytest.mark.django_db
def test_a_deny_list_hit_offers_to_edit_the_deny_list_on_both_pages(world: World) -> None:
    set_policy(world.space_a, deny_out=["example.com"])
    event = refused(world, "api.example.com", "deny entry example.com", layer="dns")
    assert event_advice(event).offer == Offer.EDIT_DENY
    admin = world.client_for("alice")
    allow_space = reverse("sandboxes:egress_allow_space", args=[world.space_a.id, event.id])
    allow_session = reverse("sandboxes:egress_allow_session", args=[world.space_a.id, event.id])
    edit = reverse("console:network_policy_edit", args=[world.space_a.id])
    for page in (
        admin.get(session_url(event)).content.decode(),
        admin.get(reverse("sandboxes:egress_list", args=[world.space_a.id])).content.decode(),
    ):
        assert "Edit the deny list" in page
        assert edit in page
        assert allow_space not in page
        assert allow_session not in page
    # Both pages render the one advice: the same words on each.
    text = event_advice(event).text
    assert text in admin.get(session_url(event)).content.decode().replace("&#x27;", "'")


@pytest.mark.django_db
def test_an_approvable_refusal_offers_both_scopes_on_both_pages(world: World) -> None:
    set_policy(world.space_a, allow_out=["pypi.org"])
    event = refused(world, "files.example.test", "not in the allow list", layer="dns")
    admin = world.client_for("alice")
    allow_space = reverse("sandboxes:egress_allow_space", args=[world.space_a.id, event.id])
    allow_session = reverse("sandboxes:egress_allow_session", args=[world.space_a.id, event.id])
    for page in (
        admin.get(session_url(event)).content.decode(),
        admin.get(reverse("sandboxes:egress_list", args=[world.space_a.id])).content.decode(),
    ):
        assert allow_space in page
        assert allow_session in page
    response = admin.post(allow_space)
    said = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("files.example.test allowed for the space. Saved and applied" in m for m in said), said
    assert NetworkPolicy.objects.get(space=world.space_a).allow_out == ["pypi.org", "files.example.test"]
    # Now allowed: nothing more to offer, on either page.
    assert refusal_advice(world.space_a, event.destination, rule=event.rule).offer == Offer.NONE
