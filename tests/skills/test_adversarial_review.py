"""Adversarial review (rev1): what a package source's URL leaves in job logs."""

from __future__ import annotations

import pytest

from skills.install import redact_userinfo


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
