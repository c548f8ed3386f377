"""Writes on a session that are not its sandbox's lifecycle: its labels and how long the idle
sweep leaves it running ("keep awake"). Each is audited as `session.update`; the lifecycle
(pause, resume, rebuild, delete) stays in `runtime.py` and `teardown.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from console.models import AuditAction
from console.services import Actor, ServiceError, record_audit

from ..models import Session
from .labels import parse_labels, stored

MAX_KEEP_AWAKE = timedelta(hours=24)


def do_set_session_labels(
    session: Session, labels: str | Iterable[str] | Callable[[list[str]], Iterable[str]], *, actor: Actor
) -> list[str]:
    """Replace the session's labels (checked by `labels.parse_labels`); returns them.

    `labels` may instead be a function of the labels the session holds (a merge): it is given
    them as read under the row's lock, so two merges at once both count, neither overwriting
    the other with what it read before the other wrote."""
    with transaction.atomic():
        held = Session.objects.select_for_update().filter(pk=session.pk).values_list("labels", flat=True).first()
        if held is None:
            raise ServiceError(f"Session {session.key!r} was deleted meanwhile; its labels were not changed.")
        session.labels = held
        before = session.label_list
        checked = parse_labels(labels(before) if callable(labels) else labels)
        session.labels = stored(checked)
        Session.objects.filter(pk=session.pk).update(labels=session.labels)
        _audit_update(session, actor, {"labels": checked, "labels_before": before})
    return checked


def do_keep_session_awake(session: Session, until: datetime | None, *, actor: Actor) -> datetime | None:
    """Let the idle sweep leave the session running until `until` (None: back to its
    config's idle timeout). At most `MAX_KEEP_AWAKE` ahead; a time past is refused."""
    now = timezone.now()
    if until is not None and until <= now:
        raise ServiceError("Choose a time in the future.", field_errors={"keep_awake": ["That time has passed."]})
    if until is not None and until - now > MAX_KEEP_AWAKE:
        hours = int(MAX_KEEP_AWAKE.total_seconds() // 3600)
        raise ServiceError(
            f"A session is kept awake for at most {hours} hours.",
            field_errors={"keep_awake": [f"At most {hours} hours ahead."]},
        )
    with transaction.atomic():
        session.keep_awake_until = until
        Session.objects.filter(pk=session.pk).update(keep_awake_until=until)
        _audit_update(session, actor, {"keep_awake_until": until.isoformat() if until else None})
    return until


def _audit_update(session: Session, actor: Actor, details: dict[str, Any]) -> None:
    record_audit(
        actor,
        AuditAction.SESSION_UPDATE,
        space=session.space,
        target_type="session",
        target_id=session.id,
        target_name=session.key,
        details=details,
    )
