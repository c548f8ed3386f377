"""Snapshots and templates of an E2B account through the control plane."""

from __future__ import annotations

import builtins
import re
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, RemoteError, SnapshotInfo, TemplateBuildSpec, TemplateInfo, is_snapshot_id
from ..capabilities import SnapshotsCapability, TemplatesCapability
from .common import SLOW_REQUEST_TIMEOUT_S, _q, parse_time, translating

if TYPE_CHECKING:
    from .backend import E2BBackend


# ---------------------------------------------------------------------------------------
# Snapshots, templates, inbound


class E2BSnapshots(SnapshotsCapability):
    """`POST /sandboxes/{id}/snapshots`, `GET /snapshots`, `DELETE /templates/{snapshot id}`.
    E2B snapshot ids (`team/name:tag`) are presented as `snap-<id>`."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        # Names are unique per team: suffix one so repeated names never collide.
        unique = f"{_slug(name) or 'snapshot'}-{secrets.token_hex(4)}"
        response = self.backend._api(
            "POST",
            f"/sandboxes/{_q(sandbox_id)}/snapshots",
            f"snapshotting sandbox {sandbox_id}",
            idempotent=False,
            json={"name": unique},
            timeout=SLOW_REQUEST_TIMEOUT_S,
        )
        info = self.backend._snapshot_info(response.json(), source=sandbox_id, name=name or unique)
        self.backend._verify_snapshot(info)
        return info

    def list(self) -> builtins.list[SnapshotInfo]:
        return self.backend.snapshot_infos()

    def delete(self, snapshot_id: str) -> None:
        raw = self.backend._raw_snapshot_id(snapshot_id) if is_snapshot_id(snapshot_id) else snapshot_id
        try:
            self.backend._api(
                "DELETE",
                f"/templates/{_q(raw)}",
                f"deleting snapshot {snapshot_id}",
                idempotent=True,
                timeout=SLOW_REQUEST_TIMEOUT_S,
            )
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40]


class E2BTemplates(TemplatesCapability):
    """`GET /v2/templates` minus every snapshot (the spec does not promise they are apart).
    E2B templates are built with E2B's own build system: create/delete are unsupported."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def list(self) -> builtins.list[TemplateInfo]:
        rows = self.backend.paged_rows("/v2/templates", "listing templates")
        snapshots = {self.backend._raw_snapshot_id(s.snapshot_id) for s in self.backend.snapshot_infos()}
        infos = [_e2b_template(row) for row in rows if str(row.get("templateID")) not in snapshots]
        infos = [info for info in infos if not (set(info.labels.get("names", "").split(",")) & snapshots)]
        return sorted(infos, key=lambda info: info.template_id)

    def get(self, template_id: str) -> TemplateInfo:
        if is_snapshot_id(template_id):
            raise RemoteError(ErrorKind.NOT_FOUND, f"{template_id!r} is a snapshot, not a template")
        response = self.backend._api("GET", f"/templates/{_q(template_id)}", f"template {template_id}", idempotent=True)
        return _e2b_template(response.json())

    def create(self, spec: TemplateBuildSpec) -> TemplateInfo:
        raise RemoteError(ErrorKind.UNSUPPORTED, "E2B templates are built with the E2B CLI or SDK, not the console")

    def delete(self, template_id: str) -> None:
        raise RemoteError(ErrorKind.UNSUPPORTED, "E2B templates are deleted with the E2B CLI or dashboard")


def _e2b_template(row: Mapping[str, Any]) -> TemplateInfo:
    names = [str(n) for n in (row.get("names") or row.get("aliases") or [])]
    return TemplateInfo(
        template_id=str(row["templateID"]),
        name=names[0] if names else str(row["templateID"]),
        created_at=parse_time(row.get("createdAt")),
        size_bytes=int(row["diskSizeMB"]) * 1024 * 1024 if row.get("diskSizeMB") else None,
        labels={"names": ",".join(names)} if names else {},
    )


translating(E2BSnapshots, "create", "list", "delete")
translating(E2BTemplates, "list", "get", "create", "delete")
