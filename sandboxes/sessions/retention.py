"""The retention pass: a periodic housekeeping job that deletes records past their retention
setting — the console app's (audit events, finished jobs: `console.retention`) and the
sessions' (closed terminals, finished background commands, collected artifacts with their
stored files). Live things are never touched: an open terminal, a running command, or an
artifact of a turn younger than the setting stays whatever its age; so does the open audit
of a terminal still open (or closed within the setting: its open and close go together).

Tuning: retention.<kind>_days (0 = keep forever), retention.batch,
retention.interval_s (docs/operations.md, "Retention").
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from console.jobs import JobContext, job_handler, prune_housekeeping_jobs, start_job
from console.models import AuditAction, AuditEvent
from console.periodic import periodic
from console.retention import cutoff_for, delete_in_batches, prune_console_records
from console.services import SYSTEM, record_audit
from console.tuning import RETENTION

from ..models import Artifact, BackgroundCommand, CommandStatus, EgressEvent, Terminal, WatchedSandbox

logger = logging.getLogger(__name__)
KIND = "sandboxes.retention"


def prune_artifacts(cutoff: datetime) -> int:
    """Artifacts collected before `cutoff`: rows and their stored files (a file that is already
    gone is fine; a row whose file cannot be removed is kept, to be tried again next pass)."""
    deleted = 0
    while True:
        batch = list(Artifact.objects.filter(created__lt=cutoff).order_by("pk")[:200])
        if not batch:
            return deleted
        removable = []
        for artifact in batch:
            try:
                if artifact.file.name:
                    artifact.file.storage.delete(artifact.file.name)
            except OSError as exc:
                logger.warning("retention: artifact %s file not removed: %s", artifact.pk, exc)
                continue
            removable.append(artifact.pk)
        if not removable:
            return deleted
        deleted += Artifact.objects.filter(pk__in=removable).delete()[1].get(Artifact._meta.label, 0)


def prune_session_records(now: datetime | None = None) -> dict[str, int]:
    deleted: dict[str, int] = {}
    terminals = cutoff_for("terminals", now)
    if terminals is not None:
        deleted["terminals"] = delete_in_batches(Terminal.objects.filter(closed__lt=terminals))
    commands = cutoff_for("commands", now)
    if commands is not None:
        old = BackgroundCommand.objects.exclude(status=CommandStatus.RUNNING).filter(
            Q(finished__lt=commands) | Q(finished__isnull=True, started__lt=commands)
        )
        deleted["commands"] = delete_in_batches(old)
    artifacts = cutoff_for("artifacts", now)
    if artifacts is not None:
        deleted["artifacts"] = prune_artifacts(artifacts)
    egress = cutoff_for("egress_events", now)
    if egress is not None:
        deleted["egress_events"] = delete_in_batches(EgressEvent.objects.filter(time__lt=egress))
        # Skill-build sandboxes watched for refusals live as long as a build: days are plenty.
        delete_in_batches(WatchedSandbox.objects.filter(created__lt=egress))
    return deleted


def live_terminal_audits(cutoff: datetime) -> list[int]:
    """The `terminal.open` audit rows past `cutoff` to keep: their terminal is still open, or
    its `terminal.close` row is younger than the cutoff (so the pair goes together, even
    after the closed terminal's own row was pruned). An open is only ever pruned with its
    close: the audit log never shows a close without its open, nor loses the open of a
    shell still running."""
    kept: list[int] = []
    old = AuditEvent.objects.filter(action="terminal.open", target_type="terminal", time__lt=cutoff)
    batch: dict[str, list[int]] = {}

    def check() -> None:
        ids = {target_id: uuid.UUID(target_id) for target_id in batch}
        still_open = {
            str(pk)
            for pk in Terminal.objects.filter(pk__in=ids.values(), closed__isnull=True).values_list("pk", flat=True)
        }
        recent_close = AuditEvent.objects.filter(
            action="terminal.close", target_type="terminal", target_id__in=list(batch), time__gte=cutoff
        )
        live = still_open | set(recent_close.values_list("target_id", flat=True))
        for target_id in live:
            kept.extend(batch.get(target_id, ()))
        batch.clear()

    for pk, target_id in old.order_by("pk").values_list("pk", "target_id").iterator(chunk_size=500):
        try:
            uuid.UUID(target_id)
        except ValueError:
            continue  # not a terminal's id: nothing live to keep it for
        batch.setdefault(target_id, []).append(pk)
        if len(batch) >= 500:
            check()
    if batch:
        check()
    return kept


def apply_retention(now: datetime | None = None) -> dict[str, int]:
    """One pass over every kind; audited when anything was deleted. One `now` for every step:
    the open audits kept and the audit rows deleted are judged by the same cutoff."""
    now = now or timezone.now()
    audit_cutoff = cutoff_for("audit_events", now)
    keep = live_terminal_audits(audit_cutoff) if audit_cutoff is not None else []
    deleted = {**prune_console_records(now, keep_audit=keep), **prune_session_records(now)}
    if any(deleted.values()):
        record_audit(SYSTEM, AuditAction.RETENTION_PRUNE, target_type="retention", details={"deleted": deleted})
    return deleted


@job_handler(KIND, label="Retention pass", housekeeping=True)
def retention_pass(ctx: JobContext) -> dict[str, Any]:
    deleted = apply_retention()
    ctx.log(
        "deleted " + ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in deleted.items())
        if any(deleted.values())
        else "nothing past its retention"
    )
    prune_housekeeping_jobs(KIND)
    return {"deleted": deleted}


@periodic("retention", task="sandboxes.retention_pass", every=lambda: RETENTION.interval_s)
def start_retention_pass() -> None:
    """The periodic entry point: one housekeeping job per pass."""
    start_job(KIND, actor=SYSTEM)
