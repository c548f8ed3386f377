"""Authentication of the agent API: a space API token (`Authorization: Bearer sck_…`) for the
space the route names, and the space's request rate.

A token of another space answers 404, exactly like an unknown space: it never learns that the
space exists. A token of the space past its expiry is refused (401 token_expired), and a call
its scope does not take (`tokens.SCOPE_METHODS`) too (403 out_of_scope), through
`errors.ANSWERS`. The caller (`ApiCaller`) is what the views get: the space, and the token for
the audit trail (API calls are recorded under the token's name and its maker).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import Model
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from console.compiled import execute_planned
from console.models import Space
from console.services import Actor

from ..models import ApiToken, PlatformBackend, SandboxConfig, Session
from ..sessions.limits import check_api_rate
from .tokens import TOKEN_PREFIX, check_token_use, hash_token
from .wire import ApiError

LAST_USED_WRITE_INTERVAL = timedelta(minutes=1)


@dataclass(frozen=True)
class ApiCaller:
    space: Space
    token: ApiToken
    source_ip: str | None
    # The route's session ({key}), read with the token in the same query: None when the
    # route names none or the space has no such session (`session_named` tells which).
    session: Session | None = None
    session_key: str | None = None

    @property
    def actor(self) -> Actor:
        return Actor(user=self.token.created_by, source_ip=self.source_ip, token_name=self.token.name)

    def session_named(self, key: str) -> tuple[bool, Session | None]:
        """(read with the token?, the session or None) for the route's `key`."""
        if self.session_key is None or self.session_key != key:
            return False, None
        return True, self.session


def authenticate(
    request: HttpRequest, space_id: Any, session_key: str | None = None
) -> tuple[Space, ApiToken, Session | None]:
    """The token's space (404 for another space) and, when `session_key` is given, the
    space's session of that key (or None) in the same query."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.startswith(TOKEN_PREFIX):
        raise ApiError(401, "unauthorized", "Send 'Authorization: Bearer sck_…' with a space API token.")
    token, session = _token_and_session(hash_token(value.strip()), session_key)
    if token is None or token.revoked is not None:
        raise ApiError(401, "unauthorized", "Unknown or revoked API token.")
    if str(token.space_id) != str(space_id):
        raise ApiError(404, "not_found", "No such space.")  # never reveal another space
    now = timezone.now()
    check_token_use(token, request.method or "GET", now)
    if token.last_used is None or now - token.last_used > LAST_USED_WRITE_INTERVAL:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
    return token.space, token, session


# The token, its space and (when the route names one) the session with its config and
# platform backend: one statement, written out once here rather than compiled by the ORM
# on every API call (the ORM's select_related of the same took 1-4 ms a request to build).
_MODELS: tuple[tuple[str, type[Model]], ...] = (
    ("t", ApiToken),
    ("sp", Space),
    ("se", Session),
    ("c", SandboxConfig),
    ("b", PlatformBackend),
)


@dataclass(frozen=True)
class _Part:
    alias: str
    model: type[Model]
    attnames: list[str]
    converters: list[tuple[int, Any, list[Any]]]  # (index, column, converters) where any


@functools.cache
def _token_query(with_session: bool) -> tuple[str, list[_Part]]:
    """The statement and how to read its row (the converters the ORM would apply)."""
    quote = connection.ops.quote_name
    parts = []
    for alias, model in _MODELS if with_session else _MODELS[:2]:
        fields = model._meta.concrete_fields
        converters = []
        for index, field in enumerate(fields):
            column = field.get_col(alias)
            found = connection.ops.get_db_converters(column) + field.get_db_converters(connection)
            if found:
                converters.append((index, column, found))
        parts.append(_Part(alias, model, [f.attname for f in fields], converters))
    columns = ", ".join(f"{p.alias}.{quote(str(f.column))}" for p in parts for f in p.model._meta.concrete_fields)
    table = {alias: quote(model._meta.db_table) for alias, model in _MODELS}
    sql = f"SELECT {columns} FROM {table['t']} t JOIN {table['sp']} sp ON sp.id = t.space_id"  # noqa: S608 - quoted names; values are parameters
    if with_session:
        sql += (
            f" LEFT JOIN {table['se']} se ON se.space_id = t.space_id AND se.{quote('key')} = %s"
            f" LEFT JOIN {table['c']} c ON c.id = se.config_id"
            f" LEFT JOIN {table['b']} b ON b.id = c.backend_id"
        )
    return sql + " WHERE t.token_hash = %s", parts


def _token_and_session(token_hash: str, session_key: str | None) -> tuple[ApiToken | None, Session | None]:
    with_session = session_key is not None
    sql, parts = _token_query(with_session)
    with connection.cursor() as cursor:
        execute_planned(cursor, sql, [session_key, token_hash] if with_session else [token_hash])
        row = cursor.fetchone()
    if row is None:
        return None, None
    found: dict[str, Model | None] = {}
    start = 0
    for part in parts:
        values = list(row[start : start + len(part.attnames)])
        start += len(part.attnames)
        if values[0] is None:  # a LEFT JOIN that found nothing
            found[part.alias] = None
            continue
        for index, column, converters in part.converters:
            for converter in converters:
                values[index] = converter(values[index], column, connection)
        found[part.alias] = part.model.from_db(connection.alias, part.attnames, values)
    token, space = found["t"], found["sp"]
    assert isinstance(token, ApiToken)
    assert isinstance(space, Space)
    token.space = space
    session = found.get("se")
    if not isinstance(session, Session):
        return token, None
    config, backend = found["c"], found["b"]
    assert isinstance(config, SandboxConfig)
    assert isinstance(backend, PlatformBackend)
    config.backend = backend
    session.config, session.space = config, space
    return token, session


class SpaceToken(HttpBearer):
    """A space API token for the route's space, then the space's request rate (429)."""

    def __call__(self, request: HttpRequest) -> ApiCaller:
        match = request.resolver_match
        kwargs = match.kwargs if match else {}
        key = kwargs.get("key")
        # A NUL byte is in no key, and the database cannot compare one: no lookup here.
        key = key if isinstance(key, str) and "\x00" not in key else None
        space, token, session = authenticate(request, kwargs.get("space_id"), key)
        check_api_rate(space)
        return ApiCaller(
            space=space, token=token, source_ip=request.META.get("REMOTE_ADDR"), session=session, session_key=key
        )

    def authenticate(self, request: HttpRequest, token: str) -> ApiCaller:  # pragma: no cover - see __call__
        return self(request)


def caller(request: HttpRequest) -> ApiCaller:
    """The authenticated caller of an API view."""
    found = getattr(request, "auth", None)
    if not isinstance(found, ApiCaller):
        raise ApiError(401, "unauthorized", "Send 'Authorization: Bearer sck_…' with a space API token.")
    return found
