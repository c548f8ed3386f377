"""Control characters in what a skill brings: the one rule for every name and frontmatter field.

A control character (C0, DEL or C1) corrupts wherever the text is shown: an ESC sequence
repaints an admin's terminal, a newline forges a log line, a carriage return overwrites one.
A name is held to more: Unicode's format characters (a bidi override that shows `run\\u202egnp.sh`
as `runhs.png`, zero-width spaces and joiners, a byte order mark) and its line and paragraph
separators make a name read as another, so they are refused in names too. So a name holding one
(an archive member, the uploaded file, a folder, the skill's `name`) is refused, and the refusal
shows it escaped (`escaped`, `shown`), never raw. Free text in the frontmatter (a description)
may hold tabs and line breaks, and no C0/C1 control. Names are compared composed (NFC, `same_key`):
`caf\\u00e9` and `cafe\\u0301` are one name. Pure: no ORM.
"""

from __future__ import annotations

import re
import unicodedata

# C0 (U+0000-U+001F) less tab and newline, which multi-line text keeps, DEL (U+007F), C1
# (U+0080-U+009F), and lone surrogates (a YAML escape such as "\\ud800" makes one): no UTF-8
# text, nor PostgreSQL, can hold them.
TEXT_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
# Unicode categories a name may not hold: controls, format characters, line/paragraph
# separators, and lone surrogates.
NAME_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _name_control(text: str) -> str | None:
    return next((char for char in text if unicodedata.category(char) in NAME_CATEGORIES), None)


def control_in(text: str, *, multiline: bool = False) -> str | None:
    """The first control character in `text`, or None. A name (the default) refuses format
    characters and separators too; `multiline` text allows tab and newline among C0/C1."""
    if multiline:
        found = TEXT_CONTROL.search(text)
        return found.group() if found else None
    return _name_control(text)


def escaped(char: str) -> str:
    """A character as Python writes it in a string literal: `\\n`, `\\x1b`, `\\x9b`, `\\u202e`."""
    return repr(char)[1:-1]


def control_problem(text: str, *, multiline: bool = False) -> str:
    """'contains a control character (\\x1b)' for `text` holding one, or ''."""
    char = control_in(text, multiline=multiline)
    return f"contains a control character ({escaped(char)})" if char is not None else ""


def same_key(name: str) -> str:
    """The name as compared: composed (NFC), so one name in two Unicode forms is one name."""
    return unicodedata.normalize("NFC", name)


def shown(name: str) -> str:
    """A name as text safe to print: bytes that are not UTF-8 (surrogate-escaped) shown as
    \\xNN, control and format characters as `\\n`, `\\x1b`, `\\u202e`..."""
    return "".join(_shown_char(char) for char in name)


def _shown_char(char: str) -> str:
    if "\udc80" <= char <= "\udcff":  # a byte that was not UTF-8, as surrogateescape keeps it
        return f"\\x{ord(char) - 0xDC00:02x}"
    return escaped(char) if unicodedata.category(char) in NAME_CATEGORIES else char
