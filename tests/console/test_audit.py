"""The audit log: actions named by one enumeration, the API token and the target by name."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from console.models import AuditAction, AuditEvent, Role
from console.services import SYSTEM, Actor, do_add_member, record_audit
from sandboxes.api.tokens import do_create_api_token
from tests.factories import make_config, make_user
from tests.personas import World

pytestmark = pytest.mark.django_db


def test_every_action_has_a_label_and_a_dotted_value() -> None:
    assert len(AuditAction.values) == len(set(AuditAction.values))
    for action in AuditAction:
        assert re.fullmatch(r"[a-z_]+\.[a-z_]+", action.value), action
        assert action.label, action
        assert action.label != action.value, action
    # Stored values stay the strings rows were written with before the enumeration.
    assert AuditAction.SESSION_SANDBOX_CREATE == "session.sandbox_create"
    assert AuditAction.SKILL_IMAGE_INSTALL == "skill_image.install"
    assert AuditAction("terminal.open") is AuditAction.TERMINAL_OPEN


def test_record_audit_refuses_an_unknown_action_and_writes_nothing() -> None:
    before = AuditEvent.objects.count()
    with pytest.raises(ValueError, match=r"Unknown audit action 'session\.sandbox_creat'"):
        record_audit(SYSTEM, "session.sandbox_creat", target_type="session")  # type: ignore[arg-type]
    assert AuditEvent.objects.count() == before


def test_an_api_call_is_recorded_with_its_token_name_and_the_page_shows_it(world: World) -> None:
    make_config(world.space_a)
    _, token = do_create_api_token(world.space_a, name="ci-runner", actor=Actor(user=world.alice))
    response = Client().post(
        f"/api/v1/spaces/{world.space_a.id}/sessions/s-audited/turns/begin",
        "",
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.content
    event = AuditEvent.objects.get(action=AuditAction.SESSION_CREATE)
    assert event.actor_name == "alice"
    assert event.details["api_token"] == "ci-runner"
    assert event.details["target_name"] == "s-audited"

    page = world.client_for("alice").get(reverse("console:audit_list")).content.decode()
    assert "via API token “ci-runner”" in page
    assert "Session created" in page
    assert "session s-audited" in page


def test_a_console_write_names_no_token() -> None:
    event = record_audit(Actor(user=make_user("dora")), AuditAction.SECRETS_ROTATE, target_type="field_encryption_key")
    assert "api_token" not in event.details


def test_the_page_names_targets_and_keeps_an_id_where_no_name_was_kept(world: World) -> None:
    erin = make_user("erin")
    do_add_member(world.space_a, user=erin, role=Role.MEMBER, actor=Actor(user=world.alice))
    old = record_audit(
        SYSTEM, AuditAction.SPACE_UPDATE, space=world.space_a, target_type="space", target_id="0123456789abcdef-uuid"
    )
    assert "target_name" not in old.details  # a row written before names were kept
    page = world.client_for("alice").get(reverse("console:audit_list")).content.decode()
    assert "user erin" in page
    assert "Member added" in page
    assert "0123456789ab" in page  # truncated id, as before
