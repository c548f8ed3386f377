"""Finding a session row by its key, or creating it on the space's default config.

The warm path of every agent call starts here: one query for the session, its config and the
config's platform backend.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.utils import timezone

from console.compiled import Compiled
from console.models import AdminJob, AuditAction, JobStatus, Space
from console.services import SYSTEM, Actor, ServiceError, record_audit

from ..models import SandboxConfig, Session
from .labels import stored
from .limits import check_live_sessions

# --- Sessions ---------------------------------------------------------------------------


def default_config(space: Space) -> SandboxConfig:
    """The space's default config (else its oldest), with its platform backend."""
    rows = SandboxConfig.objects.select_related("backend")
    config = rows.filter(space=space, is_default=True).first()
    if config is None:
        config = rows.filter(space=space).order_by("created").first()
    if config is None:
        raise ServiceError(f"Space {space.name} has no sandbox config: create one first.")
    return config


SESSION_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def check_session_key(key: str) -> None:
    if not SESSION_KEY.fullmatch(key):  # `$` alone would let a trailing newline through
        raise ServiceError(
            "A session key is 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit.",
            field_errors={"key": ["invalid session key"]},
        )


# Compiled once per connection (console/compiled.py): 0.51 ms against 1.13 ms for the
# same `select_related(...).get()` compiled at each call (2026-12-02, PostgreSQL).
_ROWS = Session.objects.select_related("config__backend")
_BY_KEY = Compiled(_ROWS, "space_id", "key")


def session_by_key(space: Space, key: str) -> Session | None:
    """The space's session with this key, its config and backend, or None (one query)."""
    return _BY_KEY.first(space.pk, key)


@functools.cache
def _by_key_with(columns: tuple[tuple[str, str], ...]) -> Compiled[Session]:
    return Compiled(_ROWS, "space_id", "key", columns=dict(columns))


@dataclass(frozen=True)
class SessionRow:
    """`session_by_key(space, key)` as a session store's `read_session_with` runs it beside its
    own read. A store in the session's own database reads its columns in the same statement
    (`with_columns`): one round trip for the session, its binding and its turn lease."""

    space: Space
    key: str
    db: str = DEFAULT_DB_ALIAS

    def __call__(self) -> Session | None:
        return session_by_key(self.space, self.key)

    def with_columns(self, columns: Mapping[str, str], params: Sequence[object]) -> tuple[Session | None, list[object]]:
        """The session (None if there is none) and the values of `columns` (SQL expressions
        whose `%s` take `params`) read with it; the columns are not left on the session."""
        session = _by_key_with(tuple(columns.items())).first(self.space.pk, self.key, column_params=params)
        if session is None:
            return None, []
        return session, [vars(session).pop(name) for name in columns]


class BeingDeleted(ServiceError):
    """The space or config is being torn down (`sessions.teardown`): no new session on it."""


# The teardown jobs' kinds (`sessions.teardown`, which builds on this module).
TEARDOWN_KINDS = {"sandboxes.teardown_space": "space", "sandboxes.teardown_config": "config"}


def refuse_while_deleted(space: Space, config: SandboxConfig) -> None:
    """Only when a session row is about to be created (never on the warm path)."""
    running = AdminJob.objects.filter(
        kind__in=list(TEARDOWN_KINDS),
        params__target__in=[str(space.pk), str(config.pk)],
        status__in=[JobStatus.QUEUED, JobStatus.RUNNING],
    ).values_list("kind", flat=True)
    kind = next(iter(running), None)
    if kind is not None:
        raise BeingDeleted(f"This {TEARDOWN_KINDS[kind]} is being deleted: no new session starts on it.")


def get_or_create_session(space: Space, key: str, **options: Any) -> Session:
    """The space's session `key`, made by `create_session(space, key, **options)` when new."""
    check_session_key(key)
    # The warm path: the space is at hand already, so join only the config.
    session = session_by_key(space, key)
    if session is not None:
        session.space = space
        return session
    return create_session(space, key, **options)


def create_session(
    space: Space,
    key: str,
    *,
    config: SandboxConfig | None = None,
    actor: Actor = SYSTEM,
    labels: Sequence[str] = (),
    active: bool = False,
) -> Session:
    """A new session `key` (the caller found none), or the one a racing caller created first.
    The row written is the row returned (its config and space attached): no read after it.
    `active`: the caller resolves it now, so the row is written as active already."""
    check_session_key(key)
    config = config or default_config(space)
    try:
        with transaction.atomic():
            check_live_sessions(space)  # locks the space's limits row until the commit
            refuse_while_deleted(space, config)
            session = Session.objects.create(
                space=space,
                key=key,
                config=config,
                labels=stored(labels),
                last_activity=timezone.now() if active else None,
            )
            record_audit(
                actor,
                AuditAction.SESSION_CREATE,
                space=space,
                target_type="session",
                target_id=session.id,
                target_name=session.key,
                details={"key": key, "config": config.name, **({"labels": list(labels)} if labels else {})},
            )
    except IntegrityError:
        # Another process created it first.
        return Session.objects.select_related("config__backend", "space").get(space=space, key=key)
    return session
