"""The skills app's step of the dashboard's getting-started path (console.onboarding):
a skill image of one of the user's spaces is ready with at least one skill in it."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import reverse

from console.models import Space
from console.onboarding import Step, onboarding_step

from .models import Skill, SkillImage, SkillImageStatus


@onboarding_step(30)
def install_skill(user: Any, spaces: QuerySet[Space]) -> Step:
    title = "Install a skill"
    image = (
        SkillImage.objects.filter(space__in=spaces, status=SkillImageStatus.READY)
        .exclude(manifest=[])
        .select_related("space")
        .order_by("-created")
        .first()
    )
    if image is not None:
        url = reverse("skills:image_detail", kwargs={"space_id": image.space_id})
        return Step("skill", title, True, url, "Open the skill image", f"In {image.space.name}")
    if Skill.objects.exists():
        return Step(
            "skill", title, False, reverse("skills:skill_list"), "Pick a skill", "Into the space's skill image."
        )
    return Step("skill", title, False, reverse("skills:skill_import"), "Import a skill", "The catalog is empty.")
