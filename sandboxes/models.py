"""Sandbox configs: which backend a space's sandboxes run on, and how."""

from __future__ import annotations

import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.urls import reverse

from console.models import Space


class BackendKind(models.TextChoices):
    DOCKER = "docker", "Docker"
    E2B = "e2b", "E2B"
    CUBE = "cube", "Cube Sandbox"


class IdleMode(models.TextChoices):
    PAUSE = "pause", "Pause (memory kept, fast resume)"
    STOP = "stop", "Stop (memory freed, files kept, processes lost)"


# Changing these while sandboxes live would orphan them on the old account or engine.
IDENTITY_FIELDS = ("kind", "endpoint", "api_key")


class SandboxConfig(models.Model):
    """A named, self-contained backend configuration of one space.

    Nothing is inherited from deployment settings: a config names its own endpoint, key
    and template, so a half-filled config never silently talks to a default host.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="sandbox_configs")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=BackendKind.choices, default=BackendKind.DOCKER)
    endpoint = models.CharField(
        max_length=500,
        blank=True,
        help_text="E2B/Cube: the control-plane URL (https://api.example.com). "
        "Docker: empty for the local engine socket, or tcp://host:port.",
    )
    domain = models.CharField(max_length=255, blank=True, help_text="E2B/Cube: the sandbox (data-plane) domain.")
    api_key_encrypted = models.TextField(blank=True)
    default_template = models.CharField(max_length=255)
    cpus = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=1,
        validators=[MinValueValidator(0.1), MaxValueValidator(64)],
        help_text="CPU cores per sandbox.",
    )
    memory_mb = models.PositiveIntegerField(
        default=1024, validators=[MinValueValidator(64), MaxValueValidator(262144)], help_text="MiB per sandbox."
    )
    pids_limit = models.PositiveIntegerField(
        default=512,
        validators=[MinValueValidator(16), MaxValueValidator(100000)],
        help_text="Processes per sandbox (Docker).",
    )
    idle_mode = models.CharField(max_length=8, choices=IdleMode.choices, default=IdleMode.PAUSE)
    idle_timeout_s = models.PositiveIntegerField(
        default=900,
        validators=[MinValueValidator(60), MaxValueValidator(86400)],
        help_text="Seconds without activity before a session sandbox is idled.",
    )
    persistent_workspace = models.BooleanField(
        default=True, help_text="Keep /workspace on storage that outlives the sandbox, where the backend can."
    )
    allow_private_endpoints = models.BooleanField(
        default=False,
        help_text="Allow the endpoint to resolve to loopback, private or 100.64.0.0/10 addresses. "
        "Link-local and cloud metadata addresses are always refused.",
    )
    backend_version = models.CharField(max_length=100, blank=True, help_text="As reported by the last health check.")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["space__name", "name"]
        constraints = [models.UniqueConstraint(fields=["space", "name"], name="config_name_unique_in_space")]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:config_detail", kwargs={"config_id": self.id})

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)
