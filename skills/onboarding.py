"""The skills app's step of the dashboard's getting-started path (console.onboarding):
a skill image of one of the user's spaces is ready with at least one skill in it."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import reverse

from console.models import Space
from console.onboarding import Step, onboarding_step
from console.readings import exists, first

from .models import Skill, SkillImage, SkillImageStatus


def _skill_reads(user: Any, spaces: QuerySet[Space]) -> dict[str, Any]:
    ready = SkillImage.objects.filter(space__in=spaces, status=SkillImageStatus.READY).exclude(manifest=[])
    return {
        "image": first(ready.order_by("-created"), space_id="space_id", space="space__name"),
        "any_skill": exists(Skill.objects.all()),
    }


@onboarding_step(30, reads=_skill_reads)
def install_skill(user: Any, found: dict[str, Any]) -> Step:
    title = "Install a skill"
    image = found["image"]
    if image is not None:
        url = reverse("skills:image_detail", kwargs={"space_id": image["space_id"]})
        return Step("skill", title, True, url, "Open the skill image", f"In {image['space']}")
    if found["any_skill"]:
        return Step(
            "skill", title, False, reverse("skills:skill_list"), "Pick a skill", "Into the space's skill image."
        )
    return Step("skill", title, False, reverse("skills:skill_import"), "Import a skill", "The catalog is empty.")
