"""Deactivating a user and the API tokens they made.

The deactivate page lists the tokens in force the user made; deactivating revokes them (one
audit event each) unless the platform admin ticks "keep them". Before, a deactivated admin's
tokens kept working and nothing said so.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from console.models import AuditEvent
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token, do_revoke_api_token
from sandboxes.models import ApiToken
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent

pytestmark = pytest.mark.django_db


def root_client(world: World) -> Client:
    client = Client()
    client.force_login(world.root)
    return client


@pytest.fixture
def alices_tokens(world: World) -> list[str]:
    make_config(world.space_a, is_default=True)
    actor = Actor(user=world.alice)
    made = [do_create_api_token(world.space_a, name=n, actor=actor)[1] for n in ("agent-prod", "agent-ci")]
    old, _ = do_create_api_token(world.space_a, name="retired", actor=actor)
    do_revoke_api_token(old, actor=actor)
    do_create_api_token(world.space_a, name="bobs", actor=Actor(user=world.bob))
    return made


def test_the_deactivate_page_lists_the_tokens_in_force_the_user_made(world: World, alices_tokens: list[str]) -> None:
    page = root_client(world).get(reverse("console:user_deactivate", args=[world.alice.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert 'id="held-credentials"' in text
    assert "agent-prod" in text
    assert "agent-ci" in text
    assert "Space A" in text
    assert "retired" not in text  # already revoked
    assert "bobs" not in text  # another user's
    assert 'name="keep_credentials"' in text
    assert world.alice.__class__.objects.get(pk=world.alice.pk).is_active  # a GET changes nothing


def test_deactivating_revokes_the_users_tokens_each_audited(world: World, alices_tokens: list[str]) -> None:
    agent = Agent(world.space_a.id, alices_tokens[0])
    assert agent.get("nobody").status_code == 404  # works while alice is active
    response = root_client(world).post(reverse("console:user_deactivate", args=[world.alice.pk]))
    assert response.status_code == 302
    assert agent.get("nobody").status_code == 401
    assert Agent(world.space_a.id, alices_tokens[1]).get("nobody").status_code == 401
    assert not ApiToken.objects.filter(created_by=world.alice, revoked__isnull=True).exists()
    assert ApiToken.objects.get(name="bobs").revoked is None
    revocations = [e for e in AuditEvent.objects.filter(action="api_token.revoke") if "reason" in e.details]
    assert all(e.details["reason"] == "alice was deactivated" for e in revocations)
    assert sorted(e.details["name"] for e in revocations) == ["agent-ci", "agent-prod"]
    assert all(e.actor == world.root for e in revocations)
    event = AuditEvent.objects.get(action="user.deactivate")
    assert (event.details["credentials_revoked"], event.details["credentials_kept"]) == (2, 0)
    detail = root_client(world).get(reverse("console:user_detail", args=[world.alice.pk]), follow=True)
    assert detail.status_code == 200


def test_the_platform_admin_may_keep_the_tokens(world: World, alices_tokens: list[str]) -> None:
    client = root_client(world)
    response = client.post(
        reverse("console:user_deactivate", args=[world.alice.pk]), {"keep_credentials": "on"}, follow=True
    )
    assert "2 API token(s) kept working" in response.content.decode()
    world.alice.refresh_from_db()
    assert not world.alice.is_active
    assert Agent(world.space_a.id, alices_tokens[0]).get("nobody").status_code == 404
    assert not [e for e in AuditEvent.objects.filter(action="api_token.revoke") if "reason" in e.details]
    event = AuditEvent.objects.get(action="user.deactivate")
    assert (event.details["credentials_revoked"], event.details["credentials_kept"]) == (0, 2)


def test_a_refused_deactivation_revokes_nothing(world: World) -> None:
    make_config(world.space_a, is_default=True)
    _, token = do_create_api_token(world.space_a, name="roots", actor=Actor(user=world.root))
    client = root_client(world)
    client.post(reverse("console:user_deactivate", args=[world.root.pk]))  # yourself: refused
    assert ApiToken.objects.get(name="roots").revoked is None
    assert Agent(world.space_a.id, token).get("nobody").status_code == 404


def test_only_platform_admins_see_the_deactivate_page(world: World) -> None:
    url = reverse("console:user_deactivate", args=[world.bob.pk])
    assert world.client_for("alice").get(url).status_code == 404
    assert world.client_for("alice").post(url).status_code == 404
    world.bob.refresh_from_db()
    assert world.bob.is_active
