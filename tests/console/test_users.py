"""Users: create and invite (one-time link), accept, deactivate/reactivate, the Users page,
and adding members by username or email."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from console.models import AuditEvent, Invitation, Membership
from console.services import Actor
from console.users import UserStatus, do_create_user, do_deactivate_user, user_status
from tests.factories import make_user
from tests.personas import World
from tests.support.tuning import Tuned

pytestmark = pytest.mark.django_db
GOOD_PASSWORD = "Quiet-harbour-lantern-42"


def root_client(world: World) -> Client:
    client = Client()
    client.force_login(world.root)
    return client


def logs_in(username: str, password: str, client: Client | None = None) -> bool:
    """A login through the login page (django-axes wants the request)."""
    client = client or Client()
    response = client.post(reverse("login"), {"username": username, "password": password})
    return response.status_code == 302


def invite_path(page: str) -> str:
    match = re.search(r'value="https?://[^/"]+(/invite/[^"]+/)"', page)
    assert match, "the page shows no invitation link"
    return match.group(1)


def create(world: World, **data: str) -> tuple[Client, str]:
    client = root_client(world)
    response = client.post(reverse("console:user_create"), {"username": "dana", **data})
    assert response.status_code == 200, response.content[:500]
    page = response.content.decode()
    assert 'id="invite-copy"' in page  # the copy button
    return client, invite_path(page)


def test_a_platform_admin_creates_a_user_and_gets_a_one_time_link(world: World) -> None:
    _, path = create(world, email="dana@example.test")
    dana = get_user_model().objects.get(username="dana")
    assert not dana.has_usable_password()
    assert dana.is_active
    assert user_status(dana) == UserStatus.INVITED
    event = AuditEvent.objects.get(action="user.create")
    assert event.actor == world.root
    assert event.details["username"] == "dana"
    token = path.split("/")[2]
    assert token not in str(list(Invitation.objects.values()))  # only its hash is stored
    assert mail.outbox == []  # email is not configured


def test_the_invitation_is_emailed_when_email_is_configured(world: World, settings: object) -> None:
    settings.INVITE_EMAIL = True  # type: ignore[attr-defined]
    _, path = create(world, email="dana@example.test")
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == ["dana@example.test"]
    assert path in mail.outbox[0].body
    assert "http://testserver/invite/" in mail.outbox[0].body


def test_a_duplicate_username_is_a_form_error(world: World) -> None:
    response = root_client(world).post(reverse("console:user_create"), {"username": "BOB"})
    assert response.status_code == 400
    assert b"already a user named" in response.content
    assert not AuditEvent.objects.filter(action="user.create").exists()


def test_the_link_sets_a_validated_password_once_and_logs_in(world: World) -> None:
    _, path = create(world)
    guest = Client()
    assert guest.get(path).status_code == 200
    weak = guest.post(path, {"new_password1": "password", "new_password2": "password"})
    assert weak.status_code == 400
    assert b"too common" in weak.content  # Django's validators
    assert not get_user_model().objects.get(username="dana").has_usable_password()
    done = guest.post(path, {"new_password1": GOOD_PASSWORD, "new_password2": GOOD_PASSWORD})
    assert done.status_code == 302
    assert done["Location"] == reverse("console:dashboard")
    assert guest.get(reverse("console:dashboard")).status_code == 200  # logged in
    dana = get_user_model().objects.get(username="dana")
    assert dana.check_password(GOOD_PASSWORD)
    assert user_status(dana) == UserStatus.ACTIVE
    assert AuditEvent.objects.filter(action="user.invite_accept", actor=dana).count() == 1
    # Works once: a second visit, or a second post, is refused and changes nothing.
    again = Client()
    assert again.get(path).status_code == 404
    reuse = again.post(path, {"new_password1": "Other-pass-99-xyz", "new_password2": "Other-pass-99-xyz"})
    assert reuse.status_code == 404
    assert b"does not work" in reuse.content
    assert get_user_model().objects.get(username="dana").check_password(GOOD_PASSWORD)
    assert logs_in("dana", GOOD_PASSWORD)


def test_an_expired_link_does_not_work(world: World) -> None:
    _, path = create(world)
    Invitation.objects.update(expires=timezone.now() - timedelta(seconds=1))
    response = Client().post(path, {"new_password1": GOOD_PASSWORD, "new_password2": GOOD_PASSWORD})
    assert response.status_code == 404
    assert not get_user_model().objects.get(username="dana").has_usable_password()


def test_the_lifetime_is_a_setting(tuned: Tuned, world: World, settings: object) -> None:
    tuned({"users.invite_link_hours": 2})
    create(world)
    invitation = Invitation.objects.get()
    assert timedelta(hours=1, minutes=59) < invitation.expires - invitation.created <= timedelta(hours=2)


def test_a_new_link_replaces_the_old_one(world: World) -> None:
    client, old = create(world)
    dana = get_user_model().objects.get(username="dana")
    response = client.post(reverse("console:user_invite", args=[dana.pk]))
    new = invite_path(response.content.decode())
    assert new != old
    assert Client().get(old).status_code == 404
    assert Client().get(new).status_code == 200
    assert AuditEvent.objects.filter(action="user.invite").count() == 1


def test_deactivation_ends_sessions_and_logins_reactivation_restores_them(world: World) -> None:
    bob = Client()
    assert logs_in("bob", "pw-bob", bob)
    assert bob.get(reverse("console:dashboard")).status_code == 200
    admin = root_client(world)
    response = admin.post(reverse("console:user_deactivate", args=[world.bob.pk]))
    assert response.status_code == 302
    assert bob.get(reverse("console:dashboard")).status_code == 302  # logged out
    assert not logs_in("bob", "pw-bob")
    event = AuditEvent.objects.get(action="user.deactivate")
    assert event.details["sessions_ended"] == 1
    page = admin.get(reverse("console:user_detail", args=[world.bob.pk])).content.decode()
    assert "deactivated" in page
    assert "Reactivate" in page
    admin.post(reverse("console:user_reactivate", args=[world.bob.pk]))
    assert logs_in("bob", "pw-bob")
    assert AuditEvent.objects.filter(action="user.reactivate").count() == 1


def test_nobody_deactivates_themselves(world: World) -> None:
    admin = root_client(world)
    admin.post(reverse("console:user_deactivate", args=[world.root.pk]))
    world.root.refresh_from_db()
    assert world.root.is_active
    assert not AuditEvent.objects.filter(action="user.deactivate").exists()


def test_a_deactivated_users_open_link_stops_working(world: World) -> None:
    _, path = create(world)
    dana = get_user_model().objects.get(username="dana")
    do_deactivate_user(dana, actor=Actor(user=world.root))
    assert Client().get(path).status_code == 404


def test_the_users_page_lists_searches_filters_and_paginates(world: World) -> None:
    admin = root_client(world)
    do_create_user(username="erin", email="erin@example.test", actor=Actor(user=world.root))
    do_deactivate_user(world.carol, actor=Actor(user=world.root))
    page = admin.get(reverse("console:user_list")).content.decode()
    for name in ("alice", "bob", "carol", "erin", "root"):
        assert f">{name}</a>" in page
    assert "status-invited" in page
    assert "status-deactivated" in page
    assert "status-active" in page
    found = admin.get(reverse("console:user_list"), {"q": "erin@"}).content.decode()
    assert ">erin</a>" in found
    assert ">bob</a>" not in found
    invited = admin.get(reverse("console:user_list"), {"status": "invited"}).content.decode()
    assert ">erin</a>" in invited
    assert ">alice</a>" not in invited
    gone = admin.get(reverse("console:user_list"), {"status": "deactivated"}).content.decode()
    assert ">carol</a>" in gone
    assert ">erin</a>" not in gone
    active = admin.get(reverse("console:user_list"), {"status": "active"}).content.decode()
    assert ">alice</a>" in active
    assert ">erin</a>" not in active
    assert ">carol</a>" not in active
    none = admin.get(reverse("console:user_list"), {"q": "nobody-like-this"}).content.decode()
    assert "No user matches" in none
    for n in range(30):
        make_user(f"zz{n:02d}")
    second = admin.get(reverse("console:user_list"), {"page": 2}).content.decode()
    assert "Page 2 of 2" in second
    partial = admin.get(reverse("console:user_list"), headers={"HX-Request": "true", "HX-Target": "user-results"})
    assert b"<html" not in partial.content
    assert b"Page 1 of 2" in partial.content


def test_users_nav_entry_is_for_platform_admins_only(world: World) -> None:
    assert reverse("console:user_list").encode() in root_client(world).get(reverse("console:dashboard")).content
    alice = Client()
    alice.force_login(world.alice)
    assert reverse("console:user_list").encode() not in alice.get(reverse("console:dashboard")).content
    assert alice.get(reverse("console:user_list")).status_code == 404


# --- Members by username or email ------------------------------------------------------------


def add(world: World, identifier: str) -> list[str]:
    client = Client()
    client.force_login(world.alice)
    response = client.post(
        reverse("console:member_add", args=[world.space_a.id]), {"username": identifier, "role": "viewer"}, follow=True
    )
    return [str(m) for m in response.context["messages"]]


def test_a_member_is_added_by_email_or_by_username_in_any_case(world: World) -> None:
    make_user("frank", email="Frank@Example.test")
    assert add(world, "frank@example.TEST") == ["frank added as Viewer."]
    assert Membership.objects.filter(space=world.space_a, user__username="frank").exists()
    assert add(world, "CHARLIE") == ["charlie added as Viewer."]


def test_unknown_ambiguous_and_deactivated_users_get_clear_errors(world: World) -> None:
    make_user("gina", email="shared@example.test")
    make_user("Hank")
    make_user("hank")  # usernames differ in case; an email belongs to one user (the database says)
    ivan = make_user("ivan", email="ivan@example.test")
    do_deactivate_user(ivan, actor=Actor(user=world.root))
    before = Membership.objects.count()
    assert add(world, "nobody@example.test") == ["No user has the username or email 'nobody@example.test'."]
    assert add(world, "HANK") == ["Several users match 'HANK': add them by username instead."]
    assert add(world, "ivan@example.test") == [
        "ivan is deactivated: a platform admin can reactivate them on the Users page."
    ]
    assert add(world, "gina") == ["gina added as Viewer."]  # the username still works
    assert Membership.objects.count() == before + 1


def test_the_last_active_platform_admin_stays(world: World) -> None:
    from console.services import SYSTEM, ServiceError

    with pytest.raises(ServiceError, match="at least one active platform admin"):
        do_deactivate_user(world.root, actor=SYSTEM)
    ops = make_user("ops", superuser=True)
    do_deactivate_user(world.root, actor=Actor(user=ops))
    world.root.refresh_from_db()
    assert not world.root.is_active
