"""The Egress page at size: keyset pages that show every refusal exactly once, ties in time
included, filters carried through the links, a query count that does not grow with depth,
and an index behind the order and each equality filter."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from sandboxes.models import EgressEvent, Session
from sandboxes.network.log import EGRESS_ORDER
from tests.factories import make_config
from tests.personas import World
from tests.support.keyset_pages import cursor_after, page_plans, walk

pytestmark = pytest.mark.django_db

ROW = re.compile(r"<code>(d\d{3})\.example</code>")


@pytest.fixture
def refused(world: World) -> World:
    """130 refusals of space A (five in each instant, two layers, two sessions and none) and
    20 of space B."""
    config = make_config(world.space_a)
    sessions = [
        Session.objects.create(space=world.space_a, config=config, key=f"k{n}", sandbox_id=f"sbx-{n}") for n in range(2)
    ]
    epoch = timezone.now() - timedelta(days=1)
    rows = [
        EgressEvent(
            time=epoch + timedelta(seconds=i // 5),
            space=world.space_a,
            session=None if i % 5 == 0 else sessions[i % 2],
            sandbox_id=f"sbx-{i % 2}",
            layer=["dns", "packet"][i % 3 == 0],
            destination=f"d{i:03d}.example",
            rule="not in the allow list",
        )
        for i in range(130)
    ]
    rows += [
        EgressEvent(
            time=epoch,
            space=world.space_b,
            sandbox_id="sbx-b",
            layer="dns",
            destination=f"d9{i:02d}.example",
            rule="not in the allow list",
        )
        for i in range(20)
    ]
    EgressEvent.objects.bulk_create(rows)
    return world


def url(world: World) -> str:
    return reverse("sandboxes:egress_list", args=[world.space_a.id])


def expected(**filters: Any) -> list[str]:
    rows = sorted(EgressEvent.objects.filter(**filters), key=lambda e: (e.time, e.id), reverse=True)
    return [e.destination.removesuffix(".example") for e in rows]


def test_next_and_previous_links_show_every_refusal_once_in_order(refused: World) -> None:
    for who in ("alice", "carol"):  # admin (with the approve column) and viewer
        client = refused.client_for(who)
        pages = walk(client, url(refused), ROW)
        assert [len(page) for page in pages] == [50, 50, 30]
        assert [key for page in pages for key in page] == expected(space=refused.space_a)
        assert walk(client, url(refused), ROW, backwards=True) == pages


def test_filters_carry_through_the_pages(refused: World) -> None:
    client = refused.client_for("alice")
    session = Session.objects.get(key="k1")
    pages = walk(client, url(refused), ROW, "layer=dns")
    assert len(pages) == 2
    assert [key for page in pages for key in page] == expected(space=refused.space_a, layer="dns")
    pages = walk(client, url(refused), ROW, "session=k1&destination=d1")
    assert [key for page in pages for key in page] == expected(session=session, destination__contains="d1")


def test_empty_states_keep_their_words(refused: World) -> None:
    client = refused.client_for("alice")
    body = client.get(url(refused), {"destination": "nowhere"}).content.decode()
    assert "No refused attempt recorded for these filters." in body
    body = client.get(url(refused), {"session": "no-such-session"}).content.decode()
    assert "No refused attempt recorded for these filters." in body
    EgressEvent.objects.all().delete()
    body = client.get(url(refused)).content.decode()
    assert "No refused attempt recorded. Refusals" in body


def test_queries_stay_bounded_whatever_the_filter_or_depth(refused: World, django_assert_max_num_queries: Any) -> None:
    """Login session, user, space with its policy, rows, capped count; a member's role; the
    configs behind an admin's advice; a session filter's session."""
    deep = cursor_after(EgressEvent.objects.filter(space=refused.space_a), EGRESS_ORDER, 80)
    for who, most in (("root", 6), ("alice", 7), ("carol", 6)):
        client = refused.client_for(who)
        client.get(url(refused))
        for query in ("", deep, f"layer=packet&{deep}", "session=k0&destination=d0"):
            with django_assert_max_num_queries(most + query.startswith("session")):
                assert client.get(f"{url(refused)}?{query}").status_code == 200, query


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("filters", "index"),
    [({}, "egress_space_order"), ({"layer": "packet"}, "egress_space_layer_order"), ({"session": "k0"}, "")],
)
def test_the_order_and_each_filter_read_an_index_without_sorting(
    refused: World, filters: dict[str, Any], index: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the indexes' plans are PostgreSQL's")
    if "session" in filters:
        filters, index = {"session": Session.objects.get(key="k0")}, "egress_session_order"
    for plan in page_plans(EgressEvent.objects.filter(space=refused.space_a, **filters), EGRESS_ORDER, 25):
        assert index in plan, plan
        assert "Sort" not in plan, plan
