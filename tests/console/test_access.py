"""Every space-scoped view under every persona.

The outsider (charlie) gets 404, viewers and members cannot write, anonymous users are sent
to login, and POSTs need a CSRF token.
"""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from console.access import get_space_for_user, spaces_for_user
from console.models import AuditEvent, Membership, Role

from .conftest import World

pytestmark = pytest.mark.django_db


def space_urls(world: World) -> dict[str, str]:
    a = world.space_a.id
    membership = Membership.objects.get(space=world.space_a, user=world.carol)
    return {
        "detail": reverse("console:space_detail", args=[a]),
        "edit": reverse("console:space_edit", args=[a]),
        "delete": reverse("console:space_delete", args=[a]),
        "network": reverse("console:network_policy_edit", args=[a]),
        "member_add": reverse("console:member_add", args=[a]),
        "member_role": reverse("console:member_role", args=[a, membership.id]),
        "member_remove": reverse("console:member_remove", args=[a, membership.id]),
    }


READ_VIEWS = ["detail"]
ADMIN_GET_VIEWS = ["edit", "delete", "network", "member_remove"]
WRITE_POSTS = {
    "edit": {"name": "Renamed", "slug": "space-a", "description": ""},
    "delete": {"confirm_slug": "space-a"},
    "network": {"allow_internet_access": "on", "deny_out": "0.0.0.0/0"},
    "member_add": {"username": "charlie", "role": "viewer"},
    "member_role": {"role": "member"},
    "member_remove": {},
}


@pytest.mark.parametrize("view", READ_VIEWS + ADMIN_GET_VIEWS)
def test_anonymous_is_sent_to_login(world: World, view: str) -> None:
    url = space_urls(world)[view]
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("view", READ_VIEWS + ADMIN_GET_VIEWS)
def test_outsider_gets_404_on_every_page(world: World, view: str) -> None:
    assert world.client_for("charlie").get(space_urls(world)[view]).status_code == 404


@pytest.mark.parametrize("view", list(WRITE_POSTS))
def test_outsider_gets_404_on_every_write(world: World, view: str) -> None:
    before = AuditEvent.objects.count()
    response = world.client_for("charlie").post(space_urls(world)[view], WRITE_POSTS[view])
    assert response.status_code == 404
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize("persona", ["bob", "carol"])
@pytest.mark.parametrize("view", list(WRITE_POSTS))
def test_members_and_viewers_cannot_write(world: World, persona: str, view: str) -> None:
    before = AuditEvent.objects.count()
    response = world.client_for(persona).post(space_urls(world)[view], WRITE_POSTS[view])
    assert response.status_code == 403
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize("persona", ["bob", "carol"])
@pytest.mark.parametrize("view", ADMIN_GET_VIEWS)
def test_members_and_viewers_cannot_open_admin_forms(world: World, persona: str, view: str) -> None:
    assert world.client_for(persona).get(space_urls(world)[view]).status_code == 403


@pytest.mark.parametrize("persona", ["alice", "bob", "carol", "root"])
def test_space_readers_see_the_space(world: World, persona: str) -> None:
    response = world.client_for(persona).get(space_urls(world)["detail"])
    assert response.status_code == 200
    assert "Space A" in response.content.decode()


@pytest.mark.parametrize("view", list(WRITE_POSTS))
def test_admin_writes_succeed_and_audit_once(world: World, view: str) -> None:
    before = AuditEvent.objects.count()
    response = world.client_for("alice").post(space_urls(world)[view], WRITE_POSTS[view])
    assert response.status_code == 302, response.content.decode()[:2000]
    assert AuditEvent.objects.count() == before + 1


@pytest.mark.parametrize("view", list(WRITE_POSTS))
def test_posts_need_csrf(world: World, view: str) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.alice)
    before = AuditEvent.objects.count()
    assert client.post(space_urls(world)[view], WRITE_POSTS[view]).status_code == 403
    assert AuditEvent.objects.count() == before


def test_space_list_shows_only_own_spaces(world: World) -> None:
    body = world.client_for("charlie").get(reverse("console:space_list")).content.decode()
    assert "Space B" in body
    assert "Space A" not in body
    root_body = world.client_for("root").get(reverse("console:space_list")).content.decode()
    assert "Space A" in root_body
    assert "Space B" in root_body


def test_only_platform_admins_create_spaces(world: World) -> None:
    url = reverse("console:space_create")
    assert world.client_for("alice").get(url).status_code == 403
    assert world.client_for("alice").post(url, {"name": "X"}).status_code == 403
    assert world.client_for("root").get(url).status_code == 200


def test_access_helper(world: World) -> None:
    from django.core.exceptions import PermissionDenied
    from django.http import Http404

    assert get_space_for_user(world.carol, world.space_a.id) == world.space_a
    with pytest.raises(PermissionDenied):
        get_space_for_user(world.carol, world.space_a.id, Role.MEMBER)
    with pytest.raises(Http404):
        get_space_for_user(world.charlie, world.space_a.id)
    with pytest.raises(Http404):
        get_space_for_user(world.alice, "not-a-uuid")
    assert set(spaces_for_user(world.bob, Role.MEMBER)) == {world.space_a}
    assert set(spaces_for_user(world.bob, Role.ADMIN)) == set()
    assert set(spaces_for_user(world.root)) == {world.space_a, world.space_b}


def test_outsider_gets_404_on_jobs_of_other_spaces(world: World) -> None:
    from console.models import AdminJob

    job = AdminJob.objects.create(kind="console.diagnostics", space=world.space_a)
    assert world.client_for("charlie").get(reverse("console:job_detail", args=[job.id])).status_code == 404
    assert world.client_for("charlie").post(reverse("console:job_cancel", args=[job.id])).status_code == 404
    assert world.client_for("carol").get(reverse("console:job_detail", args=[job.id])).status_code == 200
    assert world.client_for("carol").post(reverse("console:job_cancel", args=[job.id])).status_code == 403
    platform_job = AdminJob.objects.create(kind="console.diagnostics")
    assert world.client_for("alice").get(reverse("console:job_detail", args=[platform_job.id])).status_code == 404


def test_audit_log_is_scoped(world: World) -> None:
    AuditEvent.objects.create(actor_name="x", space=world.space_a, space_name="Space A", action="a.secret")
    AuditEvent.objects.create(actor_name="x", space=world.space_b, space_name="Space B", action="b.secret")
    assert "a.secret" in world.client_for("alice").get(reverse("console:audit_list")).content.decode()
    charlie_body = world.client_for("charlie").get(reverse("console:audit_list")).content.decode()
    assert "a.secret" not in charlie_body
    assert "b.secret" in charlie_body
    carol_body = world.client_for("carol").get(reverse("console:audit_list")).content.decode()
    assert "a.secret" not in carol_body
    # Filtering by a space the user cannot see matches nothing rather than revealing it.
    filtered = world.client_for("charlie").get(reverse("console:audit_list"), {"space": str(world.space_a.id)})
    assert "a.secret" not in filtered.content.decode()
