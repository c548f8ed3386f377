"""Finding a session row by its key, or creating it on the space's default config.

The warm path of every agent call starts here: one query, compiled once per thread.
"""

from __future__ import annotations

import re
import threading
from contextvars import ContextVar
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models.sql.compiler import SQLCompiler

from console.models import Space
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


class _CompiledSessionQuery:
    """`Session.objects.select_related("config__backend").get(space=..., key=...)`, compiled once per thread.

    Django compiles a queryset to SQL each time it runs; on the warm resolve path that compilation
    cost more than the query's round trip (bench/session_resolve.py). The SQL never changes, so
    each thread compiles it once and afterwards only binds the two parameters. Rows still pass
    through the compiler's converters and become instances through `from_db`, as in the ORM.
    """

    _SENTINEL_KEY = "\x00session-key"
    _SENTINEL_SPACE = "00000000-0000-0000-0000-000000000000"

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.session_fields = [f.attname for f in Session._meta.concrete_fields]
        self.config_fields = [f.attname for f in SandboxConfig._meta.concrete_fields]
        self.backend_fields = [f.attname for f in PlatformBackend._meta.concrete_fields]
        columns = [
            *self.session_fields,
            *(f"config__{name}" for name in self.config_fields),
            *(f"config__backend__{name}" for name in self.backend_fields),
        ]
        # No ORDER BY: (space, key) is unique, and the model's default ordering would sort.
        query = Session.objects.filter(space_id=self._SENTINEL_SPACE, key=self._SENTINEL_KEY).order_by()
        self.compiler: SQLCompiler = query.values_list(*columns).query.get_compiler(alias)
        self.sql, params = self.compiler.as_sql()
        selected = [column[0] for column in self.compiler.select[: self.compiler.col_count]]
        self.converters = self.compiler.get_converters(selected)
        self.space_param = self._space_param(self._SENTINEL_SPACE)
        # The compiler orders parameters as it likes (key before space, today); map each slot.
        self.slots = ["key" if p == self._SENTINEL_KEY else "space" if p == self.space_param else "?" for p in params]
        if sorted(self.slots) != ["key", "space"]:
            raise RuntimeError(f"unexpected parameters in the compiled session query: {params!r}")

    def _space_param(self, space_id: object) -> object:
        return Session._meta.get_field("space").get_db_prep_value(space_id, connections[self.alias])

    def get(self, space_id: object, key: str) -> Session | None:
        values: dict[str, Any] = {"key": key, "space": self._space_param(space_id)}
        with connections[self.alias].cursor() as cursor:
            cursor.execute(self.sql, [values[slot] for slot in self.slots])
            rows = cursor.fetchall()
        if not rows:
            return None
        row, split = rows[0], len(self.session_fields)
        if self.converters:
            row = next(iter(self.compiler.apply_converters([row], self.converters)))
        session = Session.from_db(self.alias, self.session_fields, row[:split])
        backend_at = split + len(self.config_fields)
        session.config = SandboxConfig.from_db(self.alias, self.config_fields, row[split:backend_at])
        session.config.backend = PlatformBackend.from_db(self.alias, self.backend_fields, row[backend_at:])
        return session


_compiled_queries = threading.local()


def session_by_key(space: Space, key: str) -> Session | None:
    """The space's session with this key and its config, or None (one query, no compilation)."""
    compiled: _CompiledSessionQuery | None = getattr(_compiled_queries, "session", None)
    if compiled is None:
        compiled = _compiled_queries.session = _CompiledSessionQuery(DEFAULT_DB_ALIAS)
    return compiled.get(space.pk, key)


# The id of the session the current call (an API request) works on, so an error can tell a
# session deleted under the call from one with its key made anew since (sandboxes.api.views).
call_session: ContextVar[Any] = ContextVar("call_session", default=None)


def get_or_create_session(
    space: Space, key: str, *, config: SandboxConfig | None = None, actor: Actor = SYSTEM
) -> Session:
    check_session_key(key)
    # The warm path: the space is at hand already, so join only the config.
    session = session_by_key(space, key)
    if session is not None:
        session.space = space
        call_session.set(session.pk)
        return session
    config = config or default_config(space)
    try:
        with transaction.atomic():
            check_live_sessions(space)  # locks the space's limits row until the commit
            session = Session.objects.create(space=space, key=key, config=config)
            record_audit(
                actor,
                "session.create",
                space=space,
                target_type="session",
                target_id=session.id,
                details={"key": key, "config": config.name},
            )
    except IntegrityError:
        pass  # another process created it first
    session = Session.objects.select_related("config__backend", "space").get(space=space, key=key)
    call_session.set(session.pk)
    return session
