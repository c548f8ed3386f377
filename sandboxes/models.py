"""Sandbox configs: which backend a space's sandboxes run on, and how."""

from __future__ import annotations

import uuid

from django.conf import settings
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
IDENTITY_FIELDS = ("backend", "api_key")
# A platform backend's fields that name the account or engine its configs' sandboxes live on.
BACKEND_IDENTITY_FIELDS = ("kind", "endpoint", "domain", "api_key", "tls")


# What `protocol_pin` may name (the adapters' `options["protocol"]` values).
PROTOCOL_CHOICES = [
    ("", "Detect from the server"),
    ("e2b-v2", "E2B: SDK /v2 create (E2B cloud)"),
    ("e2b-v1", "E2B: published-spec operations only (self-hosted)"),
    ("cube-0.5", "Cube v0.5 or later"),
    ("cube-0.4", "Cube before v0.5"),
]


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
    idle_mode = models.CharField(max_length=8, choices=IdleMode.choices, default=IdleMode.PAUSE)
    idle_timeout_s = models.PositiveIntegerField(
        default=900,
        validators=[MinValueValidator(60), MaxValueValidator(86400)],
        help_text="Seconds without activity before a session sandbox is idled.",
    )
    persistent_workspace = models.BooleanField(
        default=True, help_text="Keep /workspace on storage that outlives the sandbox, where the backend can."
    )
    backend_version = models.CharField(max_length=100, blank=True, help_text="As reported by the last health check.")
    # E2B/Cube wire protocol: the Cube release generation or the E2B create flavour.
    backend_protocol = models.CharField(
        max_length=16, blank=True, help_text="Wire protocol detected by the last connection test (E2B/Cube)."
    )
    protocol_pin = models.CharField(
        max_length=16,
        blank=True,
        choices=PROTOCOL_CHOICES,
        verbose_name="Protocol",
        help_text="E2B/Cube: the wire protocol to speak. Empty: detect it from the server's answers.",
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


class SessionState(models.TextChoices):
    NEW = "new", "New"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    STOPPED = "stopped", "Stopped"
    GONE = "gone", "Gone"


class Session(models.Model):
    """An agent session: one sandbox, kept across turns, idled when unused.

    The authoritative session -> sandbox binding lives in the session store (Redis or the
    database tables of `SessionBinding`);
    `sandbox_id`, `state` and `binding_version` here are the last values seen, for pages
    and queries, never for decisions.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="sessions")
    # RESTRICT: a config cannot go while sessions use it, but a space deletion takes both.
    config = models.ForeignKey(SandboxConfig, on_delete=models.RESTRICT, related_name="sessions")
    key = models.CharField(max_length=128, help_text="The agent platform's own session id.")
    sandbox_id = models.CharField(max_length=128, blank=True)
    template_id = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=SessionState.choices, default=SessionState.NEW)
    binding_version = models.PositiveIntegerField(default=0)
    bound_at = models.DateTimeField(null=True, blank=True, help_text="When the current sandbox was bound.")
    stale_at = models.DateTimeField(null=True, blank=True, help_text="Sandboxes bound before this are stale.")
    traffic_token_encrypted = models.TextField(blank=True)
    has_persistent_workspace = models.BooleanField(
        default=False, help_text="A sandbox of this session was created on a persistent /workspace (to delete with it)."
    )
    last_activity = models.DateTimeField(null=True, blank=True, db_index=True)
    # Execs running now (Runtime.exec), so the idle sweep never idles a sandbox under one;
    # `exec_deadline` bounds the count's trust if a process died mid-exec.
    execs_in_flight = models.PositiveIntegerField(default=0)
    exec_deadline = models.DateTimeField(null=True, blank=True)
    # The network spec (space policy + grants) its sandbox runs with: set at create and at a
    # live update (sandboxes.catalog.network.spec_fingerprint); differs from the current one
    # while the sandbox keeps older rules until rebuilt.
    policy_fingerprint = models.CharField(max_length=16, blank=True)
    policy_applied_at = models.DateTimeField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-last_activity", "-created"]
        constraints = [models.UniqueConstraint(fields=["space", "key"], name="session_key_unique_in_space")]

    def __str__(self) -> str:
        return f"session {self.key} in {self.space}"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:session_detail", kwargs={"session_id": self.id})

    @property
    def is_stale(self) -> bool:
        return self.stale_at is not None and (self.bound_at is None or self.bound_at < self.stale_at)

    @property
    def workspace_volume(self) -> str:
        """The persistent /workspace of this session (where the backend keeps one)."""
        return f"sandbox-console-ws-{self.id}"


class SessionImage(models.Model):
    """The snapshot a space's new sessions start from on one config (a skill image).

    Written by the skills app through `sandboxes.catalog.services.do_set_session_image`, so the
    runtime never imports skills. A pointer whose fingerprint no longer matches its config's
    backend account is ignored and sessions fall back to the config's default template.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="session_images")
    config = models.ForeignKey(SandboxConfig, on_delete=models.CASCADE, related_name="session_images")
    snapshot_id = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    label = models.CharField(max_length=200, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["space", "config"], name="one_session_image_per_config")]

    def __str__(self) -> str:
        return f"{self.snapshot_id} for {self.space} on {self.config}"


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


class ApiToken(models.Model):
    """A per-space token for the agent API. Only its SHA-256 is stored; shown once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise a token.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked is None


class Artifact(models.Model):
    """A file collected from a session's /workspace/output at the end of a turn."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="artifacts")
    collection = models.UUIDField(help_text="One collect_artifacts call.")
    path = models.CharField(max_length=1024)
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    file = models.FileField(upload_to="artifacts/", max_length=1024)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "path"]

    def __str__(self) -> str:
        return f"{self.path} ({self.size} bytes)"


class ExecSlot(models.Model):
    """One exec in flight, counted against its space's concurrent-exec limit until it ends or
    its own deadline passes (a process killed mid-exec never deletes its slot; the deadline
    frees it). sandboxes/sessions/limits.py."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    deadline = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["space", "deadline"], name="exec_slot_space_deadline")]

    def __str__(self) -> str:
        return f"exec in {self.session_id} until {self.deadline:%H:%M:%S}"


class CommandStatus(models.TextChoices):
    RUNNING = "running", "Running"
    EXITED = "exited", "Exited"
    KILLED = "killed", "Killed"
    LOST = "lost", "Lost"  # the process that owned it went away; the outcome is unknown


class BackgroundCommand(models.Model):
    """A command running in a session's sandbox after the request that started it returned.

    Its output lives in a Redis ring buffer (sandboxes.sessions.commands) readable from any process;
    this row holds what the command was, who started it and how it ended.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="commands")
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    shell = models.TextField(blank=True)
    argv = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=CommandStatus.choices, default=CommandStatus.RUNNING)
    exit_code = models.IntegerField(null=True, blank=True)
    owner = models.CharField(max_length=200, blank=True, help_text="host:pid of the process pumping its output.")
    started = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started"]

    def __str__(self) -> str:
        return f"command {self.display_command[:60]} ({self.status})"

    @property
    def display_command(self) -> str:
        return self.shell or " ".join(str(arg) for arg in self.argv)

    @property
    def is_finished(self) -> bool:
        return self.status != CommandStatus.RUNNING


class Terminal(models.Model):
    """One interactive web terminal into a session's sandbox (sandboxes.terminal.consumer).

    Keystrokes are never stored; only who, when, how much and why it closed.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="terminals")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    opened = models.DateTimeField(null=True, blank=True, help_text="When its shell started.")
    closed = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=200, blank=True)
    bytes_in = models.PositiveBigIntegerField(default=0, help_text="From the browser to the shell.")
    bytes_out = models.PositiveBigIntegerField(default=0, help_text="From the shell to the browser.")
    read_only = models.BooleanField(default=False)
    # The one ticket that may still open (or reattach to) this terminal; cleared when redeemed.
    ticket_nonce = models.CharField(max_length=64, blank=True)
    # The console process holding a live websocket attachment (sandboxes.terminal.attachments):
    # a lease renewed by its holder, so any process's grace window knows whether to close.
    holder = models.CharField(max_length=100, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"terminal {self.id} on {self.session}"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:terminal_page", kwargs={"session_id": self.session_id})


class SessionBinding(models.Model):
    """A session -> sandbox binding of the database session store (sandboxes.sessions.store_db).

    `value` is the binding's JSON exactly as `Binding.to_json` wrote it, so compare-and-delete
    compares whole texts. Written insert-if-absent, never expires.
    """

    key = models.CharField(max_length=255, primary_key=True)
    value = models.TextField()

    class Meta:
        db_table = "sandboxes_store_binding"

    def __str__(self) -> str:
        return self.key


class SessionLease(models.Model):
    """A lifecycle lock (value = its holder's token) or turn lease (value = ticket state) of
    the database session store; a row whose `expires_ms` (epoch ms) has passed counts as absent."""

    key = models.CharField(max_length=255, primary_key=True)
    value = models.TextField()
    expires_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "sandboxes_store_lease"

    def __str__(self) -> str:
        return self.key


# --- Egress: refused attempts, session grants, the read cursors (sandboxes.egress) --------


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
        indexes = [
            models.Index(fields=["space", "-time"], name="egress_space_time"),
            models.Index(fields=["session", "-time"], name="egress_session_time"),
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
