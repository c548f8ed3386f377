"""A space's API tokens: how many it may hold, and one rate limit for all of them.

A space admin can make tokens; if each token had a window of its own, more tokens would mean
more calls. The space's per-minute limit counts the space's requests whichever token sent
them, and a space holds at most limits.api_tokens_per_space tokens in force.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from console.models import AuditEvent
from console.services import SYSTEM, Actor, ServiceError, do_update_space_limits
from sandboxes.api.tokens import do_create_api_token, do_revoke_api_token
from sandboxes.models import ApiToken
from sandboxes.sessions import limits
from tests.conftest import REDIS_URL
from tests.factories import make_config
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent
from tests.support.tuning import Tuned

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "this-process"])
def test_many_tokens_of_one_space_share_its_rate_limit(tuned: Tuned, world: World, settings: Any, shared: bool) -> None:
    settings.REDIS_URL = REDIS_URL if shared else ""
    tuned({"limits.api_tokens_per_space": 25})
    limits._local_windows.clear()
    make_config(world.space_a, is_default=True)
    do_update_space_limits(world.space_a, actor=SYSTEM, api_requests_per_minute=5)
    limits._limits_cache.clear()
    agents = [
        Agent(world.space_a.id, do_create_api_token(world.space_a, name=f"t{i}", actor=Actor(user=world.alice))[1])
        for i in range(25)
    ]
    # Five calls a token, 125 in all: only the space's five get through.
    statuses = [agent.get("nobody").status_code for agent in agents for _ in range(5)]
    assert statuses.count(404) == 5
    assert statuses.count(429) == 120
    refused = agents[-1].get("nobody")
    body = json.loads(refused.content)["error"]
    assert (body["limit"], body["maximum"]) == ("api_requests_per_minute", 5)
    assert "space" in body["message"]
    # Another space keeps its own window.
    make_config(world.space_b, is_default=True)
    _, other = do_create_api_token(world.space_b, name="b", actor=Actor(user=world.charlie))
    assert Agent(world.space_b.id, other).get("nobody").status_code == 404


def test_a_space_holds_at_most_the_set_number_of_tokens(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"limits.api_tokens_per_space": 3})
    actor = Actor(user=world.alice)
    made = [do_create_api_token(world.space_a, name=f"t{i}", actor=actor)[0] for i in range(3)]
    with pytest.raises(ServiceError) as refused:
        do_create_api_token(world.space_a, name="fourth", actor=actor)
    assert "3" in refused.value.message
    assert "revoke" in refused.value.message
    assert ApiToken.objects.filter(space=world.space_a).count() == 3
    assert not AuditEvent.objects.filter(action="api_token.create", details__name="fourth").exists()
    # Another space is not counted; a revoked token frees its place.
    do_create_api_token(world.space_b, name="b", actor=Actor(user=world.charlie))
    do_revoke_api_token(made[0], actor=actor)
    do_create_api_token(world.space_a, name="fourth", actor=actor)
    assert ApiToken.objects.filter(space=world.space_a, revoked__isnull=True).count() == 3


def test_the_token_page_says_the_cap_and_refuses_past_it_in_words(tuned: Tuned, world: World, settings: Any) -> None:
    tuned({"limits.api_tokens_per_space": 1})
    client = world.client_for("alice")
    url = reverse("sandboxes:token_list", kwargs={"space_id": world.space_a.id})
    first = client.post(url, {"name": "one"})
    assert first.status_code == 200
    assert "1 of at most 1 tokens in force" in first.content.decode()
    second = client.post(url, {"name": "two"})
    assert second.status_code == 200
    page = second.content.decode()
    assert "the most a space may hold (1)" in page
    assert 'id="new-token-secret"' not in page
    assert ApiToken.objects.filter(space=world.space_a).count() == 1
