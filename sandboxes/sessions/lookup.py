"""Finding a session row by its key, or creating it on the space's default config.

The warm path of every agent call starts here: one query, its SQL written once per database
from the models' `_meta` (public Django APIs only).
"""

# ruff: noqa: S608 - the only interpolations are quoted table/column names; values are parameters

from __future__ import annotations

import re
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Field, Model

from console.models import AdminJob, AuditAction, JobStatus, Space
from console.services import SYSTEM, Actor, ServiceError, record_audit

from ..models import PlatformBackend, SandboxConfig, Session
from .limits import check_live_sessions

# --- Sessions ---------------------------------------------------------------------------


def default_config(space: Space) -> SandboxConfig:
    config = SandboxConfig.objects.filter(space=space, is_default=True).first()
    if config is None:
        config = SandboxConfig.objects.filter(space=space).order_by("created").first()
    if config is None:
        raise ServiceError(f"Space {space.name} has no sandbox config: create one first.")
    return config


SESSION_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def check_session_key(key: str) -> None:
    if not SESSION_KEY.match(key):
        raise ServiceError(
            "A session key is 1-128 letters, digits, '.', '_', ':' or '-', starting with a letter or digit.",
            field_errors={"key": ["invalid session key"]},
        )


def _columns(model: type[Model]) -> list[Field[Any, Any]]:
    """The model's fields that are a column of its table, in the order `Model.from_db` takes
    them: the forward fields `_meta.get_fields()` lists with `concrete` set, less the many-to-many
    fields (concrete too, but their column is in the through table)."""
    return [f for f in model._meta.get_fields() if f.concrete and not f.many_to_many]


class _SessionQuery:
    """`Session.objects.select_related("config__backend").get(space=..., key=...)` as SQL written once.

    Django compiles a queryset to SQL each time it runs; on the warm resolve path that compilation
    cost more than the query's round trip (bench/session_resolve.py). So the SELECT is written once
    per database from the models' documented `_meta` (table and column names, quoted by the
    connection), run on `connection.cursor()`, and each row becomes instances through the
    documented `Model.from_db`, as the ORM makes them. No ordering (space and key are unique), no
    locking (the ORM query had none), the database the router gives for reading sessions.

    Only on PostgreSQL, whose driver returns every column of these models as its Python value
    already; elsewhere (SQLite, where decimals, UUIDs and times need Django's converters)
    `session_by_key` runs the queryset itself.
    """

    def __init__(self, alias: str) -> None:
        self.alias = alias
        quote = connections[alias].ops.quote_name
        models: tuple[type[Model], ...] = (Session, SandboxConfig, PlatformBackend)
        if any(hasattr(f, "from_db_value") for model in models for f in _columns(model)):
            raise RuntimeError("a field with from_db_value needs its conversion: read it through the ORM")
        self.fields = [[f.attname for f in _columns(model)] for model in models]

        def column(model: type[Model], name: str | None = None) -> str:
            field = model._meta.pk if name is None else model._meta.get_field(name)
            return f"{quote(model._meta.db_table)}.{quote(str(field.column))}"  # type: ignore[union-attr]

        selected = ", ".join(column(model, f.name) for model in models for f in _columns(model))
        self.sql = (
            f"SELECT {selected} FROM {quote(Session._meta.db_table)}"
            f" INNER JOIN {quote(SandboxConfig._meta.db_table)}"
            f" ON {column(Session, 'config')} = {column(SandboxConfig)}"
            f" INNER JOIN {quote(PlatformBackend._meta.db_table)}"
            f" ON {column(SandboxConfig, 'backend')} = {column(PlatformBackend)}"
            f" WHERE {column(Session, 'space')} = %s AND {column(Session, 'key')} = %s"
        )
        self.space_field = Session._meta.get_field("space")

    def get(self, space_id: object, key: str) -> Session | None:
        connection = connections[self.alias]
        space_param = self.space_field.get_db_prep_value(space_id, connection)
        with connection.cursor() as cursor:
            cursor.execute(self.sql, [space_param, key])
            row = cursor.fetchone()
        if row is None:
            return None
        session_fields, config_fields, backend_fields = self.fields
        split, backend_at = len(session_fields), len(session_fields) + len(config_fields)
        session = Session.from_db(self.alias, session_fields, row[:split])
        session.config = SandboxConfig.from_db(self.alias, config_fields, row[split:backend_at])
        session.config.backend = PlatformBackend.from_db(self.alias, backend_fields, row[backend_at:])
        return session


_session_queries: dict[str, _SessionQuery] = {}


def session_by_key(space: Space, key: str) -> Session | None:
    """The space's session with this key, its config and backend, or None (one query)."""
    alias = router.db_for_read(Session)
    query = _session_queries.get(alias)
    if query is None:
        if connections[alias].vendor != "postgresql":
            try:
                return Session.objects.using(alias).select_related("config__backend").get(space_id=space.pk, key=key)
            except Session.DoesNotExist:
                return None
        query = _session_queries[alias] = _SessionQuery(alias)
    return query.get(space.pk, key)


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


def get_or_create_session(
    space: Space, key: str, *, config: SandboxConfig | None = None, actor: Actor = SYSTEM
) -> Session:
    check_session_key(key)
    # The warm path: the space is at hand already, so join only the config.
    session = session_by_key(space, key)
    if session is not None:
        session.space = space
        return session
    config = config or default_config(space)
    try:
        with transaction.atomic():
            check_live_sessions(space)  # locks the space's limits row until the commit
            refuse_while_deleted(space, config)
            session = Session.objects.create(space=space, key=key, config=config)
            record_audit(
                actor,
                AuditAction.SESSION_CREATE,
                space=space,
                target_type="session",
                target_id=session.id,
                target_name=session.key,
                details={"key": key, "config": config.name},
            )
    except IntegrityError:
        pass  # another process created it first
    session = Session.objects.select_related("config__backend", "space").get(space=space, key=key)
    return session
