"""Warm pool models: the sandboxes a config keeps ready for new sessions (`PoolMember`, with
`MemberState`), and what each first resolve got from its config's pool (`PoolClaim`).

A member row exists before its sandbox (state refilling), so a sandbox made by a refill that
died is recognised by its `META_POOL` label and this row; it stays while its sandbox lives,
claimed by one session at most (a constraint) and deleted with that session, so the reaper
and the teardown judge pooled sandboxes by these rows (a Docker sandbox's labels are fixed at
create).

May import: Django, `console.models` and `.catalog`, `.sessions`; nothing else of sandboxes.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.urls import reverse

from console.models import Space

from .catalog import SandboxConfig
from .sessions import Session


def native_pool_name(config_id: object, template_id: str, fingerprint: str) -> str:
    """The name a config's pool has on a backend that keeps pools itself
    (`Backend.warm_pools()`): one per config, template and network spec, starting with the
    config's id so the config's pools are told from the names the backend lists."""
    return f"{config_id}:{template_id}:{fingerprint}"


def is_native_pool_of(name: str, config_id: object) -> bool:
    return name.startswith(f"{config_id}:")


class MemberState(models.TextChoices):
    REFILLING = "refilling", "Refilling"
    READY = "ready", "Ready, unclaimed"
    CLAIMED = "claimed", "Claimed"


class PoolMember(models.Model):
    """One sandbox of a config's warm pool: being made, ready (unclaimed), or claimed by the
    session it was handed to (kept until the sandbox goes, so nothing treats it as unowned)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="pool_members")
    config = models.ForeignKey(SandboxConfig, on_delete=models.CASCADE, related_name="pool_members")
    state = models.CharField(max_length=16, choices=MemberState.choices, default=MemberState.REFILLING)
    sandbox_id = models.CharField(max_length=128, blank=True)
    # What it was made from: the effective template and the space's network spec (fingerprint).
    template_id = models.CharField(max_length=255)
    policy_fingerprint = models.CharField(max_length=16)
    # Its persistent /workspace, made with it; handed to the session that claims it.
    workspace_volume = models.CharField(max_length=128, blank=True)
    session = models.OneToOneField(Session, null=True, blank=True, on_delete=models.CASCADE, related_name="pool_member")
    created = models.DateTimeField(auto_now_add=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["config", "created"]
        indexes = [models.Index(fields=["config", "state", "template_id"], name="pool_member_claim")]

    def __str__(self) -> str:
        return f"pool member {self.sandbox_id or self.id} of {self.config} ({self.state})"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:space_pools", kwargs={"space_id": self.space_id})


class PoolClaim(models.Model):
    """A first resolve on a config with a pool: whether it took a ready sandbox, how long the
    claim took, how long its caller waited for the answer, and if not, why (the Pools page's
    hit rate, latencies and misses)."""

    id = models.BigAutoField(primary_key=True)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="pool_claims")
    config = models.ForeignKey(SandboxConfig, on_delete=models.CASCADE, related_name="pool_claims")
    hit = models.BooleanField()
    reason = models.CharField(max_length=200, blank=True, help_text="Why the resolve missed the pool.")
    duration_ms = models.FloatField(default=0)  # the claim step
    # The whole resolve, from the API request's start to its answer (None: it failed).
    resolve_ms = models.FloatField(null=True, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["config", "at"], name="pool_claim_config_at")]

    def __str__(self) -> str:
        return f"{'hit' if self.hit else 'miss'} on {self.config} at {self.at:%Y-%m-%d %H:%M:%S}"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:space_pools", kwargs={"space_id": self.space_id})
