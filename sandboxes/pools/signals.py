"""What drains and refills pools when their sandboxes go out of date: a committed network
policy change of the space (`console.signals.network_policy_changed`), a changed skill
image of a config (its `SessionImage` row saved or deleted) and a config saved with other
resources, idle timeout or workspace (its sandboxes were made to the old ones: their rows are
marked outdated, so no claim takes them). Each starts a refill, which drains the ready
sandboxes made under the old policy, image or config and makes new ones. Connected in
`SandboxesConfig.ready()`."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save, pre_save

from console.models import Space

from ..models import MemberState, PoolMember, SandboxConfig, SessionImage
from .keeper import kick


def on_space_policy_changed(sender: Any, space: Space, **kwargs: Any) -> None:
    for config_id in SandboxConfig.objects.filter(space=space, pool_size__gt=0).values_list("pk", flat=True):
        kick(config_id)


def _on_image_row(sender: Any, instance: SessionImage, **kwargs: Any) -> None:
    kick(instance.config_id)


# What a pooled sandbox is made with from its config (keeper.wanted, keeper.make_member).
SHAPING_FIELDS = ("cpus", "memory_mb", "pids_limit", "disk_mb", "idle_timeout_s", "persistent_workspace")
# A member's template when its config changed under it: no claim asks for it, a refill drains it.
OUTDATED_TEMPLATE = ""


def _on_config_saving(sender: Any, instance: SandboxConfig, **kwargs: Any) -> None:
    if instance._state.adding or instance.pk is None:
        return
    before = SandboxConfig.objects.filter(pk=instance.pk).values(*SHAPING_FIELDS).first()
    if before is None or all(before[f] == getattr(instance, f) for f in SHAPING_FIELDS):
        return
    PoolMember.objects.filter(config=instance).exclude(state=MemberState.CLAIMED).update(template_id=OUTDATED_TEMPLATE)
    kick(instance.pk)


def connect_image_signals() -> None:
    post_save.connect(_on_image_row, sender=SessionImage, dispatch_uid="sandboxes.pools.image_saved")
    post_delete.connect(_on_image_row, sender=SessionImage, dispatch_uid="sandboxes.pools.image_deleted")
    pre_save.connect(_on_config_saving, sender=SandboxConfig, dispatch_uid="sandboxes.pools.config_saving")
