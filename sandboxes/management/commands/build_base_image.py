"""`manage.py build_base_image [--force]`: the Docker backend's base template image."""

from __future__ import annotations

from typing import Any

import docker.errors
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE, ImageBuildError, build_base_image


class Command(BaseCommand):
    """Build the base template image from Debian packages (no registry pull)."""

    help = "Build the Docker base template image with mmdebstrap + docker import."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
        parser.add_argument("--tag", default=DEFAULT_BASE_IMAGE)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            image_id = build_base_image(force=options["force"], tag=options["tag"])
        except (ImageBuildError, docker.errors.DockerException) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"{options['tag']} {image_id}"))
