"""Register the console as a client and create users: `python -m tests.oidc_provider.setup
REDIRECT_URI CLIENT_ID CLIENT_SECRET [username:email:password ...]` (after migrate)."""

from __future__ import annotations

import sys
from typing import Any


def userinfo(claims: dict[str, Any], user: Any) -> dict[str, Any]:
    claims["email"] = user.email
    claims["email_verified"] = True
    claims["preferred_username"] = user.username
    claims["given_name"] = user.first_name
    return claims


def main(argv: list[str]) -> None:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from oidc_provider.models import Client, ResponseType

    redirect_uri, client_id, secret, *users = argv
    call_command("creatersakey")
    client = Client.objects.create(
        name="Sandbox Console",
        client_type="confidential",
        client_id=client_id,
        client_secret=secret,
        _redirect_uris=redirect_uri,
        require_consent=True,
        reuse_consent=False,
        _scope="openid email profile",
    )
    client.response_types.add(ResponseType.objects.get(value="code"))
    for spec in users:
        username, email, password = spec.split(":")
        get_user_model().objects.create_user(username, email=email, password=password)


if __name__ == "__main__":
    main(sys.argv[1:])
