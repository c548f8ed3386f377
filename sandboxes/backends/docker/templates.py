"""Templates of the Docker adapter: images labelled console.kind=template (id = image tag),
built from Debian packages or a script.
"""

from __future__ import annotations

import builtins
import json
import re
from contextlib import suppress
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import docker
import docker.errors
import docker.tls

from ..base import ErrorKind, RemoteError, TemplateBuildSpec, TemplateInfo, is_snapshot_id
from ..capabilities import TemplatesCapability
from .common import (
    _TEMPLATE_NAME,
    KIND_BUILD,
    KIND_SANDBOX,
    TEMPLATE_REPOSITORY,
    _engine_call,
    _hardening,
    _parse_time,
    _snapshot_id,
    _translate,
)
from .image import (
    KIND_TEMPLATE,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_TEMPLATE_DESCRIPTION,
    LABEL_TEMPLATE_NAME,
    ImageBuildError,
    build_rootfs_image,
    template_labels,
)
from .snapshots import _real_tags, _remove_image

if TYPE_CHECKING:
    from .backend import DockerBackend


# ---------------------------------------------------------------------------------------
# Templates


class DockerTemplates(TemplatesCapability):
    """Images labelled console.kind=template; the template id is the image tag.

    Building: Debian packages -> mmdebstrap on the host (the only place with a resolver for
    deb.debian.org; sandboxes get DNS 127.0.0.1), then `docker import`. A script -> run as
    root in a build container (network none) from the base template, then `docker commit`.
    """

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def list(self) -> builtins.list[TemplateInfo]:
        with _engine_call("listing templates"):
            rows = self.backend.api.images(filters={"label": [f"{LABEL_KIND}={KIND_TEMPLATE}"]})
        # One template per name: an image tagged twice (pushed to a registry, say) is offered
        # under each. Untagged images (a staging parent, an overwritten build) are none.
        infos = [replace(self._info_from_row(row), template_id=tag) for row in rows for tag in _real_tags(row)]
        return sorted(infos, key=lambda info: info.template_id)

    @staticmethod
    def _info_from_row(row: dict[str, Any]) -> TemplateInfo:
        labels = dict(row.get("Labels") or {})
        tags = _real_tags(row)
        return TemplateInfo(
            template_id=tags[0] if tags else _snapshot_id(row["Id"]),
            name=labels.get(LABEL_TEMPLATE_NAME, ""),
            description=labels.get(LABEL_TEMPLATE_DESCRIPTION, ""),
            created_at=_parse_time(row["Created"]),
            size_bytes=row.get("Size"),
            labels=labels,
        )

    def get(self, template_id: str) -> TemplateInfo:
        if is_snapshot_id(template_id):
            raise RemoteError(ErrorKind.NOT_FOUND, f"{template_id!r} is a snapshot, not a template")
        attrs = self.backend.console_image(template_id, f"template {template_id!r}")
        if attrs["Config"]["Labels"].get(LABEL_KIND) != KIND_TEMPLATE:
            raise RemoteError(ErrorKind.NOT_FOUND, f"template {template_id!r} not found")
        row = {**attrs, "Labels": attrs["Config"]["Labels"], "Created": attrs.get("Created")}
        info = self._info_from_row(row)
        return TemplateInfo(
            template_id=template_id if ":" in template_id else info.template_id,
            name=info.name,
            description=info.description,
            created_at=info.created_at,
            size_bytes=info.size_bytes,
            labels=info.labels,
        )

    def create(self, spec: TemplateBuildSpec) -> TemplateInfo:
        if not _TEMPLATE_NAME.match(spec.name):
            raise RemoteError(ErrorKind.INVALID, "template names are lowercase letters, digits, '.', '_', '-'")
        tag = f"{TEMPLATE_REPOSITORY}/{spec.name}:latest"
        if self._exists(tag):
            raise RemoteError(ErrorKind.CONFLICT, f"template {tag} already exists")
        labels = template_labels(spec.name, spec.labels.get(LABEL_TEMPLATE_DESCRIPTION, ""), spec.labels)
        if spec.debian_packages:
            self._build_from_packages(spec, tag, labels)
        else:
            base = spec.base_template_id or self.backend.base_image
            self._build_from_script(self.backend.resolve_image(base), spec.script, tag, labels)
        return self.get(tag)

    def _exists(self, tag: str) -> bool:
        try:
            with _engine_call(f"template {tag}"):
                self.backend.api.inspect_image(tag)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return False
            raise
        return True

    def _build_from_packages(self, spec: TemplateBuildSpec, tag: str, labels: dict[str, str]) -> None:
        if spec.base_template_id not in (None, "", self.backend.base_image):
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "Debian packages can only be added to the base image (sandboxes have no "
                "resolver to reach the mirror); build from packages, then add scripts on top",
            )
        for package in spec.debian_packages:
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", package):
                raise RemoteError(ErrorKind.INVALID, f"not a Debian package name: {package!r}")
        if not spec.script:
            self._import_packages(spec, tag, labels)
            return
        # Packages first into a staging image (kind "build", never listed), then the script.
        staging = f"{TEMPLATE_REPOSITORY}/{spec.name}-packages:latest"
        image_id = self._import_packages(spec, staging, {**labels, LABEL_KIND: KIND_BUILD})
        try:
            self._build_from_script(image_id, spec.script, tag, labels)
        finally:
            # Untag only: the template is its child, and the engine removes the untagged
            # parent together with the template later.
            with suppress(RemoteError), _engine_call("untagging the staging image"):
                self.backend.api.remove_image(staging)

    def _import_packages(self, spec: TemplateBuildSpec, tag: str, labels: dict[str, str]) -> str:
        try:
            return build_rootfs_image(
                self.backend.client,
                tag,
                packages=spec.debian_packages,
                labels=labels,
                space=self.backend.disk.build_space(),
            )
        except ImageBuildError as exc:
            raise RemoteError(ErrorKind.INVALID, f"building template {spec.name}: {exc}") from exc
        except docker.errors.DockerException as exc:
            raise _translate(exc, f"importing template {spec.name}") from exc

    def _build_from_script(self, image: str, script: str, tag: str, labels: dict[str, str]) -> None:
        api = self.backend.api
        build_labels = {**labels, LABEL_MANAGED: "1", LABEL_KIND: KIND_BUILD}
        with _engine_call("creating the build container"):
            container_id = api.create_container(
                image,
                labels=build_labels,
                host_config=api.create_host_config(
                    network_mode="none",
                    dns=["127.0.0.1"],
                    # Where the engine can: the build's writable layer bounded like a build's disk.
                    storage_opt=self.backend.disk.build_storage_opt(),
                    **_hardening(),
                ),
            )["Id"]
        try:
            with _engine_call("starting the build container"):
                api.start(container_id)
            if script:
                result = self.backend.engine.run(
                    container_id,
                    ("/bin/bash", "-euc", script),
                    user="root",
                    timeout_s=1800,
                    max_output_bytes=65536,
                )
                if result.exit_code != 0:
                    detail = (result.stderr or result.stdout)[-2000:].decode(errors="replace")
                    raise RemoteError(ErrorKind.INVALID, f"template script failed ({result.exit_code}): {detail}")
            repository, _, version = tag.rpartition(":")
            changes = [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in labels.items()]
            with _engine_call("committing the template"):
                api.commit(container_id, repository=repository, tag=version, changes=changes)
        finally:
            with suppress(RemoteError), _engine_call("removing the build container"):
                api.remove_container(container_id, force=True)

    def delete(self, template_id: str) -> None:
        """Idempotent; conflict while any console sandbox (running or idle) uses it."""
        try:
            attrs = self.get(template_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        image_id = self.backend.resolve_image(attrs.template_id)
        with _engine_call("sandboxes using the template"):
            users = self.backend.api.containers(
                all=True, filters={"ancestor": image_id, "label": f"{LABEL_KIND}={KIND_SANDBOX}"}
            )
        if users:
            raise RemoteError(
                ErrorKind.CONFLICT,
                f"template {template_id} is used by {len(users)} sandbox(es); delete them first",
            )
        _remove_image(self.backend, image_id, f"template {template_id}")
