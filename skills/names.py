"""Control characters in what a skill brings: the one rule for every name and frontmatter field.

A control character (C0, DEL or C1) corrupts wherever the text is shown: an ESC sequence
repaints an admin's terminal, a newline forges a log line, a carriage return overwrites one.
So a name holding one (an archive member, the uploaded file, a folder, the skill's `name`) is
refused, and the refusal shows it escaped (`escaped`, `shown`), never raw. Free text in the
frontmatter (a description) may hold tabs and line breaks, and nothing else. Pure: no ORM.
"""

from __future__ import annotations

import re

# C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F).
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# The same less tab and newline, which multi-line text keeps.
TEXT_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def control_in(text: str, *, multiline: bool = False) -> str | None:
    """The first control character in `text` (tab and newline allowed when `multiline`), or None."""
    found = (TEXT_CONTROL if multiline else CONTROL).search(text)
    return found.group() if found else None


def escaped(char: str) -> str:
    """A character as Python writes it in a string literal: `\\n`, `\\x1b`, `\\x9b`."""
    return repr(char)[1:-1]


def control_problem(text: str, *, multiline: bool = False) -> str:
    """'contains a control character (\\x1b)' for `text` holding one, or ''."""
    char = control_in(text, multiline=multiline)
    return f"contains a control character ({escaped(char)})" if char is not None else ""


def shown(name: str) -> str:
    """A name as text safe to print: bytes that are not UTF-8 (surrogate-escaped) shown as
    \\xNN, control characters as `\\n`, `\\x1b`..."""
    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return CONTROL.sub(lambda found: escaped(found.group()), text)
