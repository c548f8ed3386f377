"""Template helpers shared by every app."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()


@register.simple_tag
def render_value(value: Any) -> str:
    """A job result value as HTML: lists of objects become tables, the rest plain text."""
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        # PostgreSQL's jsonb does not keep key order: lead with the naming columns.
        columns = sorted(dict.fromkeys(key for item in value for key in item), key=_column_rank)
        head = format_html_join("", "<th>{}</th>", ((result_label(column),) for column in columns))
        rows = format_html_join(
            "",
            "<tr>{}</tr>",
            ((format_html_join("", "<td>{}</td>", ((_cell(item.get(c)),) for c in columns)),) for item in value),
        )
        return format_html(
            '<table class="list compact"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>', head, rows
        )
    if isinstance(value, list):
        return format_html_join(", ", "{}", ((_cell(item),) for item in value)) or "—"
    if isinstance(value, dict):
        return counts_summary(value) if _all_counts(value) else _pairs(value)
    return _cell(value)


@register.filter
def result_summary(result: Any) -> str:
    """One line for a job list: its counts when it has them, else whether it went well."""
    if not isinstance(result, dict):
        return ""
    counts = result.get("summary")
    if isinstance(counts, dict) and _all_counts(counts):
        return counts_summary(counts)
    if isinstance(result.get("ok"), bool):
        return "ok" if result["ok"] else "not ok"
    steps = result.get("steps")
    if isinstance(steps, list) and steps and all(isinstance(step, dict) for step in steps):
        passed = sum(1 for step in steps if step.get("ok"))
        return f"{passed} of {len(steps)} steps ok"
    return ""


@register.filter
def result_label(key: str) -> str:
    """A result key for people: "cleanup_errors" reads "Cleanup errors", "ms" "Time (ms)"."""
    if str(key) in RESULT_WORDS:
        return RESULT_WORDS[str(key)]
    text = str(key).replace("_", " ").strip()
    return text[:1].upper() + text[1:]


@register.filter
def counts_summary(value: Any) -> str:
    """Counts for people: {'pass': 8, 'fail': 0, 'unsupported': 0} reads
    "8 passed · 0 failed · 0 unsupported"; anything else as plain text."""
    if not isinstance(value, dict) or not _all_counts(value):
        return _cell(value)
    ordered = sorted(value.items(), key=lambda item: _count_rank(item[0]))
    return " · ".join(f"{count} {COUNT_WORDS.get(key, result_label(key).lower())}" for key, count in ordered)


RESULT_WORDS = {"ms": "Time (ms)", "ok": "OK", "s": "Time (s)", "id": "Id"}
# Words for the status counts handlers report (the verify job's pass/fail/unsupported).
COUNT_WORDS = {"pass": "passed", "fail": "failed", "ok": "ok", "error": "errors"}
COUNT_ORDER = ("pass", "ok", "fail", "error")


def _count_rank(key: str) -> tuple[int, str]:
    return (COUNT_ORDER.index(key), "") if key in COUNT_ORDER else (len(COUNT_ORDER), key)


def _all_counts(value: dict[Any, Any]) -> bool:
    return bool(value) and all(isinstance(v, int) and not isinstance(v, bool) for v in value.values())


def _pairs(value: dict[Any, Any]) -> str:
    if not value:
        return "—"
    return format_html_join(" · ", "{}: {}", ((result_label(k), _cell(v)) for k, v in sorted(value.items())))


@register.filter
def job_label(kind: str) -> str:
    """The registered label of a job kind ("Test connection" for sandboxes.test_connection)."""
    from console.jobs import job_label as label_of

    return label_of(kind)


LEADING_COLUMNS = ("name", "title", "status", "ok")


def _column_rank(column: str) -> tuple[int, str]:
    return (LEADING_COLUMNS.index(column), "") if column in LEADING_COLUMNS else (len(LEADING_COLUMNS), column)


def _cell(value: Any) -> str:
    if value is True:
        return "✓"
    if value is False:
        return "✗"
    if value is None:
        return "—"
    if isinstance(value, str | datetime) and as_moment(value) is not None:
        return when(value, "seconds")
    return str(value)


@register.filter(is_safe=True)
def when(value: Any, precision: str = "minutes") -> str:
    """**The** way a page shows a moment: `<time datetime>` reading "2026-12-01 20:52 UTC".

    static/js/console.js turns the text into "3 min ago" and the title into the reader's own
    zone; without JavaScript the text stays readable UTC with its zone. Takes a datetime or an
    ISO 8601 string (binding records, job results) or a unix time; anything else comes back as it was, and
    nothing (None, "") as "" so `|default:"never"` still works. `precision` "seconds" adds
    them; "date" shows the day only."""
    moment = as_moment(value)
    if moment is None:
        return "" if value is None or value == "" else str(value)  # escaped on output: not safe
    utc = moment.astimezone(UTC)
    shown = {"seconds": "%Y-%m-%d %H:%M:%S UTC", "date": "%Y-%m-%d"}.get(precision, "%Y-%m-%d %H:%M UTC")
    return format_html(
        '<time class="when" datetime="{}" title="{}">{}</time>',
        utc.isoformat(timespec="seconds").replace("+00:00", "Z"),
        utc.strftime("%Y-%m-%d %H:%M:%S UTC"),
        utc.strftime(shown),
    )


def as_moment(value: Any) -> datetime | None:
    """A timezone-aware datetime from a datetime, an ISO 8601 string (naive means UTC) or a
    positive unix time in seconds (a backend's reading)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 1e11:
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str) and ISO_MOMENT.match(value):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


ISO_MOMENT = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$")
