"""Space and member services (one audit row per write), pages, HTMX partials, query bounds."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from console.jobs import run_job
from console.models import AdminJob, AuditEvent, Membership, NetworkPolicy, Role, Space
from console.services import (
    SYSTEM,
    Actor,
    ServiceError,
    do_add_member,
    do_change_member_role,
    do_create_space,
    do_delete_space,
    do_remove_member,
    do_update_network_policy,
    do_update_space,
)
from tests.factories import add_member, make_space, make_user

from .conftest import World

pytestmark = pytest.mark.django_db


def audit_delta(func: Any) -> int:
    before = AuditEvent.objects.count()
    func()
    return AuditEvent.objects.count() - before


def test_every_service_write_records_exactly_one_audit_row(world: World) -> None:
    actor = Actor(user=world.root, source_ip="10.9.8.7")
    holder: dict[str, Any] = {}
    assert audit_delta(lambda: holder.setdefault("space", do_create_space(name="New", actor=actor))) == 1
    space = holder["space"]
    user = make_user()
    assert audit_delta(lambda: do_update_space(space, name="Newer", actor=actor)) == 1
    assert (
        audit_delta(lambda: holder.setdefault("m", do_add_member(space, user=user, role=Role.ADMIN, actor=actor))) == 1
    )
    other = make_user()
    do_add_member(space, user=other, role=Role.ADMIN, actor=actor)
    assert audit_delta(lambda: do_change_member_role(holder["m"], role=Role.VIEWER, actor=actor)) == 1
    assert audit_delta(lambda: do_remove_member(holder["m"], actor=actor)) == 1
    assert (
        audit_delta(
            lambda: do_update_network_policy(
                space,
                allow_internet_access=True,
                allow_out=[],
                deny_out=[],
                l7_rules=[],
                allow_public_traffic=True,
                actor=actor,
            )
        )
        == 1
    )
    assert audit_delta(lambda: do_delete_space(space, actor=actor)) == 1
    event = AuditEvent.objects.get(action="space.delete")
    assert event.actor == world.root
    assert event.source_ip == "10.9.8.7"
    assert event.details["name"] == "Newer"


def test_no_op_update_writes_no_audit_row(world: World) -> None:
    assert audit_delta(lambda: do_update_space(world.space_a, name="Space A", actor=SYSTEM)) == 0


def test_create_space_starts_with_a_closed_explicit_policy_and_creator_as_admin(
    world: World,
) -> None:
    space = do_create_space(name="Team X", actor=Actor(user=world.alice))
    policy = NetworkPolicy.objects.get(space=space)
    assert (policy.allow_internet_access, policy.allow_public_traffic) == (False, False)
    assert Membership.objects.get(space=space, user=world.alice).role == Role.ADMIN
    assert space.slug == "team-x"
    assert do_create_space(name="Team-X", actor=SYSTEM).slug == "team-x-2"


def test_duplicate_slug_is_a_clear_error_and_writes_nothing(world: World) -> None:
    before = (Space.objects.count(), AuditEvent.objects.count())
    with pytest.raises(ServiceError, match="slug already exists"):
        do_create_space(name="Other", slug="space-a", actor=SYSTEM)
    assert (Space.objects.count(), AuditEvent.objects.count()) == before


def test_last_admin_cannot_be_removed_or_demoted(world: World) -> None:
    membership = Membership.objects.get(space=world.space_a, user=world.alice)
    with pytest.raises(ServiceError, match="at least one admin"):
        do_remove_member(membership, actor=SYSTEM)
    with pytest.raises(ServiceError, match="at least one admin"):
        do_change_member_role(membership, role=Role.MEMBER, actor=SYSTEM)
    assert Membership.objects.get(pk=membership.pk).role == Role.ADMIN


def test_adding_an_existing_member_is_refused(world: World) -> None:
    with pytest.raises(ServiceError, match="already a member"):
        do_add_member(world.space_a, user=world.bob, role=Role.ADMIN, actor=SYSTEM)


def test_member_add_unknown_user_shows_an_error(world: World) -> None:
    response = world.client_for("alice").post(
        reverse("console:member_add", args=[world.space_a.id]),
        {"username": "nobody", "role": "member"},
        follow=True,
    )
    assert "No user has the username or email &#x27;nobody&#x27;." in response.content.decode()


def test_space_create_edit_delete_flow(world: World) -> None:
    client = world.client_for("root")
    response = client.post(reverse("console:space_create"), {"name": "Research", "slug": "", "description": "R&D"})
    space = Space.objects.get(slug="research")
    assert response["Location"] == space.get_absolute_url()
    response = client.post(reverse("console:space_edit", args=[space.id]), {"name": "", "slug": "research"})
    assert response.status_code == 400  # a form with errors answers 400 (HTMX swaps it)
    assert "This field is required." in response.content.decode()
    response = client.post(reverse("console:space_edit", args=[space.id]), {"name": "Research 2", "slug": "space-a"})
    assert "Space with this Slug already exists." in response.content.decode()
    assert Space.objects.get(pk=space.pk).slug == "research"
    # Deletion needs the slug typed back.
    client.post(reverse("console:space_delete", args=[space.id]), {"confirm_slug": "wrong"})
    assert Space.objects.filter(pk=space.pk).exists()
    response = client.post(reverse("console:space_delete", args=[space.id]), {"confirm_slug": "research"})
    job = AdminJob.objects.get(kind="sandboxes.teardown_space", params__target=str(space.id))
    assert response["Location"] == job.get_absolute_url()  # a teardown job, followed on its page
    run_job(str(job.id))
    assert not Space.objects.filter(pk=space.pk).exists()


def test_space_list_search_pagination_and_htmx_partial(world: World) -> None:
    for i in range(30):
        make_space(f"Bulk {i:02d}")
    client = world.client_for("root")
    page1 = client.get(reverse("console:space_list"), {"q": "bulk"})
    assert "Page 1 of 2" in page1.content.decode()
    partial = client.get(
        reverse("console:space_list"),
        {"q": "bulk", "page": "2"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="space-results",
    )
    body = partial.content.decode()
    assert "<html" not in body
    assert "Bulk 29" in body
    assert "Page 2 of 2" in body
    empty = client.get(reverse("console:space_list"), {"q": "zzz"})
    assert "No space matches" in empty.content.decode()


def test_htmx_responses_carry_messages_out_of_band(world: World) -> None:
    client = world.client_for("root")
    client.post(reverse("console:space_create"), {"name": "Msg"})
    response = client.get(reverse("console:space_list"), HTTP_HX_REQUEST="true", HTTP_HX_TARGET="space-results")
    body = response.content.decode()
    assert 'id="messages"' in body
    assert 'hx-swap-oob="true"' in body
    assert "Space Msg created" in body


def test_dashboard_counts(world: World) -> None:
    response = world.client_for("alice").get(reverse("console:dashboard"))
    assert response.status_code == 200
    assert response.context["space_count"] == 1
    assert response.context["member_count"] == 3
    # Counts read as English: one space, not "1 spaces".
    html = response.content.decode()
    assert "<strong>1</strong> space</a>" in html
    assert "<strong>3</strong> members</div>" in html
    assert "<strong>0</strong> jobs queued or running" in html


def test_login_page_and_login(world: World) -> None:
    from django.test import Client

    client = Client()
    assert client.get(reverse("login")).status_code == 200
    response = client.post(reverse("login"), {"username": "alice", "password": "pw-alice"}, follow=True)
    assert "Space A" in response.content.decode()
    response = client.post(reverse("logout"), follow=True)
    assert response.request["PATH_INFO"] == reverse("login")


ROWS = 200


@pytest.fixture
def many_rows(world: World) -> World:
    spaces = [Space(name=f"S{i:03d}", slug=f"s{i:03d}") for i in range(ROWS)]
    Space.objects.bulk_create(spaces)
    Membership.objects.bulk_create([Membership(space=s, user=world.charlie, role=Role.ADMIN) for s in spaces])
    AuditEvent.objects.bulk_create(
        [
            AuditEvent(actor=world.charlie, actor_name="charlie", space=s, space_name=s.name, action="x.y")
            for s in spaces
        ]
    )
    AdminJob.objects.bulk_create(
        [AdminJob(kind="console.diagnostics", space=s, created_by=world.charlie) for s in spaces]
    )
    return world


@pytest.mark.parametrize(
    ("url_name", "max_queries"),
    [
        ("console:space_list", 8),
        ("console:audit_list", 10),
        ("console:job_list", 8),
        # The login's two, the counts read together with every getting-started step, the
        # newest spaces, the newest jobs, the charts' samples.
        ("console:dashboard", 6),
    ],
)
def test_list_pages_have_bounded_queries(
    many_rows: World, django_assert_max_num_queries: Any, url_name: str, max_queries: int
) -> None:
    client = many_rows.client_for("charlie")
    with django_assert_max_num_queries(max_queries):
        response = client.get(reverse(url_name))
    assert response.status_code == 200


def test_space_detail_queries_do_not_grow_with_members(world: World, django_assert_max_num_queries: Any) -> None:
    client = world.client_for("alice")
    with CaptureQueriesContext(connection) as few:
        assert client.get(world.space_a.get_absolute_url()).status_code == 200
    for _ in range(50):
        add_member(world.space_a, make_user(), Role.VIEWER)
    # The page's panels (configs, skills and their one-step install) are a fixed cost.
    with django_assert_max_num_queries(12):
        assert client.get(world.space_a.get_absolute_url()).status_code == 200
    with CaptureQueriesContext(connection) as many:
        assert client.get(world.space_a.get_absolute_url()).status_code == 200
    assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
