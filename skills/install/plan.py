"""The plan of a skill-image build: what one build does (`BuildPlan`), for an install
(`plan_install`: the current generation plus the skill) or an uninstall (`plan_uninstall`),
with each skill's payload and the config's package sources. Read by `install.build`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings

from console.models import Space
from sandboxes.catalog.bridge import config_fingerprint
from sandboxes.models import SandboxConfig, SessionImage

from ..images import current_image
from ..models import SkillImage, SkillImageAction, SkillVersion
from .packages import PackageSources
from .steps import SkillPayload, StepFailed

FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class Reporter(Protocol):
    """What a build reports to: a job context in the console, print in the benchmark."""

    def log(self, message: str) -> None: ...

    def progress(self, percent: int, message: str | None = None) -> None: ...


@dataclass
class BuildPlan:
    """What one build does: start from `base_template`, copy `add`, keep `keep` in the ledger."""

    action: SkillImageAction
    subject: str
    base_template: str
    parent: SkillImage | None
    add: list[SkillPayload]
    keep: list[dict[str, Any]]  # manifest entries carried over from the parent
    removed: list[str] = field(default_factory=list)
    # The pointer when the build was planned: recording refuses if it moved meanwhile.
    pointer_at_start: str | None = None


def payload_for(version: SkillVersion) -> SkillPayload:
    from ..services import version_files

    return SkillPayload(
        name=version.skill.name,
        version_id=str(version.pk),
        content_hash=version.content_hash,
        files=tuple((f.path, f.mode, f.data) for f in version_files(version)),
        dependencies=version.dependencies or {},
        metadata=version.metadata or {},
    )


def package_sources(config: SandboxConfig) -> PackageSources:
    """The package sources of the config's platform backend."""
    backend = config.backend
    return PackageSources(
        pip_index_url=backend.pip_index_url.strip(),
        pip_folder=source_folder(backend.pip_find_links, "the pip find-links folder"),
        npm_registry_url=backend.npm_registry_url.strip(),
        npm_folder=source_folder(backend.npm_folder, "the npm tarball folder"),
        apt_folder=source_folder(backend.apt_folder, "the apt repository folder"),
        apt_url=backend.apt_url.strip(),
        apt_suite=" ".join(backend.apt_suite.split()),
        apt_trusted=backend.apt_trusted,
    )


def source_folder(name: str, what: str) -> Path | None:
    """A package source folder: a plain name of a folder under the package sources root."""
    name = name.strip()
    if not name:
        return None
    root = Path(settings.SKILL_PACKAGE_SOURCES_ROOT).resolve()
    candidate = (root / name).resolve()
    if not FOLDER_NAME.match(name) or candidate.parent != root or not candidate.is_dir():
        raise StepFailed("dependencies", f"{what} {name!r} is not a folder under SKILL_PACKAGE_SOURCES_ROOT")
    return candidate


def pointer_snapshot(space: Space, config: SandboxConfig) -> str | None:
    return SessionImage.objects.filter(space=space, config=config).values_list("snapshot_id", flat=True).first()


def plan_install(space: Space, config: SandboxConfig, version: SkillVersion, reporter: Reporter) -> BuildPlan:
    pointer = pointer_snapshot(space, config)  # read first: a move after this is caught at record
    plan = _plan_install(space, config, version, reporter)
    plan.pointer_at_start = pointer
    return plan


def _plan_install(space: Space, config: SandboxConfig, version: SkillVersion, reporter: Reporter) -> BuildPlan:
    current = current_image(space, config)
    payload = payload_for(version)
    if current is not None and current.fingerprint == config_fingerprint(config):
        keep = [entry for entry in current.manifest if entry.get("name") != payload.name]
        return BuildPlan(
            SkillImageAction.INSTALL,
            f"{payload.name} @ {version.short_hash}",
            current.snapshot_id,
            current,
            [payload],
            keep,
        )
    if current is not None:
        reporter.log(
            f"generation {current.generation} belongs to another backend account; building from the default template"
        )
    return BuildPlan(
        SkillImageAction.INSTALL, f"{payload.name} @ {version.short_hash}", config.default_template, None, [payload], []
    )


def plan_uninstall(space: Space, config: SandboxConfig, skill_name: str) -> BuildPlan:
    current = current_image(space, config)
    if current is None or skill_name not in current.skill_names:
        raise StepFailed("create", f"{skill_name} is not in the current skill image")
    payloads = []
    for entry in current.manifest:
        if entry.get("name") == skill_name:
            continue
        version = SkillVersion.objects.select_related("skill").filter(pk=entry.get("version_id")).first()
        if version is None:
            raise StepFailed(
                "copy",
                f"version {str(entry.get('content_hash', ''))[:12]} of {entry.get('name')} is no longer in the "
                "catalog, so the image cannot be rebuilt without it; import it again first",
            )
        payloads.append(payload_for(version))
    return BuildPlan(
        SkillImageAction.UNINSTALL,
        skill_name,
        config.default_template,
        current,
        payloads,
        [],
        removed=[skill_name],
        pointer_at_start=current.snapshot_id,
    )
