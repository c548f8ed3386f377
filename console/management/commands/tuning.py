"""`manage.py tuning`: every tuning knob with its default and the value in force;
`manage.py tuning room.knob` prints that one value (scripts/start.sh reads the shutdown grace)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console.tuning import discover, knobs


class Command(BaseCommand):
    help = "List the tuning knobs (CONSOLE_TUNING overrides them), or print one knob's value."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("key", nargs="?", help="room.knob: print only its value")

    def handle(self, *args: Any, **options: Any) -> None:
        rooms = discover()
        if options["key"]:
            name, _, field = options["key"].partition(".")
            if options["key"] not in {knob.key for knob in knobs()}:
                raise CommandError(f"no tuning knob {options['key']!r}")
            value = getattr(rooms[name], field)
            self.stdout.write(str(value).lower() if isinstance(value, bool) else str(value))
            return
        overridden = settings.TUNING
        for knob in knobs():
            name, _, field = knob.key.partition(".")
            value = getattr(rooms[name], field)
            mark = "  (CONSOLE_TUNING)" if knob.key in overridden else ""
            self.stdout.write(f"{knob.key} = {value!r}  [{knob.type.__name__}, default {knob.default!r}]{mark}")
