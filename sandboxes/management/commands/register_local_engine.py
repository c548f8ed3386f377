"""Register the local Docker engine as a platform backend, for the one-command start, and
give the demo space a working Docker config when the engine answers.

Idempotent: registers nothing once any platform backend exists (a re-run only gives the local
engine's backend the package source folders prepared since, into fields still empty), and
creates the demo config only while the demo space has no config at all. Grants the backend to the demo space (and
every space named with --space), so the demo space can start a session right away.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from console.models import Space
from console.services import SYSTEM, ServiceError
from sandboxes.backends.base import RemoteError
from sandboxes.backends.docker.image import DEFAULT_BASE_IMAGE
from sandboxes.catalog.bridge import get_backend
from sandboxes.catalog.platform import do_fill_local_engine_sources, do_register_local_engine
from sandboxes.catalog.services import do_create_config
from sandboxes.models import BackendKind, PlatformBackend, SandboxConfig

NAME = "Local Docker engine"
DEMO_SLUG = "demo"
DEMO_CONFIG = "Local Docker"


def prepared_folders() -> dict[str, str]:
    """The package source folders `make start` prepares, by backend field, when present: the
    bundled examples' wheels (scripts/setup.sh), the local apt repository (scripts/apt_repo.py)
    and the npm tarball folder (scripts/npm_folder.py, complete)."""
    root = Path(settings.SKILL_PACKAGE_SOURCES_ROOT)
    return {
        "pip_find_links": "examples" if (root / "examples").is_dir() else "",
        "apt_folder": "debian" if (root / "debian" / "Packages").is_file() else "",
        "npm_folder": "npm" if (root / "npm" / ".complete").is_file() else "",
    }


class Command(BaseCommand):
    help = (
        "Register the local Docker engine as a platform backend (once), grant it to the demo space, "
        "and give the demo space a Docker config when the engine answers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--space", action="append", default=[DEMO_SLUG], help="slug of a space to grant it to")
        parser.add_argument("--no-demo-config", action="store_true", help="do not create the demo space's config")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = self.register(options["space"])
        if backend is not None and not options["no_demo_config"]:
            self.ensure_demo_config(backend)

    def register(self, slugs: list[str]) -> PlatformBackend | None:
        folders = prepared_folders()
        existing = PlatformBackend.objects.filter(name=NAME, kind=BackendKind.DOCKER, endpoint="").first()
        if PlatformBackend.objects.exists():
            self.stdout.write("Platform backends exist; nothing registered.")
            if existing is not None and (changed := do_fill_local_engine_sources(existing, folders=folders)):
                self.stdout.write(f"{NAME}: package sources set ({', '.join(changed)}).")
            return existing
        spaces = list(Space.objects.filter(slug__in=slugs))
        backend = do_register_local_engine(name=NAME, kind=BackendKind.DOCKER, spaces=spaces, **folders)
        self.stdout.write(
            self.style.SUCCESS(f"Registered {NAME}, granted to {', '.join(s.name for s in spaces) or 'no space'}.")
        )
        return backend

    def ensure_demo_config(self, backend: PlatformBackend) -> SandboxConfig | None:
        """The demo space's first config, on the local engine, if the engine answers now."""
        space = Space.objects.filter(slug=DEMO_SLUG).first()
        if space is None or SandboxConfig.objects.filter(space=space).exists():
            return None
        if not backend.spaces.filter(pk=space.pk).exists():
            return None
        template = DEFAULT_BASE_IMAGE  # built by `make start` (manage.py build_base_image)
        probe = SandboxConfig(space=space, backend=backend, name=DEMO_CONFIG, default_template=template)
        try:
            engine = get_backend(probe)
            health = engine.health()
            problem = "" if health.ok else health.detail
        except RemoteError as exc:
            problem = f"{exc.kind}: {exc.message}"
        if problem:
            self.stdout.write(f"The Docker engine does not answer ({problem}): no demo config yet; run this again.")
            return None
        try:
            config = do_create_config(
                space,
                data={"name": DEMO_CONFIG, "backend": backend, "default_template": template, "is_default": True},
                api_key="",
                actor=SYSTEM,
            )
        except ServiceError as exc:
            self.stdout.write(f"No demo config: {exc.message}")
            return None
        self.stdout.write(self.style.SUCCESS(f"Created the config {config.name} in {space.name} ({template})."))
        return config
