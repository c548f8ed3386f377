"""Session labels: what a label may be, how a set of them is stored on `Session.labels`, and
the list's filter on one.

A label is short text without spaces (`nightly`, `team=ml`, `ticket:4711`); a session holds at
most `MAX_LABELS`. They are stored as one string padded with spaces (" nightly team=ml "), so
"has label x" is `labels LIKE '% x %'` on every database and the list reads them with its row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from django.db.models import Q

from console.services import ServiceError

MAX_LABELS = 16
MAX_LENGTH = 63
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=/-]{0,62}")
RULE = f"letters, digits and . _ : = / - (starting with a letter or digit), at most {MAX_LENGTH} characters"


class InvalidLabels(ServiceError):
    """Labels that break the rule above; the message names the first bad one."""


def parse_labels(value: str | Iterable[str]) -> list[str]:
    """The labels of `value` (a list, or text separated by spaces or commas), checked, without
    duplicates, in their first order; `InvalidLabels` names the first that breaks the rule.

    Reading stops at the first label too many: a list as long as a request body may carry
    costs no more than one that fits."""
    items = (match.group() for match in re.finditer(r"[^\s,]+", value)) if isinstance(value, str) else value
    labels: list[str] = []
    seen: set[str] = set()
    for item in items:
        if not isinstance(item, str):
            raise InvalidLabels("Each label must be a string.")
        label = item.strip()
        if not label:
            continue
        if not LABEL.fullmatch(label):
            raise InvalidLabels(f"Label {label[:80]!r} is not allowed: use {RULE}.")
        if label not in seen:
            if len(labels) == MAX_LABELS:
                raise InvalidLabels(f"At most {MAX_LABELS} labels per session (more given).")
            seen.add(label)
            labels.append(label)
    return labels


def stored(labels: Iterable[str]) -> str:
    """The column's value for checked `labels` ("" for none)."""
    joined = " ".join(labels)
    return f" {joined} " if joined else ""


def has_label(label: str) -> Q:
    """Sessions that carry `label` (an invalid one matches nothing)."""
    if not LABEL.fullmatch(label):
        return Q(pk__in=[])
    return Q(labels__contains=f" {label} ")
