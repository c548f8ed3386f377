"""The command palette's search: what each user may open, and nothing of another tenant's,
whether found by name, by a typed id, or by a forged `space` parameter."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.models import Session
from tests.factories import make_config
from tests.personas import World
from tests.support.skills import make_version


@pytest.fixture
def things(world: World) -> dict[str, Any]:
    """Same-looking names in both spaces: only the space's own may show."""
    config_a = make_config(world.space_a, name="shared-config alpha")
    config_b = make_config(world.space_b, name="shared-config beta")
    return {
        "config_a": config_a,
        "config_b": config_b,
        "session_a": Session.objects.create(space=world.space_a, config=config_a, key="shared-session-a"),
        "session_b": Session.objects.create(space=world.space_b, config=config_b, key="shared-session-b"),
        "skill": make_version("shared-skill").skill,
    }


def results(world: World, who: str, **params: str) -> list[dict[str, str]]:
    response = world.client_for(who).get("/search/", {"format": "json", **params})
    assert response.status_code == 200, response.content
    return list(response.json()["results"])


def labels(hits: list[dict[str, str]], kind: str) -> set[str]:
    return {hit["label"] for hit in hits if hit["kind"] == kind}


def test_a_member_finds_their_own_space_session_config_and_the_catalog(world: World, things: dict[str, Any]) -> None:
    hits = results(world, "bob", q="shared")
    assert labels(hits, "session") == {"shared-session-a"}
    assert labels(hits, "config") == {"shared-config alpha"}
    assert labels(hits, "skill") == {"shared-skill"}
    session = next(hit for hit in hits if hit["kind"] == "session")
    assert session["url"] == things["session_a"].get_absolute_url()
    assert "Space A" in session["detail"]
    assert labels(results(world, "bob", q="space"), "space") == {"Space A"}


def test_another_tenants_things_never_appear(world: World, things: dict[str, Any]) -> None:
    for who in ("alice", "bob", "carol"):
        hits = results(world, who, q="shared")
        urls = {hit["url"] for hit in hits}
        assert things["session_b"].get_absolute_url() not in urls
        assert things["config_b"].get_absolute_url() not in urls
        assert "Space B" not in {hit["label"] for hit in results(world, who, q="Space")}
        assert all("Space B" not in hit["detail"] for hit in hits)
    # And the other tenant sees its own, not A's.
    hits = results(world, "charlie", q="shared")
    assert labels(hits, "session") == {"shared-session-b"}
    assert labels(hits, "config") == {"shared-config beta"}


def test_a_typed_id_finds_only_inside_the_users_spaces(world: World, things: dict[str, Any]) -> None:
    for forged in (things["session_b"].id, things["config_b"].id, world.space_b.id):
        assert [hit for hit in results(world, "bob", q=str(forged)) if hit["kind"] != "page"] == []
    assert labels(results(world, "bob", q=str(things["session_a"].id)), "session") == {"shared-session-a"}
    assert labels(results(world, "charlie", q=str(things["session_b"].id)), "session") == {"shared-session-b"}


def test_a_forged_space_parameter_is_a_404_and_reveals_nothing(world: World, things: dict[str, Any]) -> None:
    client = world.client_for("bob")
    for forged in (str(world.space_b.id), "not-a-uuid", "00000000-0000-0000-0000-000000000000"):
        response = client.get("/search/", {"format": "json", "q": "shared", "space": forged})
        assert response.status_code == 404
        assert response.json() == {"error": "No such space."}
    hits = results(world, "bob", q="shared", space=str(world.space_a.id))
    assert labels(hits, "session") == {"shared-session-a"}
    assert labels(hits, "page") == set()


def test_pages_follow_the_role_and_platform_pages_are_the_admins(world: World) -> None:
    assert "Users" not in labels(results(world, "alice", q=""), "page")
    assert {"Dashboard", "Sessions", "Skills"} <= labels(results(world, "bob", q=""), "page")
    assert "Users" in labels(results(world, "root", q="users"), "page")
    assert labels(results(world, "bob", q="sess"), "page") == {"Sessions"}


def test_anonymous_is_sent_to_log_in_and_bad_queries_are_no_error(world: World) -> None:
    response = world.client_for("anonymous").get("/search/", {"format": "json", "q": "shared"})
    assert response.status_code == 302
    assert "/login/" in response["Location"]
    for query in ("%", "_", "x" * 5000, "\x00", "' OR 1=1 --"):
        response = world.client_for("bob").get("/search/", {"format": "json", "q": query})
        assert response.status_code == 200


def test_the_search_page_works_without_javascript(world: World, things: dict[str, Any]) -> None:
    page = world.client_for("bob").get("/search/", {"q": "shared"}).content.decode()
    assert 'id="search-results"' in page
    assert things["session_a"].get_absolute_url() in page
    assert things["session_b"].get_absolute_url() not in page
    assert 'id="shortcuts"' in page
