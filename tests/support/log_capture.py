"""The `captured` fixture: every log record of a test, as production formats it.

Registered for every test in tests/conftest.py; tests annotate it with `Captured`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from console.logs import RedactFilter, RequestIdFilter, logging_config


class Captured(logging.Handler):
    """Every record from the root logger at DEBUG, filtered and formatted as production does (JSON)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        config = logging_config(log_format="json", level="DEBUG")
        formatter_spec = dict(config["formatters"]["main"])
        factory = formatter_spec.pop("()")
        from django.utils.module_loading import import_string

        self.setFormatter(import_string(factory)(**formatter_spec))
        self.addFilter(RequestIdFilter())
        self.addFilter(RedactFilter())
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def captured() -> Iterator[Captured]:
    """A Captured handler on the root logger, at DEBUG, for the test; the level is restored."""
    handler = Captured()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
