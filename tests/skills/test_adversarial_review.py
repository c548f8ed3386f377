"""Adversarial review (rev1): what a package source's URL leaves in job logs."""

from __future__ import annotations

import pytest
from django.urls import reverse

from skills.install.packages import redact_userinfo
from tests.personas import World


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("http://ghp_s3cr3tT0ken@127.0.0.1:8080/simple/", "ghp_s3cr3tT0ken"),  # a token alone
        ("http://user:p%40ss:w0rd@127.0.0.1:8080/simple/", "w0rd"),  # ':' inside the password
        ("http://user:pa@ss@[::1]:8080/simple/?k=v", "pa@ss"),  # '@' inside the password
        ("http://user:s3cret@[::1]:8080/simple/", "s3cret"),  # an IPv6 literal
    ],
    ids=["token-only", "colon-in-password", "at-in-password", "ipv6"],
)
def test_credentials_in_a_source_url_never_reach_the_log(url: str, secret: str) -> None:
    shown = redact_userinfo(url)
    assert secret not in shown
    assert "127.0.0.1:8080" in shown or "[::1]:8080" in shown


@pytest.mark.django_db
def test_importing_the_bundled_examples_is_a_platform_admins_post_with_csrf(world: World) -> None:
    from django.test import Client

    from skills.models import Skill

    url = reverse("skills:skill_import_examples")
    alice = world.client_for("alice")  # a space admin, not a platform admin
    assert alice.post(url).status_code == 403
    assert world.client_for("root").get(url).status_code == 405
    assert not Skill.objects.exists()
    forged = Client(enforce_csrf_checks=True)
    forged.force_login(world.root)
    assert forged.post(url).status_code == 403  # a cross-site form without the CSRF token
    assert not Skill.objects.exists()
