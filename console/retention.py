"""Retention of the console app's records: audit events and finished jobs older than their
setting are deleted by a periodic pass (the pass itself is `sandboxes.sessions.retention`,
which also prunes session records; docs/operations.md, "Retention").

A setting of 0 days keeps those rows forever. Audit rows of things still live are kept past
the setting (the caller names them: a terminal's `terminal.open` while it is open). Deletes
run in batches by primary key so a first pass over years of rows never holds one long
transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.utils import timezone

from .jobs import housekeeping_kinds
from .models import FINISHED_JOB_STATUSES, AdminJob, AuditEvent
from .tuning import RETENTION


def retention_days(name: str) -> int:
    """Days to keep rows of kind `name` (tuning retention.<name>_days); 0 = forever."""
    return max(int(getattr(RETENTION, f"{name}_days", 0) or 0), 0)


def cutoff_for(name: str, now: datetime | None = None) -> datetime | None:
    days = retention_days(name)
    return None if days == 0 else (now or timezone.now()) - timedelta(days=days)


def delete_in_batches(queryset: models.QuerySet[Any], *, batch: int | None = None) -> int:
    """Delete every row of `queryset`, `batch` primary keys per transaction. Returns the count
    of rows of the queryset's own model deleted (cascades are not counted)."""
    size = batch or int(RETENTION.batch)
    model = queryset.model
    total = 0
    while True:
        keys = list(queryset.order_by("pk").values_list("pk", flat=True)[:size])
        if not keys:
            return total
        with transaction.atomic():
            _, per_model = model._default_manager.filter(pk__in=keys).delete()
        total += per_model.get(model._meta.label, 0)
        if len(keys) < size:
            return total


def prune_console_records(now: datetime | None = None, *, keep_audit: Collection[int] = ()) -> dict[str, int]:
    """Audit events and finished jobs past their retention. Housekeeping jobs (reaper passes)
    have their own, shorter retention and are pruned by their own pass. `keep_audit`: audit
    rows past their retention that still describe something live (the caller, which knows
    what they describe, says which: the open of a terminal still open)."""
    deleted: dict[str, int] = {}
    audit_cutoff = cutoff_for("audit_events", now)
    if audit_cutoff is not None:
        aged = AuditEvent.objects.filter(time__lt=audit_cutoff)
        deleted["audit_events"] = delete_in_batches(aged.exclude(pk__in=list(keep_audit)) if keep_audit else aged)
    jobs_cutoff = cutoff_for("jobs", now)
    if jobs_cutoff is not None:
        finished = AdminJob.objects.filter(status__in=FINISHED_JOB_STATUSES)
        old = finished.filter(
            models.Q(finished__lt=jobs_cutoff) | models.Q(finished__isnull=True, created__lt=jobs_cutoff)
        ).exclude(kind__in=housekeeping_kinds())
        deleted["jobs"] = delete_in_batches(old)
    return deleted
