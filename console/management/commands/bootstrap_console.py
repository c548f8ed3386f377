"""First-run setup for the one-command start: a first admin and a demo space.

Idempotent: a second run changes nothing and prints no password. The admin's credentials
come from CONSOLE_ADMIN_USER / CONSOLE_ADMIN_PASSWORD, or a password is generated and
printed once.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from console.models import Space
from console.services import SYSTEM, do_create_space

DEMO_SLUG = "demo"


class Command(BaseCommand):
    help = "Create the first platform admin and a demo space (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        self.ensure_admin()
        self.ensure_demo_space()

    def ensure_admin(self) -> None:
        model = get_user_model()
        username = os.environ.get("CONSOLE_ADMIN_USER", "admin")
        if model.objects.filter(username=username).exists():
            self.stdout.write(f"Admin user {username!r} exists (change its password with `manage.py changepassword`).")
            return
        password = os.environ.get("CONSOLE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
        model.objects.create_superuser(username=username, password=password, email="")
        if os.environ.get("CONSOLE_ADMIN_PASSWORD"):
            self.stdout.write(self.style.SUCCESS(f"Created admin {username!r} with CONSOLE_ADMIN_PASSWORD."))
        else:
            self.stdout.write(
                self.style.SUCCESS(
                    "\n"
                    "  First admin created; this password is shown only once:\n"
                    f"    username: {username}\n"
                    f"    password: {password}\n"
                )
            )

    def ensure_demo_space(self) -> None:
        if Space.objects.filter(slug=DEMO_SLUG).exists() or Space.objects.filter(name__iexact="Demo").exists():
            return  # space names are unique: a space of the admins' own named Demo stays theirs
        do_create_space(
            name="Demo",
            slug=DEMO_SLUG,
            description="A space to try the console: sandboxes start without network access.",
            actor=SYSTEM,
        )
        self.stdout.write(self.style.SUCCESS("Created the demo space."))
