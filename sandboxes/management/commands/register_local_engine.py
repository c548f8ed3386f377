"""Register the local Docker engine as a platform backend, for the one-command start.

Idempotent: does nothing once any platform backend exists. Grants it to the demo space (and
every space named with --space), so the demo space's admin can create a config right away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from console.models import Space
from console.services import SYSTEM, record_audit
from sandboxes.models import BackendKind, PlatformBackend

NAME = "Local Docker engine"


class Command(BaseCommand):
    help = "Register the local Docker engine as a platform backend (once) and grant it to the demo space."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--space", action="append", default=["demo"], help="slug of a space to grant it to")

    def handle(self, *args: Any, **options: Any) -> None:
        if PlatformBackend.objects.exists():
            self.stdout.write("Platform backends exist; nothing registered.")
            return
        # The bundled examples' wheel folder (scripts/setup.sh) is its pip source when present.
        examples = "examples" if (Path(settings.SKILL_PACKAGE_SOURCES_ROOT) / "examples").is_dir() else ""
        backend = PlatformBackend.objects.create(name=NAME, kind=BackendKind.DOCKER, pip_find_links=examples)
        spaces = list(Space.objects.filter(slug__in=options["space"]))
        backend.spaces.set(spaces)
        record_audit(
            SYSTEM,
            "platform_backend.create",
            target_type="platform_backend",
            target_id=backend.id,
            details={
                "name": NAME,
                "kind": "docker",
                "endpoint": "",
                "pip_find_links": examples,
                "granted": [str(s.pk) for s in spaces],
            },
        )
        self.stdout.write(
            self.style.SUCCESS(f"Registered {NAME}, granted to {', '.join(s.name for s in spaces) or 'no space'}.")
        )
