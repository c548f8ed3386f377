"""Listing Docker sandboxes: `list` of the contract, one page per engine call filtered by label
and state, resumed after the previous page's rows (the page tokens of `common`), and the
row -> `SandboxInfo` mapping (a part of `DockerBackend`).

May import: the standard library, docker-py, `..base` and `.common`; nothing of the project.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from ..base import ErrorKind, ListQuery, Page, RemoteError, SandboxInfo, SandboxState
from .common import (
    _STATES,
    KIND_SANDBOX,
    LABEL_META_PREFIX,
    LABEL_TEMPLATE,
    _Cursor,
    _decode_token,
    _encode_token,
    _engine_call,
    _explanation,
    _parse_time,
    metadata_from_labels,
)
from .image import LABEL_KIND, LABEL_MANAGED

if TYPE_CHECKING:
    from .engine import DockerEngine


class DockerListing:
    """`list` of the contract and the engine's container rows as `SandboxInfo` (a part of
    `DockerBackend`; receives the engine)."""

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def list(self, query: ListQuery) -> Page:
        """One page, newest first, filtered by the engine; the token names where the next starts.

        The engine filters by label and state and stops after `limit + 1` rows, so a page costs
        the same however many sandboxes exist; `before=<id>` resumes right after a row of the
        previous page (the engine's own order, creation time to the nanosecond).
        """
        if query.limit <= 0:
            raise RemoteError(ErrorKind.INVALID, "limit must be positive")
        cursor = _decode_token(query.page_token) if query.page_token else None
        filters = self._list_filters(query)
        rows = self._rows_after(cursor, filters, query.limit + 1) if cursor else self._rows(filters, query.limit + 1)
        consumed = rows[: query.limit]
        page = [row for row in consumed if self._row_matches(row, query)]
        next_token = _encode_token(consumed) if len(rows) > query.limit else None
        return Page(items=tuple(self._info_from_row(row) for row in page), next_token=next_token)

    def _list_filters(self, query: ListQuery) -> dict[str, builtins.list[str]]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SANDBOX}"]
        labels += [f"{LABEL_META_PREFIX}{key}={value}" for key, value in query.metadata.items()]
        filters = {"label": labels}
        if query.states:
            filters["status"] = sorted(status for status, state in _STATES.items() if state in query.states)
        return filters

    def _rows(self, filters: Mapping[str, Any], limit: int | None) -> builtins.list[dict[str, Any]]:
        with _engine_call("listing sandboxes"):
            rows: builtins.list[dict[str, Any]] = self.engine.api.containers(
                all=True, filters=dict(filters), limit=limit if limit is not None else -1
            )
        return rows

    def _rows_after(self, cursor: _Cursor, filters: Mapping[str, Any], limit: int) -> builtins.list[dict[str, Any]]:
        # The newest anchor still there marks the position; anchors newer than it are gone, so
        # nothing the previous page returned comes back. Each deleted row costs one refused
        # call at most once, which keeps a listing linear even while the reaper deletes.
        for anchor in cursor.anchors:
            with _engine_call("listing sandboxes"):
                try:
                    rows: builtins.list[dict[str, Any]] = self.engine.api.containers(
                        all=True, filters={**filters, "before": [anchor]}, limit=limit
                    )
                    return rows
                except docker.errors.APIError as exc:
                    # An anchor deleted since: Docker 20.10 answers 500 for it, later ones 404.
                    if exc.status_code != 404 and "no such container" not in _explanation(exc).lower():
                        raise
        # Every anchor is gone: fall back to creation seconds. Rows of that second not among the
        # anchors may come again (a repeat, never a skip).
        rows = [
            row
            for row in self._rows(filters, None)
            if row["Created"] < cursor.created or (row["Created"] == cursor.created and row["Id"] not in cursor.anchors)
        ]
        return rows[:limit]

    def _row_matches(self, row: dict[str, Any], query: ListQuery) -> bool:
        if query.states and _STATES.get(row["State"], SandboxState.GONE) not in query.states:
            return False
        # The engine matched the labels; the key list says which of them are the sandbox's own.
        metadata = metadata_from_labels(row.get("Labels") or {})
        return all(metadata.get(key) == value for key, value in query.metadata.items())

    def _info_from_row(self, row: dict[str, Any]) -> SandboxInfo:
        labels = row.get("Labels") or {}
        return SandboxInfo(
            sandbox_id=row["Id"],
            state=_STATES.get(row["State"], SandboxState.GONE),
            template_id=labels.get(LABEL_TEMPLATE, ""),
            metadata=metadata_from_labels(labels),
            started_at=_parse_time(int(row["Created"])),
        )
