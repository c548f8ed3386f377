"""Writes to the skill catalog, and the read the install pipeline uses.

`do_import_skill`, `do_confirm_dependencies` and `do_delete_skill_version` each validate,
write in one transaction and record exactly one audit row. Re-importing content the catalog
already holds changes nothing and records no audit row (the result says `created=False`).

`version_files(version)` yields (path, mode, bytes) for the installer. `confirmed_needs` and
`install_needs` give the packages a version needs, by kind (the install plan's hook).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.urls import reverse
from django.utils import timezone

from console.access import spaces_for_user
from console.models import AuditAction
from console.services import Actor, ServiceError, record_audit
from sandboxes.models import SessionImage

from .archives import ArchiveError, ExtractedSkill, Limits, SkillEntry, read_archive, read_folder, shown
from .install.dependencies import DEBIAN_NAME, NPM_NAME, PIP_REQUIREMENT, find_dependencies
from .models import Skill, SkillFile, SkillImageItem, SkillImageStatus, SkillVersion
from .parsing import Issue, ParsedSkill, parse_skill_md
from .requirements_report import DEBIAN, NPM, PIP, build_report, canonical

# Files are inserted in batches so a 1000-file skill is a handful of queries; a batch also
# stops at FILE_BATCH_BYTES of content so memory stays bounded for large skills.
FILE_BATCH_SIZE = 100
FILE_BATCH_BYTES = 8 * 1024 * 1024


class SkillFileContent(NamedTuple):
    """One file as the installer copies it."""

    path: str
    mode: int
    data: bytes


@dataclass(frozen=True)
class ImportResult:
    """What an import did: `created` is False when the same content was already there."""

    version: SkillVersion
    created: bool
    new_skill: bool

    @property
    def message(self) -> str:
        name, short = self.version.skill.name, self.version.short_hash
        if not self.created:
            return f"Skill {name} version {short} is already in the catalog; nothing changed."
        if self.new_skill:
            return f"Skill {name} imported (version {short})."
        return f"Skill {name}: new version {short} imported."


def content_hash(files: list[SkillEntry]) -> str:
    """SHA-256 over the files sorted by path: each contributes its path, mode and content.

    Each field is length-prefixed (or fixed-size) so no two different trees hash alike.
    """
    digest = hashlib.sha256()
    for entry in sorted(files, key=lambda e: e.path):
        path = entry.path.encode("utf-8")
        digest.update(len(path).to_bytes(4, "big") + path)
        digest.update(entry.mode.to_bytes(4, "big"))
        digest.update(bytes.fromhex(entry.sha256))
    return digest.hexdigest()


# --- Import ------------------------------------------------------------------------------


def import_archive(fileobj: IO[bytes], filename: str, *, actor: Actor, limits: Limits | None = None) -> ImportResult:
    """Read an uploaded archive and import it. Raises ServiceError with the refusal."""
    try:
        source = read_archive(fileobj, filename, limits or Limits.from_settings())
    except ArchiveError as exc:
        raise ServiceError(exc.message) from None
    try:
        return do_import_skill(source, actor=actor, origin=f"upload {shown(os.path.basename(filename))}"[:300])
    finally:
        source.close()


def import_folder(path: str | os.PathLike[str], *, actor: Actor, origin: str = "") -> ImportResult:
    """Import a skill folder on this server (management command, bundled examples)."""
    try:
        source = read_folder(path, Limits.from_settings())
    except ArchiveError as exc:
        raise ServiceError(exc.message) from None
    try:
        return do_import_skill(source, actor=actor, origin=(origin or f"folder {shown(str(path))}")[:300])
    finally:
        source.close()


# The small original skills shipped with the console (skills/examples/README.md).
EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"


def example_folders() -> list[Path]:
    """The bundled example skills: each a folder holding SKILL.md under skills/examples/."""
    return sorted(path for path in EXAMPLES_DIR.iterdir() if (path / "SKILL.md").is_file())


@dataclass(frozen=True)
class ExamplesImport:
    """What importing the bundled examples did, per folder: a result or the refusal."""

    results: list[ImportResult]
    refused: list[tuple[str, str]]  # (folder name, why)

    @property
    def summary(self) -> str:
        created = [r.version.skill.name for r in self.results if r.created]
        present = [r.version.skill.name for r in self.results if not r.created]
        parts = []
        if created:
            parts.append(f"Imported {len(created)} example skill(s): {', '.join(created)}.")
        if present:
            parts.append(f"Already in the catalog: {', '.join(present)}.")
        if self.refused:
            parts.append("Refused: " + "; ".join(f"{name} ({why})" for name, why in self.refused) + ".")
        return " ".join(parts) or "There are no bundled examples in this installation."


def do_import_examples(*, actor: Actor) -> ExamplesImport:
    """Import every bundled example; each in its own transaction, so one refusal keeps the rest."""
    results: list[ImportResult] = []
    refused: list[tuple[str, str]] = []
    for folder in example_folders():
        try:
            results.append(import_folder(folder, actor=actor, origin=f"bundled example {folder.name}"))
        except ServiceError as exc:
            refused.append((folder.name, exc.message))
    return ExamplesImport(results=results, refused=refused)


def parse_source(source: ExtractedSkill) -> ParsedSkill:
    """Parse SKILL.md; raise ServiceError listing every error (with its line)."""
    skill_md = source.as_mapping()["SKILL.md"]
    parsed = parse_skill_md(skill_md, folder=source.folder_name)
    if parsed.errors:
        lines = "; ".join(f"SKILL.md {issue}" for issue in parsed.errors)
        raise ServiceError(f"The skill cannot be imported: {lines}")
    return parsed


def do_import_skill(source: ExtractedSkill, *, actor: Actor, origin: str = "", source_commit: str = "") -> ImportResult:
    """Import a read skill: a new skill, a new version of an existing one, or a no-op.

    `source_commit`: the git commit it came from (skills.sources), recorded and audited."""
    parsed = parse_source(source)
    digest = content_hash(source.files)
    existing = SkillVersion.objects.select_related("skill").filter(content_hash=digest).first()
    if existing is not None:
        return ImportResult(existing, created=False, new_skill=False)
    files = source.as_mapping()
    dependencies = find_dependencies(files, parsed.metadata)
    report = build_report(files, parsed.metadata, parsed.extra, dependencies)
    warnings = [*source.notes, *parsed.warnings, *(Issue("warning", text) for text in dependencies.warnings)]
    try:
        with transaction.atomic():
            skill, new_skill = Skill.objects.select_for_update().get_or_create(name=parsed.name)
            version = SkillVersion.objects.create(
                skill=skill,
                content_hash=digest,
                folder_name=source.folder_name[:255],
                description=parsed.description,
                license=parsed.license,
                compatibility=parsed.compatibility,
                metadata=parsed.metadata,
                allowed_tools=parsed.allowed_tools,
                extra_frontmatter=parsed.extra,
                body=parsed.body,
                warnings=[issue.as_dict() for issue in warnings],
                warning_count=sum(1 for issue in warnings if issue.severity == "warning"),
                dependencies=report.declared_plan,
                dependency_report=report.as_dict(),
                size=source.size,
                file_count=len(source.files),
                origin=origin,
                source_commit=source_commit,
                imported_by=actor.user,
                imported_by_name=actor.name,
            )
            _store_files(version, source.files)
            skill.latest_version = version
            skill.save(update_fields=["latest_version", "updated"])
            record_audit(
                actor,
                AuditAction.SKILL_IMPORT,
                target_type="skill_version",
                target_id=version.id,
                target_name=str(version),
                details={
                    "name": skill.name,
                    "content_hash": digest,
                    "new_skill": new_skill,
                    "file_count": version.file_count,
                    "size": version.size,
                    "warnings": version.warning_count,
                    "origin": origin,
                    **({"commit": source_commit} if source_commit else {}),
                    "inferred": len(version.dependency_report["inferred"]),
                },
            )
    except IntegrityError:
        # Someone imported the same content (or created the name) at the same moment.
        existing = SkillVersion.objects.select_related("skill").filter(content_hash=digest).first()
        if existing is not None:
            return ImportResult(existing, created=False, new_skill=False)
        raise ServiceError("Another import of this skill ran at the same time; try again.") from None
    return ImportResult(version, created=True, new_skill=new_skill)


def _store_files(version: SkillVersion, files: list[SkillEntry]) -> None:
    """Insert the files in batches bounded by count and bytes, reading each from the spool."""
    batch: list[SkillFile] = []
    batch_bytes = 0
    for entry in files:
        batch.append(
            SkillFile(
                version=version,
                path=entry.path,
                mode=entry.mode,
                size=entry.size,
                sha256=entry.sha256,
                is_text=entry.is_text,
                content=entry.read(),
            )
        )
        batch_bytes += entry.size
        if len(batch) >= FILE_BATCH_SIZE or batch_bytes >= FILE_BATCH_BYTES:
            SkillFile.objects.bulk_create(batch)
            batch, batch_bytes = [], 0
    if batch:
        SkillFile.objects.bulk_create(batch)


# --- Dependencies: confirming inferred needs into the install plan ------------------------


@dataclass(frozen=True)
class InstallNeeds:
    """Packages by kind: pip requirement lines, npm {"name", "version"}, Debian package names."""

    pip: list[str]
    npm: list[dict[str, str]]
    debian: list[str]


def _needs_of(plan: dict[str, Any]) -> InstallNeeds:
    return InstallNeeds(
        pip=[str(dep["requirement"]) for dep in plan.get("pip") or []],
        npm=[{"name": str(dep["name"]), "version": str(dep["version"])} for dep in plan.get("npm") or []],
        debian=[str(name) for name in plan.get("debian") or []],
    )


def confirmed_needs(version: SkillVersion) -> InstallNeeds:
    """The inferred needs an admin confirmed for this version (not the declared ones)."""
    report = version.dependency_report or {}
    keys = set((version.confirmed_dependencies or {}).get("keys") or [])
    inferred = [need for need in report.get("inferred") or [] if need.get("key") in keys]
    return _needs_of(_plan_with({"pip": [], "npm": [], "debian": []}, inferred))


def install_needs(version: SkillVersion) -> InstallNeeds:
    """Everything the install of this version installs: declared plus confirmed.

    It is `version.dependencies`, the field the install plan already reads
    (`skills.install.plan.payload_for`), so confirmed needs reach the install without it
    changing."""
    return _needs_of(version.dependencies or {})


def _plan_with(declared_plan: dict[str, Any], needs: list[dict[str, Any]]) -> dict[str, Any]:
    """The declared plan with the confirmed needs added (a need already declared is skipped)."""
    plan = {
        "pip": list(declared_plan.get("pip") or []),
        "npm": list(declared_plan.get("npm") or []),
        "debian": list(declared_plan.get("debian") or []),
    }
    have = {f"{PIP}:{canonical(PIP, str(dep['name']))}" for dep in plan["pip"]}
    have |= {f"{NPM}:{canonical(NPM, str(dep['name']))}" for dep in plan["npm"]}
    have |= {f"{DEBIAN}:{canonical(DEBIAN, str(name))}" for name in plan["debian"]}
    for need in needs:
        key, kind, name = str(need["key"]), str(need["kind"]), str(need["name"])
        if key in have:
            continue
        have.add(key)
        where = ", ".join(need.get("where") or [])[:200]
        source = f"confirmed ({'; '.join(need.get('reasons') or [])} at {where})"
        if kind == PIP:
            plan["pip"].append({"requirement": str(need["requirement"]), "name": name, "source": source})
        elif kind == NPM:
            plan["npm"].append({"name": name, "version": str(need.get("requirement") or "*"), "source": source})
        elif kind == DEBIAN:
            plan["debian"].append(name)
    return plan


def _valid_need(need: dict[str, Any]) -> bool:
    kind, name, requirement = need.get("kind"), str(need.get("name", "")), str(need.get("requirement", ""))
    if kind == PIP:
        return PIP_REQUIREMENT.match(requirement) is not None
    if kind == NPM:
        return NPM_NAME.match(name) is not None
    return kind == DEBIAN and DEBIAN_NAME.match(name) is not None


def do_confirm_dependencies(version: SkillVersion, keys: list[str], *, actor: Actor) -> bool:
    """Make `keys` (inferred needs of the report) the version's confirmed needs.

    The install plan (`version.dependencies`) becomes the declarations plus these; the skill's
    files are not touched. Returns False, with no audit row, when nothing changed. The next
    install of the version uses the new plan; images already built keep theirs."""
    with transaction.atomic():
        locked = SkillVersion.objects.select_for_update().select_related("skill").get(pk=version.pk)
        report = locked.dependency_report or {}
        inferred = {str(need["key"]): need for need in report.get("inferred") or []}
        wanted = sorted(set(keys))
        unknown = [key for key in wanted if key not in inferred]
        if unknown:
            raise ServiceError(f"Not an inferred need of this version: {', '.join(unknown)[:300]}.")
        invalid = [key for key in wanted if not _valid_need(inferred[key])]
        if invalid:
            raise ServiceError(f"Cannot be installed as named: {', '.join(invalid)[:300]}.")
        before = sorted((locked.confirmed_dependencies or {}).get("keys") or [])
        if wanted == before:
            return False
        declared_plan = report.get("declared_plan") or {}
        locked.dependencies = _plan_with(declared_plan, [inferred[key] for key in wanted])
        locked.confirmed_dependencies = {"keys": wanted, "by": actor.name, "at": timezone.now().isoformat()}
        locked.save(update_fields=["dependencies", "confirmed_dependencies"])
        record_audit(
            actor,
            AuditAction.SKILL_CONFIRM_DEPENDENCIES,
            target_type="skill_version",
            target_id=locked.id,
            target_name=str(locked),
            details={
                "name": locked.skill.name,
                "content_hash": locked.content_hash,
                "confirmed": wanted,
                "added": [key for key in wanted if key not in before],
                "removed": [key for key in before if key not in wanted],
            },
        )
    version.refresh_from_db()
    return True


# --- Delete ------------------------------------------------------------------------------


def do_delete_skill_version(version: SkillVersion, *, actor: Actor) -> Skill | None:
    """Delete one version. The skill points at its newest remaining version, or goes too.

    Returns the skill, or None when its last version was deleted with it. Refused while a
    space's current skill image holds the version: uninstalling it rebuilds the image from
    the catalog's copies of the other skills, and a rollback target keeps only its snapshot.
    """
    holders = sorted(set(current_items().filter(version=version).values_list("image__space__name", flat=True)))
    if holders:
        raise ServiceError(
            f"Version {version.short_hash} of {version.skill.name} is installed in the skill image of "
            + ", ".join(holders)
            + "; uninstall it there first."
        )
    with transaction.atomic():
        skill = Skill.objects.select_for_update().get(pk=version.skill_id)
        remaining = skill.versions.exclude(pk=version.pk).order_by("-created", "-id").first()
        record_audit(
            actor,
            AuditAction.SKILL_DELETE_VERSION,
            target_type="skill_version",
            target_id=version.id,
            target_name=str(version),
            details={"name": skill.name, "content_hash": version.content_hash, "skill_deleted": remaining is None},
        )
        if remaining is None:
            skill.delete()
            return None
        if skill.latest_version_id == version.pk:
            skill.latest_version = remaining
            skill.save(update_fields=["latest_version", "updated"])
        SkillVersion.objects.filter(pk=version.pk).delete()
    return skill


# --- Reads -------------------------------------------------------------------------------


def version_files(version: SkillVersion) -> Iterator[SkillFileContent]:
    """The files of a version, sorted by path, as (path, mode, bytes) for the installer.

    Streams one row at a time; each file's bytes are checked against its recorded SHA-256,
    so storage corruption stops an install instead of landing in an image.
    """
    rows = (
        SkillFile.objects.filter(version=version)
        .order_by("path")
        .values_list("path", "mode", "sha256", "content")
        .iterator(chunk_size=20)
    )
    for path, mode, sha256, content in rows:
        data = bytes(content)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise ServiceError(f"Stored file {path} of {version} does not match its SHA-256.")
        yield SkillFileContent(path, mode, data)


@dataclass(frozen=True)
class SpaceRef:
    """A space holding a skill, for links to its Skill image page; prints as its name."""

    id: Any
    name: str

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("skills:image_detail", kwargs={"space_id": self.id})


def current_items() -> QuerySet[SkillImageItem]:
    """Items of every current generation (one per space and config), for catalog queries.

    A read beside the writes that need it; `images` builds on this module, not the reverse."""
    pointed = SessionImage.objects.filter(
        space=OuterRef("image__space"),
        config=OuterRef("image__config"),
        snapshot_id=OuterRef("image__snapshot_id"),
        fingerprint=OuterRef("image__fingerprint"),
    )
    return SkillImageItem.objects.filter(Exists(pointed), image__status=SkillImageStatus.READY)


def spaces_with_skill(skill_ids: list[object], *, user: Any = None) -> dict[object, list[SpaceRef]]:
    """{skill id: the spaces whose current skill image holds it}, in one query.

    With `user`, only spaces that user can see are listed (skills are platform-wide, spaces
    are not). "Current" is the sandboxes-side pointer of each (space, config).
    """
    items = current_items().filter(skill_id__in=[str(skill_id) for skill_id in skill_ids])
    if user is not None:
        items = items.filter(image__space__in=spaces_for_user(user))
    found: dict[object, list[SpaceRef]] = {}
    rows = items.values_list("skill_id", "image__space_id", "image__space__name").order_by("image__space__name")
    for skill_id, space_id, space_name in rows:
        refs = found.setdefault(skill_id, [])
        ref = SpaceRef(space_id, space_name)
        if ref not in refs:
            refs.append(ref)
    return found
