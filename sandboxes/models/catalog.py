"""Catalog models: the platform backends, the space configs on them (with `BackendKind`,
`IdleMode`, the identity fields and protocol choices) and the templates the console built.

May import: Django and `console.models`; nothing else of sandboxes.
"""

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
    KUBERNETES = "kubernetes", "Kubernetes"


class IdleMode(models.TextChoices):
    PAUSE = "pause", "Pause (memory kept, fast resume)"
    STOP = "stop", "Stop (memory freed, files kept, processes lost)"


# Changing these while sandboxes live would orphan them on the old account or engine.
IDENTITY_FIELDS = ("backend", "api_key")
# A platform backend's fields that name the account or engine its configs' sandboxes live on.
BACKEND_IDENTITY_FIELDS = ("kind", "endpoint", "domain", "api_key", "tls")


class PlatformBackend(models.Model):
    """Infrastructure registered by platform admins and granted to spaces.

    A Docker host (local socket, tcp:// with TLS client certificates, ssh://) or an E2B/Cube
    endpoint with its credentials, the private-endpoint opt-in, Cube's workspace host root,
    the package sources of skill installs, and the limits a space's configs stay within.
    Space admins never set any of it: their configs choose a granted backend.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=BackendKind.choices, default=BackendKind.DOCKER)
    endpoint = models.CharField(
        max_length=500,
        blank=True,
        help_text="E2B/Cube: the control-plane URL (https://api.example.com). Docker: empty for the local "
        "engine socket, unix:///path, tcp://host:port (with TLS client certificates) or ssh://user@host.",
    )
    domain = models.CharField(max_length=255, blank=True, help_text="E2B/Cube: the sandbox (data-plane) domain.")
    sandbox_url = models.CharField(
        max_length=500,
        blank=True,
        help_text="E2B/Cube, optional: one data-plane (envd) URL for every sandbox, routed by header "
        "(a Cube proxy, or a test server). Empty: https://49983-<sandbox>.<domain>.",
    )
    api_key_encrypted = models.TextField(blank=True)
    # Docker tcp:// with TLS: PEM, stored encrypted like API keys.
    tls_ca_encrypted = models.TextField(blank=True)
    tls_cert_encrypted = models.TextField(blank=True)
    tls_key_encrypted = models.TextField(blank=True)
    allow_private_endpoints = models.BooleanField(
        default=False,
        help_text="Allow the endpoint to resolve to loopback, private or 100.64.0.0/10 addresses. "
        "Link-local and cloud metadata addresses are always refused.",
    )
    allow_space_api_key = models.BooleanField(
        default=False,
        verbose_name="Spaces may bring their own API key",
        help_text="E2B/Cube on a public endpoint: a space's config may use its own API key instead of this "
        "backend's (always through the SSRF guard, never with private endpoints).",
    )
    workspace_host_root = models.CharField(
        max_length=500,
        blank=True,
        verbose_name="Workspace host root (Cube only)",
        help_text="Cube: a directory on storage shared by every Cube node (e.g. /srv/sandbox-workspaces); each "
        "session's /workspace is a directory under it, mounted from the node. Empty: Cube sessions have no "
        "persistent /workspace. Changing it leaves existing workspaces under the old root.",
    )
    # Kubernetes (sandboxes/backends/kubernetes/settings.py says what each means); its API server
    # URL, bearer token and CA are `endpoint`, `api_key_encrypted` and `tls_ca_encrypted`.
    kubeconfig_encrypted = models.TextField(blank=True)
    in_cluster = models.BooleanField(default=False, help_text="Kubernetes: the console's own service account.")
    namespace = models.CharField(max_length=63, blank=True, help_text="Kubernetes: the namespace (or its prefix).")
    namespace_mode = models.CharField(
        max_length=16, blank=True, help_text="Kubernetes: one shared namespace, or one per space."
    )
    storage_class = models.CharField(max_length=253, blank=True, help_text="Kubernetes: /workspace's StorageClass.")
    runtime_class = models.CharField(max_length=253, blank=True, help_text="Kubernetes: the pods' RuntimeClass.")
    workspace_size = models.CharField(max_length=32, blank=True, help_text="Kubernetes: /workspace's size.")
    registry_url = models.CharField(max_length=500, blank=True, help_text="Kubernetes: the skill images' registry.")
    registry_username = models.CharField(max_length=200, blank=True, help_text="Kubernetes: the registry's user.")
    registry_password_encrypted = models.TextField(blank=True)
    pip_index_url = models.CharField(
        max_length=500,
        blank=True,
        help_text="Package source for skill installs: a pip index URL the build sandbox can reach (empty: none).",
    )
    pip_find_links = models.CharField(
        max_length=200,
        blank=True,
        help_text="Package source for skill installs: the name of a wheel folder under the deployment's "
        "SKILL_PACKAGE_SOURCES_ROOT, copied into the build sandbox (offline installs).",
    )
    npm_registry_url = models.CharField(
        max_length=500, blank=True, help_text="Package source for skill installs: an npm registry URL (empty: none)."
    )
    npm_folder = models.CharField(
        max_length=200,
        blank=True,
        help_text="Package source for skill installs: the name of a folder of npm tarballs (.tgz) under the "
        "deployment's SKILL_PACKAGE_SOURCES_ROOT, served to npm inside the build sandbox (offline installs).",
    )
    apt_folder = models.CharField(
        max_length=200,
        blank=True,
        help_text="Package source for skill installs: the name of a local apt repository folder (.deb files and "
        "a Packages index) under the deployment's package sources folder; the console copies the index and the "
        ".deb files an install needs into the build sandbox (offline installs).",
    )
    apt_url = models.CharField(
        max_length=500,
        blank=True,
        help_text="Package source for skill installs: an apt mirror or proxy URL the build sandbox can reach "
        "(used when no apt folder is set).",
    )
    apt_suite = models.CharField(
        max_length=200,
        blank=True,
        help_text="With the apt URL: the suite and components, e.g. 'bookworm main' (empty: a flat repository).",
    )
    apt_trusted = models.BooleanField(
        default=False,
        verbose_name="Trust the apt URL unsigned",
        help_text="With the apt URL: install without checking the repository's signature (an internal repository "
        "without a Release signature). Off: apt checks it against the keyrings in the template.",
    )
    max_cpus = models.DecimalField(
        max_digits=5,
        decimal_places=2,
        default=4,
        validators=[MinValueValidator(0.1), MaxValueValidator(64)],
        help_text="The most CPU cores a config on this backend may give a sandbox.",
    )
    max_memory_mb = models.PositiveIntegerField(
        default=8192,
        validators=[MinValueValidator(64), MaxValueValidator(262144)],
        help_text="The most MiB a config on this backend may give a sandbox.",
    )
    max_pids = models.PositiveIntegerField(
        default=4096,
        validators=[MinValueValidator(16), MaxValueValidator(100000)],
        help_text="The most processes a config on this backend may allow a sandbox (Docker).",
    )
    max_disk_mb = models.PositiveIntegerField(
        default=10240,
        validators=[MinValueValidator(64), MaxValueValidator(4194304)],
        help_text="The most disk (MiB) a config on this backend may give a sandbox.",
    )
    max_pool_size = models.PositiveIntegerField(
        default=20,
        validators=[MaxValueValidator(1000)],
        help_text="The most sandboxes a config on this backend may keep ready in its warm pool (0: no pools).",
    )
    spaces = models.ManyToManyField(
        Space, blank=True, related_name="granted_backends", help_text="The spaces that may run configs on it."
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:backend_edit", kwargs={"backend_id": self.id})

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)

    @property
    def has_tls(self) -> bool:
        return bool(self.tls_cert_encrypted or self.tls_ca_encrypted)


class SandboxConfig(models.Model):
    """A space's configuration on one platform backend granted to it.

    The infrastructure (endpoint, credentials, TLS, private opt-in, host roots, package
    sources) belongs to the backend; the config holds what a space admin decides: template,
    resources within the backend's limits, idle behaviour, and, where the backend allows
    it, the space's own API key.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="sandbox_configs")
    name = models.CharField(max_length=100)
    backend = models.ForeignKey(PlatformBackend, on_delete=models.PROTECT, related_name="configs")
    # The space's own key (only where backend.allow_space_api_key); empty: the backend's.
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
    disk_mb = models.PositiveIntegerField(
        default=4096,
        validators=[MinValueValidator(64), MaxValueValidator(4194304)],
        help_text="Disk per sandbox in MiB: what it may write (where the backend bounds it).",
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
    pool_size = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(1000)],
        help_text="Sandboxes kept ready for new sessions (a warm pool; 0: none). Within the backend's limit and "
        "the space's quota of live sessions: ready sandboxes count against it.",
    )
    backend_version = models.CharField(max_length=100, blank=True, help_text="As reported by the last health check.")
    # E2B/Cube wire protocol: the Cube release generation or the E2B create flavour.
    backend_protocol = models.CharField(
        max_length=16, blank=True, help_text="Wire protocol detected by the last connection test (E2B/Cube)."
    )
    protocol_pin = models.CharField(
        max_length=16,
        blank=True,
        verbose_name="Protocol",
        help_text="E2B/Cube: the wire protocol to speak (its adapter's settings list them). Empty: detect it.",
    )
    is_default = models.BooleanField(
        default=False,
        verbose_name="Default for sessions",
        help_text="New sessions of the space run on this config unless they name another (one per space).",
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["space__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["space", "name"], name="config_name_unique_in_space"),
            models.UniqueConstraint(
                fields=["space"], condition=models.Q(is_default=True), name="one_default_config_per_space"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_kind_display()})"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:config_detail", kwargs={"config_id": self.id})

    @property
    def has_api_key(self) -> bool:
        """The space's own key (the backend's is the platform's, never shown to the space)."""
        return bool(self.api_key_encrypted)

    # The infrastructure, read from the platform backend (read-only here: the platform owns it).
    @property
    def kind(self) -> str:
        return self.backend.kind

    def get_kind_display(self) -> str:
        return self.backend.get_kind_display()

    @property
    def endpoint(self) -> str:
        return self.backend.endpoint

    @property
    def domain(self) -> str:
        return self.backend.domain

    @property
    def sandbox_url(self) -> str:
        return self.backend.sandbox_url

    @property
    def allow_private_endpoints(self) -> bool:
        return self.backend.allow_private_endpoints

    @property
    def workspace_host_root(self) -> str:
        return self.backend.workspace_host_root

    @property
    def pip_index_url(self) -> str:
        return self.backend.pip_index_url

    @property
    def pip_find_links(self) -> str:
        return self.backend.pip_find_links

    @property
    def npm_registry_url(self) -> str:
        return self.backend.npm_registry_url


class TemplateRecord(models.Model):
    """A template the console built, and for which space, on one backend account.

    E2B and Cube keep no labels on templates, so this record is how the catalog tells a
    space's own build from the platform's (`sandboxes.catalog.bridge.template_owner`). The space
    is kept as a bare id, not a foreign key: a deleted space's builds stay hidden from the
    other spaces instead of turning into platform templates.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner_space = models.UUIDField(null=True, blank=True, help_text="The space it was built for; null: the platform.")
    fingerprint = models.CharField(
        max_length=64, help_text="The backend account (sandboxes.catalog.bridge.config_fingerprint)."
    )
    template_id = models.CharField(max_length=255)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["fingerprint", "template_id"], name="one_template_record_per_account")
        ]

    def __str__(self) -> str:
        return f"{self.template_id} for {self.owner_space or 'the platform'}"
