"""In Chromium: a platform admin invites a user, the user opens the link, chooses a password
and is logged in; deactivated, their next page is the login page."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.personas import World

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


def test_invite_a_user_who_sets_a_password_then_deactivate_them(world: World, daphne_url: str, page: Any) -> None:
    page.goto(f"{daphne_url}/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "pw-root")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))
    page.click("nav.mainnav >> text=Platform")  # the platform's pages are in a drop-down
    page.click("nav.mainnav >> text=Users")
    page.wait_for_url(re.compile(r".*/platform/users/$"))
    page.click("text=Invite a user")
    page.fill("#id_username", "dana")
    page.fill("#id_email", "dana@example.test")
    page.click("button[type=submit] >> text=Create and invite")
    page.wait_for_selector("#invite-copy", state="visible")  # the copy button, shown with JS
    link = page.input_value("#invite-url")
    assert "/invite/" in link

    invitee = page.context.browser.new_context().new_page()
    invitee.goto(link)
    invitee.fill("#id_new_password1", "password")
    invitee.fill("#id_new_password2", "password")
    invitee.click("button[type=submit]")
    assert "too common" in invitee.content()
    invitee.fill("#id_new_password1", "Quiet-harbour-lantern-42")
    invitee.fill("#id_new_password2", "Quiet-harbour-lantern-42")
    invitee.click("button[type=submit]")
    invitee.wait_for_url(re.compile(r".*/$"))
    assert invitee.inner_text(".whoami").startswith("dana")

    page.goto(f"{daphne_url}/platform/users/?q=dana")
    assert "active" in page.inner_text("#users")
    page.click("#users >> text=dana")
    page.click("a >> text=Deactivate")
    page.click("button >> text=Deactivate")
    page.wait_for_selector("#user-status >> text=deactivated")

    invitee.reload()
    invitee.wait_for_url(re.compile(r".*/login/.*"))
    invitee.goto(link)
    assert "This link does not work" in invitee.content()
