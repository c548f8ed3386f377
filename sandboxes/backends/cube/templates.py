"""Cube's snapshots and templates: the E2B snapshots with Cube's ids, templates built from an
OCI image.
"""

from __future__ import annotations

import builtins
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..base import ErrorKind, RemoteError, TemplateBuildSpec, TemplateInfo, is_snapshot_id
from ..capabilities import TemplatesCapability
from ..e2b.common import _q, parse_time, translating
from ..e2b.snapshots import E2BSnapshots, _slug
from .common import TEMPLATE_BUILD_DEADLINE_S

if TYPE_CHECKING:
    from .backend import CubeBackend


class CubeSnapshots(E2BSnapshots):
    """Cube snapshots (v0.3.0 and later): `snap-…` ids, deleted through `DELETE /templates/{id}`."""


class CubeTemplates(TemplatesCapability):
    """Cube's template API. A template is built from an OCI image: `labels["image"]` or
    `base_template_id` names it; Debian packages and scripts are not Cube's way."""

    def __init__(self, backend: CubeBackend) -> None:
        self.backend = backend

    def list(self) -> builtins.list[TemplateInfo]:
        response = self.backend._api("GET", "/templates", "listing templates", idempotent=True)
        snapshots: set[str] = set()
        capability = self.backend.snapshots()
        if capability is not None:
            snapshots = {s.snapshot_id for s in capability.list()}
        infos = [
            _cube_template(row)
            for row in response.json()
            if not is_snapshot_id(str(row.get("templateID"))) and str(row.get("templateID")) not in snapshots
        ]
        return sorted(infos, key=lambda info: info.template_id)

    def get(self, template_id: str) -> TemplateInfo:
        if is_snapshot_id(template_id):
            raise RemoteError(ErrorKind.NOT_FOUND, f"{template_id!r} is a snapshot, not a template")
        response = self.backend._api("GET", f"/templates/{_q(template_id)}", f"template {template_id}", idempotent=True)
        return _cube_template(response.json())

    def create(self, spec: TemplateBuildSpec) -> TemplateInfo:
        if spec.debian_packages or spec.script:
            raise RemoteError(
                ErrorKind.UNSUPPORTED, "Cube builds templates from an image; packages and scripts belong in the image"
            )
        image = spec.labels.get("image") or spec.base_template_id
        if not image:
            raise RemoteError(ErrorKind.INVALID, "name the image to build from (labels['image'])")
        body: dict[str, Any] = {
            "image": image,
            "name": spec.name,
            # Every Cube template must run envd on 49983 (bring-your-own-image guide).
            "exposedPorts": [49983],
            "probePort": 49983,
            "writableLayerSize": writable_layer_size(spec),
        }
        if self.backend.known_release().template_id_required:
            # v0.2.2: the caller names the template (models CreateTemplateRequest: templateID
            # required); later releases mint `tpl-…` when none is given.
            body["templateID"] = f"tpl-{_slug(spec.name) or 'template'}-{secrets.token_hex(4)}"
        response = self.backend._api(
            "POST", "/templates", f"creating template {spec.name}", idempotent=False, json=body
        )
        template_id = str(response.json()["templateID"])
        return self._wait_ready(template_id)

    def _wait_ready(self, template_id: str) -> TemplateInfo:
        deadline = time.monotonic() + TEMPLATE_BUILD_DEADLINE_S
        delay = 0.5
        while True:
            response = self.backend._api(
                "GET", f"/templates/{_q(template_id)}", f"template {template_id}", idempotent=True
            )
            row = response.json()
            status = str(row.get("status") or "").upper()
            if status == "READY":
                return _cube_template(row)
            if status in ("FAILED", "ERROR"):
                raise RemoteError(ErrorKind.INVALID, f"template {template_id} failed: {row.get('lastError') or status}")
            if time.monotonic() > deadline:
                raise RemoteError(ErrorKind.TIMEOUT, f"template {template_id} still {status} after the build deadline")
            self.backend.sleep(delay)
            delay = min(delay * 2, 10.0)

    def delete(self, template_id: str) -> None:
        """Idempotent; conflict while sandboxes run from it (Cube would delete its snapshots)."""
        users = [
            row
            for row in self.backend._api(
                "GET", "/v2/sandboxes", "sandboxes using the template", idempotent=True, params={"limit": 1000}
            ).json()
            if row.get("templateID") == template_id
        ]
        if users:
            raise RemoteError(ErrorKind.CONFLICT, f"template {template_id} is used by {len(users)} sandbox(es)")
        try:
            self.backend._api(
                "DELETE", f"/templates/{_q(template_id)}", f"deleting template {template_id}", idempotent=True
            )
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise


def _cube_template(row: Mapping[str, Any]) -> TemplateInfo:
    # TemplateSummary.aliases (CubeAPI models @08f2f5d7, v0.6.0); `names` as E2B has it.
    names = [str(n) for n in (row.get("aliases") or row.get("names") or [])]
    request = row.get("createRequest") or {}
    name = names[0] if names else str(request.get("name") or request.get("alias") or row["templateID"])
    labels = {
        key: str(row[key]) for key in ("status", "instanceType", "version", "imageInfo") if row.get(key) is not None
    }
    return TemplateInfo(
        template_id=str(row["templateID"]),
        name=name,
        description=str(row.get("imageInfo") or ""),
        created_at=parse_time(row.get("createdAt")),
        labels=labels,
    )


translating(CubeTemplates, "list", "get", "create", "delete")


def writable_layer_size(spec: TemplateBuildSpec) -> str:
    """The template's disk as Cube's quantity ("1G", "1536M"): the build's disk_mb (the
    config's disk limit), else an explicit label, else Cube's usual 1G."""
    if spec.disk_mb:
        return f"{spec.disk_mb // 1024}G" if spec.disk_mb % 1024 == 0 else f"{spec.disk_mb}M"
    return spec.labels.get("writableLayerSize", "1G")
