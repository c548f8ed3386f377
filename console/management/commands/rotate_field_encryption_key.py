"""Re-encrypt every stored secret with FIELD_ENCRYPTION_KEY (key rotation, docs/operations.md).

Rotation: generate a new key, set FIELD_ENCRYPTION_KEY to the new key then the old one
(comma-separated), restart, run this command, then drop the old key. Exits non-zero
when a stored secret could be read with none of the keys (it is left unchanged).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.services import SYSTEM, do_rotate_field_encryption


class Command(BaseCommand):
    help = "Re-encrypt stored secrets with FIELD_ENCRYPTION_KEY's first key (reading its old keys too)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--legacy-secret-key",
            action="append",
            default=[],
            help="Also read secrets encrypted with the key earlier consoles derived from this SECRET_KEY "
            "(when FIELD_ENCRYPTION_KEY was unset). May be given more than once.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = do_rotate_field_encryption(actor=SYSTEM, legacy_secret_keys=tuple(options["legacy_secret_key"]))
        self.stdout.write(f"Re-encrypted {report.rotated} stored secret(s) with FIELD_ENCRYPTION_KEY.")
        if report.unreadable:
            raise CommandError(
                f"{len(report.unreadable)} stored secret(s) could not be read with any configured key and were "
                "left unchanged: " + ", ".join(report.unreadable) + ". Add the key they were encrypted with after "
                "the first one in FIELD_ENCRYPTION_KEY, or enter those secrets again."
            )
