"""Series read from the database at scrape time (console.metrics.DatabaseGauge): sessions by
state and backend, open terminals. Registered by sandboxes/apps.py."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Count

from console.metrics import DatabaseGauge

from ..models import Session, Terminal


def _sessions() -> Iterable[tuple[dict[str, str], float]]:
    rows = Session.objects.values("state", "config__backend__kind", "config__backend__name").annotate(n=Count("pk"))
    for row in rows.order_by():
        labels = {
            "state": row["state"],
            "backend_kind": row["config__backend__kind"],
            "backend": row["config__backend__name"],
        }
        yield labels, float(row["n"])


def _open_terminals() -> Iterable[tuple[dict[str, str], float]]:
    yield {}, float(Terminal.objects.filter(opened__isnull=False, closed__isnull=True).count())


SESSIONS = DatabaseGauge(
    "sandbox_sessions",
    "Sessions by state (as last seen) and platform backend.",
    ["state", "backend_kind", "backend"],
    _sessions,
)
OPEN_TERMINALS = DatabaseGauge("sandbox_terminals_open", "Web terminals whose shell is open.", [], _open_terminals)
