"""The sessions list at size: keyset pages that show every session exactly once, ties in the
sort key included; a query count that does not grow with rows, filters or depth; and an
index behind each order and filter."""

from __future__ import annotations

import base64
import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

import console.keyset
from console.models import Space
from sandboxes.models import Session
from sandboxes.sessions.listing import SESSION_ORDER
from tests.factories import make_config, make_space
from tests.personas import World
from tests.support import keyset_pages
from tests.support.keyset_pages import NEXT

pytestmark = pytest.mark.django_db

PAGE = 25
LIST = reverse("sandboxes:session_list")
KEY = re.compile(r"<code>(s\d{3})</code>")


@pytest.fixture
def crowded(world: World) -> World:
    """130 sessions over two spaces: creation instants shared by five sessions each, last
    activity shared by ten (and never for every seventh), so the sort key ties everywhere but
    in the id."""
    configs = {world.space_a.id: make_config(world.space_a), world.space_b.id: make_config(world.space_b)}
    epoch = timezone.now() - timedelta(days=1)
    for i in range(130):
        space = world.space_a if i % 3 else world.space_b
        session = Session.objects.create(
            space=space,
            config=configs[space.id],
            key=f"s{i:03d}",
            state=["running", "paused", "stopped"][(i // 2) % 3],
            stale_at=epoch if i % 11 == 0 else None,
            last_activity=None if i % 7 == 0 else epoch + timedelta(minutes=i // 10),
        )
        Session.objects.filter(pk=session.pk).update(created=epoch + timedelta(seconds=i // 5))
    return world


def expected_keys(**filters: Any) -> list[str]:
    """The keys in the list's order, sorted here in Python from the rows."""
    rows = list(Session.objects.filter(**filters))
    never = timezone.now() - timedelta(days=365 * 60)
    rows.sort(key=lambda s: (s.last_activity or never, s.created, s.id), reverse=True)
    return [s.key for s in rows]


def walk(client: Any, query: str = "", *, backwards_from_end: bool = False) -> list[list[str]]:
    """Every page's keys, following "Next" from the first page (or, then, "Previous" back)."""
    return keyset_pages.walk(client, LIST, KEY, query, backwards=backwards_from_end)


def test_next_links_show_every_session_once_in_order_despite_ties(crowded: World) -> None:
    pages = walk(crowded.client_for("root"))
    assert [len(page) for page in pages] == [PAGE] * 5 + [5]
    assert [key for page in pages for key in page] == expected_keys()


def test_previous_links_walk_back_over_the_same_pages(crowded: World) -> None:
    client = crowded.client_for("root")
    assert walk(client, backwards_from_end=True) == walk(client)


def test_filters_carry_through_the_pages(crowded: World) -> None:
    client = crowded.client_for("alice")  # space A only
    pages = walk(client, f"space={crowded.space_a.id}&state=paused")
    assert [key for page in pages for key in page] == expected_keys(space=crowded.space_a, state="paused")
    pages = walk(client)
    assert [key for page in pages for key in page] == expected_keys(space=crowded.space_a)


def test_a_session_added_meanwhile_does_not_shift_the_next_page(crowded: World) -> None:
    client = crowded.client_for("root")
    first = client.get(LIST).content.decode()
    link = NEXT.search(first)
    assert link is not None
    Session.objects.create(
        space=crowded.space_a, config=crowded.space_a.sandbox_configs.get(), key="s999", last_activity=timezone.now()
    )
    second = KEY.findall(client.get(f"{LIST}?{html.unescape(link.group(1))}").content.decode())
    assert second == expected_keys()[PAGE + 1 : 2 * PAGE + 1]  # s999 went first, before the cursor


@pytest.mark.parametrize(
    "cursor", ["junk", "W10", "WyJ4IiwgInkiLCAieiJd", "bnVsbA", "%00", base64.urlsafe_b64encode(b"[" * 5000).decode()]
)
def test_a_cursor_the_page_did_not_make_shows_the_first_page(crowded: World, cursor: str) -> None:
    client = crowded.client_for("root")
    for name in ("after", "before"):
        response = client.get(LIST, {name: cursor})
        assert response.status_code == 200
        assert KEY.findall(response.content.decode()) == expected_keys()[:PAGE]


def test_a_cursor_whose_rows_are_gone_shows_the_first_page(crowded: World) -> None:
    client = crowded.client_for("root")
    body = client.get(LIST).content.decode()
    for _ in range(4):
        link = NEXT.search(body)
        assert link is not None
        body = client.get(f"{LIST}?{html.unescape(link.group(1))}").content.decode()
    last = NEXT.search(body)
    assert last is not None  # to the sixth page, of five sessions
    Session.objects.filter(key__in=expected_keys()[5 * PAGE :]).delete()
    body = client.get(f"{LIST}?{html.unescape(last.group(1))}").content.decode()
    assert KEY.findall(body) == expected_keys()[:PAGE]


def test_the_count_is_exact_up_to_its_cap(crowded: World, monkeypatch: pytest.MonkeyPatch) -> None:
    body = crowded.client_for("root").get(LIST).content.decode()
    assert "130 in all" in body
    monkeypatch.setattr(console.keyset, "COUNT_CAP", 100)
    body = crowded.client_for("root").get(LIST).content.decode()
    assert "more than 100 in all" in body


def deep_query(**filters: Any) -> str:
    """The "after" cursor of the row 60 down, as the page makes it."""
    keyed = SESSION_ORDER.annotate(Session.objects.filter(**filters)).order_by(*SESSION_ORDER.order())
    return f"after={SESSION_ORDER.encode(keyed[60])}"


@pytest.mark.parametrize("who", ["root", "alice", "carol"])
def test_list_queries_stay_bounded_whatever_the_filter_or_depth(
    crowded: World, django_assert_max_num_queries: Any, who: str
) -> None:
    more = make_space("Space C")
    config = make_config(more)
    Session.objects.bulk_create(Session(space=more, config=config, key=f"c{i:03d}") for i in range(100))
    client = crowded.client_for(who)
    space = crowded.space_a.id
    queries = [
        "",
        "state=running",
        f"space={space}&state=paused",
        deep_query(space__in=Space.objects.all()) if who == "root" else deep_query(space=crowded.space_a),
        "q=s04",
        f"space={space}&state=stale",
        f"space={space}&q=s1&{deep_query(space=crowded.space_a)}",
    ]
    for query in queries:
        with django_assert_max_num_queries(5):  # login session, user, spaces, rows, capped count
            response = client.get(f"{LIST}?{query}")
        assert response.status_code == 200, query
        assert KEY.findall(response.content.decode()), query


def test_an_outsider_filtering_by_a_space_gets_404(crowded: World) -> None:
    client = crowded.client_for("charlie")
    assert client.get(LIST, {"space": str(crowded.space_a.id)}).status_code == 404
    assert client.get(LIST, {"space": "not-a-uuid"}).status_code == 404


def test_odd_filter_text_is_a_page_never_a_500(crowded: World) -> None:
    """A NUL byte (PostgreSQL refuses it in text) or LIKE wildcards in the search or label
    filter: a page, matching what the text says and no more."""
    client = crowded.client_for("bob")
    for filters in ({"q": "s00\x00"}, {"label": "x\x00"}, {"q": "\x00", "label": "\x00"}):
        page = client.get(LIST, filters)
        assert page.status_code == 200, filters
    assert KEY.findall(client.get(LIST, {"q": "s00\x00"}).content.decode())  # the NUL dropped: s00…
    assert not KEY.findall(client.get(LIST, {"q": "%"}).content.decode())
    assert not KEY.findall(client.get(LIST, {"q": "s_0"}).content.decode())


def _plan(sql: str, params: Any) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")  # an index that holds the order, or a Sort
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "session_list_order"),
        ({"space_id": "A"}, "session_list_space_order"),
        ({"state": "paused"}, "session_list_state_order"),
    ],
)
def test_each_order_and_filter_reads_an_index_without_sorting(
    crowded: World, filters: dict[str, str], index: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the indexes' plans are PostgreSQL's")
    if filters.get("space_id") == "A":
        filters = {"space_id": str(crowded.space_a.id)}
    keyed = SESSION_ORDER.annotate(Session.objects.filter(**filters))
    last = keyed.order_by(*SESSION_ORDER.order())[30]
    for page in (
        keyed.order_by(*SESSION_ORDER.order())[:26],
        keyed.filter(SESSION_ORDER.beyond(SESSION_ORDER.values_of(last))).order_by(*SESSION_ORDER.order())[:26],
        keyed.filter(SESSION_ORDER.beyond(SESSION_ORDER.values_of(last), reverse=True)).order_by(
            *SESSION_ORDER.order(reverse=True)
        )[:26],
    ):
        plan = _plan(*page.query.sql_with_params())
        assert index in plan, plan
        assert "Sort" not in plan, plan


@pytest.mark.postgres
def test_a_search_by_key_reads_the_trigram_index(crowded: World) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the search index is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'session_key_search'")
        assert cursor.fetchone() is not None, "the migration made no search index (is pg_trgm available?)"
    page = SESSION_ORDER.annotate(Session.objects.filter(key__icontains="s04")).order_by(*SESSION_ORDER.order())
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")  # not the order's index: the search's
        sql, params = page[:26].query.sql_with_params()
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "session_key_search" in plan, plan
