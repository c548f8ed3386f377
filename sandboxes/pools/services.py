"""Writes of the pools room: `do_set_pool_size`, one audited change of a config's pool."""

from __future__ import annotations

from django.db import transaction

from console.models import AuditAction
from console.services import Actor, ServiceError, record_audit

from ..models import SandboxConfig
from ..sessions.limits import limits_of
from .keeper import kick


def do_set_pool_size(config: SandboxConfig, size: object, *, actor: Actor) -> SandboxConfig:
    """Declare how many ready sandboxes `config` keeps: within its platform backend's limit and
    the space's quota of live sessions (ready sandboxes count against it). A refill (or drain)
    starts once the change is committed."""
    try:
        wanted = int(str(size).strip())
    except ValueError:
        raise ServiceError("A pool size is a whole number.", field_errors={"pool_size": ["not a number"]}) from None
    if wanted < 0:
        raise ServiceError("A pool size is 0 or more.", field_errors={"pool_size": ["negative"]})
    limit = config.backend.max_pool_size
    if wanted > limit:
        raise ServiceError(
            f"The backend {config.backend.name} allows pools of at most {limit} sandboxes.",
            field_errors={"pool_size": [f"at most {limit}"]},
        )
    quota = limits_of(config.space)["live_sessions"]
    if wanted > quota:
        raise ServiceError(
            f"The space's quota of live sessions is {quota}, and ready sandboxes count against it: "
            f"a pool of {wanted} cannot fit.",
            field_errors={"pool_size": [f"at most {quota}"]},
        )
    before = config.pool_size
    with transaction.atomic():
        SandboxConfig.objects.filter(pk=config.pk).update(pool_size=wanted)
        config.pool_size = wanted
        record_audit(
            actor,
            AuditAction.SANDBOX_CONFIG_UPDATE,
            space=config.space,
            target_type="sandbox_config",
            target_id=config.id,
            target_name=config.name,
            details={
                "changed": ["pool_size"],
                "before": {"pool_size": str(before)},
                "after": {"pool_size": str(wanted)},
            },
        )
        kick(config.pk)
    return config
