"""Import skills from folders or archives on this server, or the bundled examples.

    manage.py import_skill PATH [PATH ...]     # a folder holding SKILL.md, or a .zip/.skill/.tar.gz
    manage.py import_skill --examples          # every skill under skills/examples/
    manage.py import_skill --git URL [--ref BRANCH] [--path FOLDER]   # a folder of a git repository

Each path is imported in its own transaction: one refusal does not undo the others, the
command goes on with the next path and exits non-zero when any path was refused. Paths and
names that are not UTF-8 are printed with their odd bytes as \\xNN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.services import SYSTEM, Actor, ServiceError
from skills.archives import shown
from skills.services import ImportResult, example_folders, import_archive, import_folder
from skills.sources.services import import_from_git


class GitUrl(NamedTuple):
    """A --git source: printed as the URL, its ref and folder."""

    url: str
    ref: str
    path: str

    def __str__(self) -> str:
        return " ".join(part for part in (self.url, self.ref, self.path) if part)


class Command(BaseCommand):
    help = "Import skills from folders or archives on this server (--examples: the bundled examples)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("paths", nargs="*", help="skill folders (holding SKILL.md) or .zip/.skill/.tar.gz files")
        parser.add_argument("--examples", action="store_true", help="import every bundled example skill")
        parser.add_argument("--user", help="record the import as this user (default: system)")
        parser.add_argument(
            "--git", action="append", default=[], metavar="URL", help="a git repository on an allowed host"
        )
        parser.add_argument("--ref", default="", help="with --git: a branch or tag (default: the default branch)")
        parser.add_argument("--path", default="", help="with --git: the folder holding SKILL.md (default: the root)")

    def handle(self, *args: Any, **options: Any) -> None:
        paths: list[Path | GitUrl] = [Path(p) for p in options["paths"]]
        if options["examples"]:
            paths.extend(example_folders())
        paths.extend(GitUrl(url, options["ref"], options["path"]) for url in options["git"])
        if not paths:
            raise CommandError("Name at least one path, or pass --examples or --git URL.")
        actor = self.actor(options.get("user"))
        failures = 0
        for path in paths:
            label = shown(str(path))
            try:
                result = self.import_one(path, actor)
            except ServiceError as exc:
                failures += 1
                self.stderr.write(self.style.ERROR(f"{label}: {exc.message}"))
                continue
            except Exception as exc:  # one broken path must not stop the others
                failures += 1
                self.stderr.write(self.style.ERROR(f"{label}: import failed: {type(exc).__name__}: {exc}"))
                continue
            style = self.style.SUCCESS if result.created else self.style.NOTICE
            self.stdout.write(style(f"{label}: {result.message}"))
            for issue in result.version.warnings if result.created else []:
                self.stdout.write(f"  {issue['severity']}: {issue['message']}")
        if failures:
            raise CommandError(f"{failures} of {len(paths)} path(s) were refused.")

    def actor(self, username: str | None) -> Actor:
        if not username:
            return SYSTEM
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        return Actor(user=user)

    def import_one(self, path: Path | GitUrl, actor: Actor) -> ImportResult:
        if isinstance(path, GitUrl):
            return import_from_git(path.url, path.ref, path.path, actor=actor)
        if path.is_dir():
            return import_folder(path, actor=actor, origin=f"folder {path.name}")
        if path.is_file():
            with path.open("rb") as archive:
                return import_archive(archive, path.name, actor=actor)
        raise ServiceError(f"No such file or folder: {shown(str(path))}")
