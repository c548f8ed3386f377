"""The egress log: refused attempts read back from every platform backend with
`egress()` (a cursor per backend), mapped to space and session (or a skill build's job) by
sandbox id, bounded per session (network.log_max_per_session). The retention pass
(sandboxes.sessions.retention) deletes rows past retention.egress_events_days.

Periodic (console/periodic.py): `ingest_refusals`.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import DateTimeField, Q, QuerySet, UUIDField

from console.keyset import KeyPart, Keyset
from console.models import AdminJob, Space
from console.periodic import periodic

from ..backends.base import RemoteError
from ..backends.capabilities import EgressRefusal
from ..catalog.bridge import get_backend
from ..models import EgressCursor, EgressEvent, PlatformBackend, SandboxConfig, Session, WatchedSandbox
from .tuning import NETWORK

logger = logging.getLogger(__name__)
MAX_PER_READ = 5000
# The Egress page's keyset order (console.keyset): newest first, held whole by
# EgressEvent.Meta.indexes behind the space, the space and layer, and the session.
EGRESS_ORDER = Keyset((KeyPart("time", DateTimeField()), KeyPart("id", UUIDField())))


def watch_build_sandbox(sandbox_id: str, *, space: Space, job: AdminJob | None) -> None:
    """A skill build's sandbox: its refusals are logged against its job (and space)."""
    WatchedSandbox.objects.update_or_create(sandbox_id=sandbox_id, defaults={"space": space, "job": job})


def _owners(backend: PlatformBackend, sandbox_ids: set[str]) -> dict[str, tuple[Any, Any, Any]]:
    """sandbox id -> (space id, session id | None, job id | None) on this platform backend."""
    owners: dict[str, tuple[Any, Any, Any]] = {}
    for sandbox_id, space_id, session_id in Session.objects.filter(
        config__backend=backend, sandbox_id__in=sandbox_ids
    ).values_list("sandbox_id", "space_id", "id"):
        owners[sandbox_id] = (space_id, session_id, None)
    for sandbox_id, space_id, job_id in WatchedSandbox.objects.filter(
        sandbox_id__in=sandbox_ids - set(owners)
    ).values_list("sandbox_id", "space_id", "job_id"):
        owners[sandbox_id] = (space_id, None, job_id)
    return owners


def record_refusals(backend: PlatformBackend, refusals: list[EgressRefusal]) -> int:
    """Rows for the refusals whose sandbox is known; returns how many were recorded."""
    owners = _owners(backend, {r.sandbox_id for r in refusals})
    rows = [
        EgressEvent(
            time=r.at,
            space_id=owners[r.sandbox_id][0],
            session_id=owners[r.sandbox_id][1],
            job_id=owners[r.sandbox_id][2],
            sandbox_id=r.sandbox_id[:128],
            layer=r.layer[:16],
            destination=r.destination[:500],
            rule=r.rule[:300],
            detail=r.detail[:500],
        )
        for r in refusals
        if r.sandbox_id in owners
    ][-MAX_PER_READ:]
    EgressEvent.objects.bulk_create(rows)
    for session_id in {row.session_id for row in rows if row.session_id is not None}:
        trim_session(session_id)
    return len(rows)


def newest_per_sandbox(refusals: list[EgressRefusal], keep: int) -> list[EgressRefusal]:
    """At most `keep` refusals of each sandbox, its newest (the log keeps no more of a
    session anyway), in their order: one sandbox flooding refusals never crowds the others
    out of a read, nor a skill build's rows (no session to trim) past the bound."""
    counts: dict[str, int] = {}
    kept: list[EgressRefusal] = []
    for refusal in reversed(refusals):
        seen = counts.get(refusal.sandbox_id, 0)
        if seen < keep:
            counts[refusal.sandbox_id] = seen + 1
            kept.append(refusal)
    kept.reverse()
    return kept


def trim_session(session_id: Any) -> None:
    """Keep the newest network.log_max_per_session rows of a session."""
    keep = NETWORK.log_max_per_session
    rows = EgressEvent.objects.filter(session_id=session_id)
    extra = list(rows.order_by("-time", "-id").values_list("id", flat=True)[keep:])
    if extra:
        EgressEvent.objects.filter(id__in=extra).delete()


def ingest_backend(backend: PlatformBackend) -> int:
    """Read one platform backend's new refusals (from its stored cursor) and record them."""
    config = (
        SandboxConfig.objects.filter(backend=backend).select_related("backend", "space").order_by("created").first()
    )
    if config is None:
        return 0
    adapter = get_backend(config)
    egress = adapter.egress()
    if egress is None:
        return 0
    stored = EgressCursor.objects.filter(backend=backend).first()
    cursor = stored.cursor if stored is not None else ""
    refusals, next_cursor = egress.refusals(cursor)
    with transaction.atomic():
        recorded = record_refusals(backend, newest_per_sandbox(refusals, NETWORK.log_max_per_session))
        EgressCursor.objects.update_or_create(backend=backend, defaults={"cursor": next_cursor})
    return recorded


# The egress component's upkeep (Docker: pruning, deny-name refresh, resolver restarts, log
# rotation, released networks' leftovers); never a side effect of reading refusals.
@periodic("egress-housekeeping", task="sandboxes.egress_housekeeping", every=60)
def egress_housekeeping() -> list[str]:
    """The periodic upkeep of every platform backend's egress (`EgressCapability.housekeeping`:
    the Docker host's leftovers pruned, denied names refreshed, resolvers restarted, logs
    rotated), one log line each; never part of reading refusals. Audit-free: it changes no
    record of ours."""
    lines = []
    for backend in PlatformBackend.objects.all():
        config = SandboxConfig.objects.filter(backend=backend).select_related("backend", "space").first()
        if config is None:
            continue
        try:
            egress = get_backend(config).egress()
            if egress is None:
                continue
            line = f"{backend}: {egress.housekeeping()}"
        except RemoteError as exc:
            line = f"{backend}: egress housekeeping failed: {exc}"
        logger.info("%s", line)
        lines.append(line)
    return lines


@periodic("egress-ingest", task="sandboxes.egress_ingest", every=lambda: NETWORK.ingest_interval_s)
def ingest_refusals() -> int:
    """Every platform backend's new refusals; a backend that fails is retried next time."""
    total = 0
    for backend in PlatformBackend.objects.all():
        try:
            total += ingest_backend(backend)
        except RemoteError as exc:
            logger.warning("reading refusals of %s failed: %s", backend, exc)
    return total


def events_for_space(space: Space, *, filters: dict[str, Any] | None = None) -> QuerySet[EgressEvent]:
    """The space's rows, newest first, narrowed by session, layer, destination text and time."""
    rows = EgressEvent.objects.filter(space=space).select_related("session", "job")
    filters = filters or {}
    if filters.get("session"):
        rows = rows.filter(session=filters["session"])
    if filters.get("layer"):
        rows = rows.filter(layer=filters["layer"])
    if filters.get("destination"):
        rows = rows.filter(Q(destination__icontains=filters["destination"]))
    if filters.get("since"):
        rows = rows.filter(time__gte=filters["since"])
    if filters.get("until"):
        rows = rows.filter(time__lte=filters["until"])
    return rows
