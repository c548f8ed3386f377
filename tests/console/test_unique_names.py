"""Names people tell things apart by are unique: space names (ignoring case), the names of a
space's tokens in force, user emails. Each refusal is a field error that keeps what was typed;
the constraints' migrations rename duplicates that exist already."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.urls import reverse

from console.models import Space
from console.services import Actor, ServiceError, do_create_space, do_update_space
from sandboxes.api.tokens import do_create_api_token, do_revoke_api_token
from sandboxes.models import ApiToken
from tests.factories import make_space, make_user
from tests.personas import World

pytestmark = pytest.mark.django_db


def test_a_space_name_is_taken_ignoring_case(world: World) -> None:
    client = world.client_for("root")
    page = client.post(reverse("console:space_create"), {"name": "space a", "slug": "other-a"})
    assert page.status_code == 400
    body = page.content.decode()
    assert "There is already a space named &#x27;space a&#x27;." in body
    assert 'value="space a"' in body  # what was typed stays
    assert not Space.objects.filter(slug="other-a").exists()
    edit = client.post(reverse("console:space_edit", args=[world.space_b.id]), {"name": "SPACE A", "slug": "space-b"})
    assert edit.status_code == 400
    assert "There is already a space named" in edit.content.decode()
    world.space_b.refresh_from_db()
    assert world.space_b.name == "Space B"
    # Its own name, in other letters, is no clash.
    renamed = client.post(
        reverse("console:space_edit", args=[world.space_b.id]), {"name": "SPACE B", "slug": "space-b"}
    )
    assert renamed.status_code == 302


def test_the_services_and_the_database_refuse_a_taken_space_name(world: World) -> None:
    with pytest.raises(ServiceError) as refused:
        do_create_space(name="Space A", actor=Actor(user=world.root))
    assert refused.value.field_errors == {"name": ["There is already a space named 'Space A'."]}
    with pytest.raises(ServiceError):
        do_update_space(world.space_b, name="space a", actor=Actor(user=world.root))
    with pytest.raises(IntegrityError), transaction.atomic():
        Space.objects.create(name="SPACE A", slug="racing")


def test_token_names_are_unique_among_a_spaces_tokens_in_force(world: World) -> None:
    alice = Actor(user=world.alice)
    token, _ = do_create_api_token(world.space_a, name="agent", actor=alice)
    page = world.client_for("alice").post(reverse("sandboxes:token_list", args=[world.space_a.id]), {"name": "Agent"})
    body = page.content.decode()
    assert 'id="id_name_error"' in body
    assert "A token named &#x27;Agent&#x27; is in force in this space" in body
    assert 'value="Agent"' in body
    assert ApiToken.objects.filter(space=world.space_a).count() == 1
    do_create_api_token(world.space_b, name="agent", actor=Actor(user=world.charlie))  # another space
    do_revoke_api_token(token, actor=alice)
    do_create_api_token(world.space_a, name="agent", actor=alice)  # a revoked token frees its name
    assert ApiToken.objects.filter(name="agent").count() == 3


def test_an_email_belongs_to_one_user(world: World) -> None:
    make_user("dora", email="dora@example.test")
    page = world.client_for("root").post(
        reverse("console:user_create"), {"username": "dora2", "email": "DORA@example.test"}
    )
    assert page.status_code == 400
    body = page.content.decode()
    assert "Another user has the email &#x27;DORA@example.test&#x27;." in body
    assert 'value="dora2"' in body
    assert not type(world.root).objects.filter(username="dora2").exists()
    created = world.client_for("root").post(reverse("console:user_create"), {"username": "erin", "email": ""})
    assert created.status_code == 200  # no email is no clash


CONSOLE_BEFORE = ("console", "0010_audit_skill_git_hosts")
SANDBOXES_BEFORE = ("sandboxes", "0024_session_labels_keep_awake")


@pytest.mark.django_db(transaction=True)
def test_the_migrations_rename_existing_duplicates() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([CONSOLE_BEFORE, SANDBOXES_BEFORE])
    old = executor.loader.project_state([CONSOLE_BEFORE, SANDBOXES_BEFORE]).apps
    OldSpace = old.get_model("console", "Space")
    OldToken = old.get_model("sandboxes", "ApiToken")
    first = OldSpace.objects.create(name="Demo", slug="demo")
    OldSpace.objects.create(name="demo", slug="demo-2")
    OldSpace.objects.create(name="Demo", slug="demo-3")
    OldSpace.objects.create(name="Demo (2)", slug="demo-4")
    for index, name in enumerate(["agent", "Agent", "agent"]):
        OldToken.objects.create(space=first, name=name, prefix="sbx_x", token_hash=f"h{index}")
    OldToken.objects.create(
        space=first, name="agent", prefix="sbx_x", token_hash="revoked", revoked="2026-01-01T00:00Z"
    )
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    # The oldest keeps its name; a number already in use is skipped.
    names = dict(Space.objects.values_list("slug", "name"))
    assert names == {"demo": "Demo", "demo-2": "demo (3)", "demo-3": "Demo (4)", "demo-4": "Demo (2)"}
    tokens = ApiToken.objects.filter(revoked__isnull=True).values_list("name", flat=True)
    assert {name.lower() for name in tokens} == {"agent", "agent (2)", "agent (3)"}
    assert ApiToken.objects.get(token_hash="revoked").name == "agent"  # revoked ones keep theirs
    make_space("After")  # the constraint is in place and the table usable


@pytest.mark.django_db(transaction=True)
def test_the_migrations_rename_duplicates_of_the_longest_names() -> None:
    """A name as long as its field is cut to make room for the number: two such duplicates
    (and a space already named like the cut one) still end up with names of their own."""
    executor = MigrationExecutor(connection)
    executor.migrate([CONSOLE_BEFORE, SANDBOXES_BEFORE])
    old = executor.loader.project_state([CONSOLE_BEFORE, SANDBOXES_BEFORE]).apps
    OldSpace = old.get_model("console", "Space")
    OldToken = old.get_model("sandboxes", "ApiToken")
    long = "L" * 200
    first = OldSpace.objects.create(name=long, slug="long-1")
    for number in (2, 3):
        OldSpace.objects.create(name=long, slug=f"long-{number}")
    OldSpace.objects.create(name=f"{long[:190]} (2)", slug="long-cut")
    token_name = "t" * 100
    for index in range(3):
        OldToken.objects.create(space=first, name=token_name, prefix="sbx_x", token_hash=f"long{index}")
    executor = MigrationExecutor(connection)
    executor.migrate(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    names = dict(Space.objects.values_list("slug", "name"))
    assert names["long-1"] == long
    assert names["long-cut"] == f"{long[:190]} (2)"
    assert len({name.lower() for name in names.values()}) == len(names)
    assert all(len(name) <= 200 for name in names.values())
    tokens = list(ApiToken.objects.values_list("name", flat=True))
    assert len({name.lower() for name in tokens}) == 3
    assert all(len(name) <= 100 for name in tokens)
