"""Egress models: refused outbound attempts, session grants, the refusal read cursors and the
watched build sandboxes (sandboxes.network).

May import: Django, `console.models`, `.catalog` and `.sessions`; nothing else of sandboxes.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.urls import reverse

from console.models import Space

from .catalog import PlatformBackend
from .sessions import Session


class SessionGrant(models.Model):
    """An extra destination for one session ("Allow for this session"), merged into its
    network spec; it ends with the session (deleted with it, the reaper's deletions too).

    ALLOW joins the allow list (made where the space allows only listed destinations),
    PRIVATE the private exceptions (a private CIDR where the space allows everything else)."""

    class Kind(models.TextChoices):
        ALLOW = "allow", "Allow entry"
        PRIVATE = "private", "Private address also allowed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="egress_grants")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.ALLOW)
    entry = models.CharField(max_length=255)
    created_by = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created"]
        constraints = [models.UniqueConstraint(fields=["session", "entry"], name="one_grant_per_session_entry")]

    def __str__(self) -> str:
        return f"{self.entry} for {self.session}"

    def get_absolute_url(self) -> str:
        return self.session.get_absolute_url()


class EgressEvent(models.Model):
    """One refused outbound attempt, read back from a backend (`EgressCapability.refusals`)
    and mapped to its space and session (or skill build job) by sandbox id."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    time = models.DateTimeField(db_index=True)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="egress_events")
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="egress_events")
    job = models.ForeignKey(
        "console.AdminJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="egress_events"
    )
    sandbox_id = models.CharField(max_length=128)
    layer = models.CharField(max_length=16)
    destination = models.CharField(max_length=500)
    rule = models.CharField(max_length=300)
    detail = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        # The Egress page's keyset order (sandboxes.network.log.EGRESS_ORDER) behind each of
        # its equality filters, so a deep page reads one page of an index.
        indexes = [
            models.Index(fields=["space", "-time", "-id"], name="egress_space_order"),
            models.Index(fields=["space", "layer", "-time", "-id"], name="egress_space_layer_order"),
            models.Index(fields=["session", "-time", "-id"], name="egress_session_order"),
        ]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.layer} {self.destination} refused"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:egress_list", kwargs={"space_id": self.space_id})


class EgressCursor(models.Model):
    """Where the last read of a platform backend's refusals stopped."""

    backend = models.OneToOneField(PlatformBackend, on_delete=models.CASCADE, primary_key=True, related_name="+")
    cursor = models.TextField(blank=True)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"egress cursor of {self.backend}"


class WatchedSandbox(models.Model):
    """A sandbox that is no session's (a skill build's), so its refusals map to its job."""

    sandbox_id = models.CharField(max_length=128, primary_key=True)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey("console.AdminJob", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"watched sandbox {self.sandbox_id}"
