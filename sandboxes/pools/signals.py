"""What drains and refills pools when their sandboxes go out of date: a committed network
policy change of the space (`console.signals.network_policy_changed`) and a changed skill
image of a config (its `SessionImage` row saved or deleted). Both start a refill, which
drains the ready sandboxes made under the old policy or image and makes new ones. Connected
in `SandboxesConfig.ready()`."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save

from console.models import Space

from ..models import SandboxConfig, SessionImage
from .keeper import kick


def on_space_policy_changed(sender: Any, space: Space, **kwargs: Any) -> None:
    for config_id in SandboxConfig.objects.filter(space=space, pool_size__gt=0).values_list("pk", flat=True):
        kick(config_id)


def _on_image_row(sender: Any, instance: SessionImage, **kwargs: Any) -> None:
    kick(instance.config_id)


def connect_image_signals() -> None:
    post_save.connect(_on_image_row, sender=SessionImage, dispatch_uid="sandboxes.pools.image_saved")
    post_delete.connect(_on_image_row, sender=SessionImage, dispatch_uid="sandboxes.pools.image_deleted")
