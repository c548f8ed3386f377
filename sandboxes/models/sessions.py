"""Session models: sessions (with `SessionState`), their skill images, the agent API tokens,
artifacts, exec slots, background commands (with `CommandStatus`), web terminals and the
database session store's tables.

May import: Django, `console.models` and `.catalog`; nothing else of sandboxes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce, Lower
from django.urls import reverse

from console.models import Space

from .catalog import SandboxConfig


class SessionState(models.TextChoices):
    NEW = "new", "New"
    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    STOPPED = "stopped", "Stopped"
    GONE = "gone", "Gone"


# The sessions list's sort key (sandboxes/sessions/listing.py): last activity, newest first,
# never-active sessions last (as if active at NEVER_ACTIVE), then creation, then id (unique, so
# rows created in one instant still have one place each). One expression, so that the page's
# queries and the indexes in Session.Meta are the same to the database.
NEVER_ACTIVE = datetime(1970, 1, 1, tzinfo=UTC)


def list_activity() -> Coalesce:
    return Coalesce(models.F("last_activity"), models.Value(NEVER_ACTIVE, output_field=models.DateTimeField()))


def _list_order(*leading: str) -> tuple[models.Expression | models.F, ...]:
    return (
        *(models.F(name) for name in leading),
        list_activity().desc(),
        models.F("created").desc(),
        models.F("id").desc(),
    )


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
    # A persistent /workspace made before the session (a warm pool's); empty: named by its id.
    workspace_name = models.CharField(max_length=128, blank=True)
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
    # Labels as one padded, space-separated string (" team=ml nightly "), so the list filters
    # on one with a portable LIKE and shows them without another query (sessions/labels.py).
    labels = models.CharField(max_length=1100, blank=True, default="")
    keep_awake_until = models.DateTimeField(
        null=True, blank=True, help_text="The idle sweep leaves the session running until then."
    )
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-last_activity", "-created"]
        constraints = [models.UniqueConstraint(fields=["space", "key"], name="session_key_unique_in_space")]
        # The sessions list: all, by space, by state (the space + state filter uses either).
        indexes = [
            models.Index(*_list_order(), name="session_list_order"),
            models.Index(*_list_order("space"), name="session_list_space_order"),
            models.Index(*_list_order("state"), name="session_list_state_order"),
        ]

    def __str__(self) -> str:
        return f"session {self.key} in {self.space}"

    def get_absolute_url(self) -> str:
        return reverse("sandboxes:session_detail", kwargs={"session_id": self.id})

    @property
    def is_stale(self) -> bool:
        return self.stale_at is not None and (self.bound_at is None or self.bound_at < self.stale_at)

    @property
    def label_list(self) -> list[str]:
        return self.labels.split()

    @property
    def idles_at(self) -> datetime | None:
        """When the idle sweep may idle this running session (None: not running or never active)."""
        if self.state != SessionState.RUNNING or self.last_activity is None:
            return None
        due = self.last_activity + timedelta(seconds=self.config.idle_timeout_s)
        if self.keep_awake_until is not None and self.keep_awake_until > due:
            return self.keep_awake_until
        return due

    @property
    def workspace_volume(self) -> str:
        """The persistent /workspace of this session (where the backend keeps one): the one
        its warm-pool sandbox came with, else named after the session."""
        return self.workspace_name or f"sandbox-console-ws-{self.id}"


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


class TokenScope(models.TextChoices):
    """What a token may call (`sandboxes.api.auth.SCOPE_METHODS` says which methods each takes)."""

    READ = "read", "read-only"
    RUN = "run", "run"
    FULL = "full", "full"


class ApiToken(models.Model):
    """A per-space token for the agent API. Only its SHA-256 is stored; shown once. Its scope
    bounds what it may call, and past `expires` it is refused."""

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
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.FULL)
    expires = models.DateTimeField(null=True, blank=True, help_text="Refused from then on; never when empty.")

    class Meta:
        ordering = ["-created"]
        constraints = [
            # Tokens in force are told apart by name (a revoked one frees its name).
            models.UniqueConstraint(
                Lower("name"),
                "space",
                condition=models.Q(revoked__isnull=True),
                name="api_token_name_unique_in_space",
                violation_error_message="This space has a token of this name in force.",
            )
        ]

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
    """One exec in flight, counted against its space's concurrent-exec limit until it ends,
    the process running it is found dead (`owner_process`, console/processes.py), or its own
    deadline passes. sandboxes/sessions/limits.py."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="+")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    deadline = models.DateTimeField()
    # The console.WorkerProcess running the exec (None: a slot from before processes were tracked).
    owner_process = models.UUIDField(null=True, blank=True, db_index=True)
    # Which of the space's `concurrent_execs` places it holds (0 to limit - 1): one row per
    # place, so a slot is taken by one INSERT that a racing one cannot also win, without a lock.
    number = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["space", "deadline"], name="exec_slot_space_deadline")]
        constraints = [models.UniqueConstraint(fields=["space", "number"], name="exec_slot_one_per_place")]

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
    # The console.WorkerProcess pumping it: when that process dies, the command is marked lost.
    owner_process = models.UUIDField(null=True, blank=True, db_index=True)
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
    # The sandbox its last shell started in: where the idle sweep ends a kept shell the
    # terminal left behind (the row lives as long as the terminal; its audit rows may not).
    sandbox_id = models.CharField(max_length=128, blank=True)
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
