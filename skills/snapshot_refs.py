"""The skills side of the catalog's snapshot questions (sandboxes.catalog signals).

sandboxes never imports skills, so it asks through signals: which skill image
generations use a snapshot, and, once a platform admin forced its deletion, to retire them
so the Skill image page says they are gone and sessions start from the default template.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db.models import Q

from sandboxes.catalog.templates import SnapshotReference

from .models import SkillImage, SkillImageStatus

# Put on each skill-image snapshot by skills.image_builds.take_snapshot: the generation that took it.
SKILL_IMAGE_LABEL = "console.skill-image"
FORCED_NOTE = "Its snapshot was deleted by a platform admin; sessions start from the config's default template."


def snapshot_references(
    sender: Any, *, snapshot_id: str | None, fingerprint: str, labels: Mapping[str, str] | None = None, **kwargs: Any
) -> list[tuple[str, SnapshotReference]]:
    """(snapshot id, reference) for ready generations on it, builds starting from it, and the
    build that took it (named in its labels) while that build has not recorded it yet."""
    images = SkillImage.objects.filter(fingerprint=fingerprint, status=SkillImageStatus.READY).select_related("config")
    building = SkillImage.objects.filter(status=SkillImageStatus.BUILDING).select_related("config")
    if snapshot_id is not None:
        images = images.filter(snapshot_id=snapshot_id)
        uses = Q(base_template=snapshot_id)
        took_it = (labels or {}).get(SKILL_IMAGE_LABEL)
        if _is_uuid(took_it):
            uses |= Q(pk=took_it)
        building = building.filter(uses)
    else:
        building = building.none()
    refs = [
        (
            image.snapshot_id,
            SnapshotReference(
                f"skill image generation {image.generation} on config {image.config.name}", str(image.space_id)
            ),
        )
        for image in images
    ]
    refs += [
        (
            snapshot_id or image.base_template,
            SnapshotReference(
                f"skill image generation {image.generation} (building) on config {image.config.name}",
                str(image.space_id),
            ),
        )
        for image in building
    ]
    return refs


def _is_uuid(value: str | None) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


def snapshot_force_deleted(sender: Any, *, snapshot_id: str, fingerprint: str, **kwargs: Any) -> None:
    SkillImage.objects.filter(snapshot_id=snapshot_id, fingerprint=fingerprint, status=SkillImageStatus.READY).update(
        status=SkillImageStatus.RETIRED, error=FORCED_NOTE
    )


RETIRED_NOTE = "Its snapshot was deleted with the last session that ran from it."


def snapshot_retired(sender: Any, *, snapshot_id: str, fingerprint: str, **kwargs: Any) -> None:
    SkillImage.objects.filter(snapshot_id=snapshot_id, fingerprint=fingerprint, status=SkillImageStatus.READY).update(
        status=SkillImageStatus.RETIRED, error=RETIRED_NOTE
    )


def connect() -> None:
    from sandboxes.catalog import templates as catalog

    catalog.snapshot_references.connect(snapshot_references, dispatch_uid="skills.snapshot_references")
    catalog.snapshot_force_deleted.connect(snapshot_force_deleted, dispatch_uid="skills.snapshot_force_deleted")
    catalog.snapshot_retired.connect(snapshot_retired, dispatch_uid="skills.snapshot_retired")
