"""Spaces (tenants), their members and network policy, the audit log, and admin jobs."""

from __future__ import annotations

import uuid
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.urls import reverse


class Role(models.TextChoices):
    """Roles ordered from least to most privileged (see ROLE_RANK)."""

    VIEWER = "viewer", "Viewer"
    MEMBER = "member", "Member"
    ADMIN = "admin", "Admin"


ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3}


class Space(models.Model):
    """A tenant: its members, network policy, sandbox configs, skills and sessions."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # Two spaces named "Demo" cannot be told apart in a menu: names are unique, ignoring case.
            models.UniqueConstraint(
                Lower("name"), name="space_name_unique_ci", violation_error_message="A space with this name exists."
            )
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("console:space_detail", kwargs={"space_id": self.id})


class SpaceLimits(models.Model):
    """A space's quotas and rate limits, set by platform admins. A blank field takes the
    platform default (tuning limits.*); the row is also what a check locks,
    so two calls of one space never both take its last slot (sandboxes/sessions/limits.py)."""

    space = models.OneToOneField(Space, on_delete=models.CASCADE, related_name="limits", primary_key=True)
    live_sessions = models.PositiveIntegerField(
        null=True, blank=True, help_text="Sessions that exist at once (any state but gone)."
    )
    concurrent_execs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Commands running at once through the API's exec, across all sessions."
    )
    background_commands = models.PositiveIntegerField(
        null=True, blank=True, help_text="Background commands running at once, across all sessions."
    )
    api_requests_per_minute = models.PositiveIntegerField(
        null=True, blank=True, help_text="Agent API requests per minute, per space (whichever of its tokens sent them)."
    )
    updated = models.DateTimeField(auto_now=True)

    LIMIT_FIELDS = ("live_sessions", "concurrent_execs", "background_commands", "api_requests_per_minute")

    def __str__(self) -> str:
        return f"limits of {self.space}"

    def effective(self) -> dict[str, int]:
        """Every limit as enforced: this row's value, else the platform default."""
        from .tuning import LIMITS

        defaults = LIMITS.space_defaults()
        return {
            name: (getattr(self, name) if getattr(self, name) is not None else int(defaults[name]))
            for name in self.LIMIT_FIELDS
        }


class Membership(models.Model):
    """A user's role in one space. Superusers need none: they see every space."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    space = models.ForeignKey(Space, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["space__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["user", "space"], name="one_membership_per_user_space")]

    def __str__(self) -> str:
        return f"{self.user} in {self.space} ({self.role})"


# Past this many entries the policy's summary names the list instead of repeating it (the
# space page shows long lists folded, with their count).
FEW_ENTRIES = 5


def _few(entries: list[str], which: str) -> str:
    if len(entries) <= FEW_ENTRIES:
        return ", ".join(entries)
    return f"the {len(entries)} entries of the {which} list"


class NetworkPolicy(models.Model):
    """The network switches of one space. Every switch is explicit; nothing is inherited.

    Stored as the admin's text, validated on save (`netpolicy.validate`); its meaning is
    `netpolicy`'s, read back typed with `sandboxes.catalog.network.policy_spec`. Outbound on:
    an empty allow_out lets out everything but the always-denied set (the host's own
    addresses, link-local/metadata, loopback, other sandboxes, private ranges) and deny_out;
    a non-empty one lets out only its CIDRs and domains (`example.com` = the name and all
    its subdomains, `*.example.com` = its subdomains only). deny_out entries win.
    allow_private holds private CIDRs also allowed (never switches the space to allow-only).
    l7_rules is an ordered list of {"domain", "methods", "path_prefix", "action"}.
    """

    space = models.OneToOneField(Space, on_delete=models.CASCADE, related_name="network_policy", primary_key=True)
    allow_internet_access = models.BooleanField(default=False)
    allow_out = models.JSONField(default=list, blank=True)
    deny_out = models.JSONField(default=list, blank=True)
    allow_private = models.JSONField(default=list, blank=True)
    l7_rules = models.JSONField(default=list, blank=True)
    allow_public_traffic = models.BooleanField(default=False)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"network policy of {self.space}"

    def get_absolute_url(self) -> str:
        return reverse("console:network_policy_edit", kwargs={"space_id": self.space_id})

    def describe(self) -> list[str]:
        """The effective policy in plain words, for the space page."""
        lines: list[str] = []
        if not self.allow_internet_access:
            lines.append("Outbound: off. Sandboxes have no network access at all.")
        else:
            if self.allow_out:
                lines.append(f"Outbound: on, only to {_few(self.allow_out, 'allow')} (everything else is refused).")
            else:
                lines.append(
                    "Outbound: on, to any destination except the always-denied ones (this host, link-local and"
                    " metadata addresses, other sandboxes, private ranges)."
                )
            if self.deny_out:
                lines.append(f"Always refused, even where an allow entry matches: {_few(self.deny_out, 'deny')}.")
            if self.allow_private:
                lines.append(f"Private addresses also allowed: {_few(self.allow_private, 'private exception')}.")
            for index, rule in enumerate(self.l7_rules, start=1):
                methods = ", ".join(rule.get("methods") or []) or "any method"
                verb = "allowed" if rule.get("action") == "allow" else "denied"
                target = f"{rule.get('domain')}{rule.get('path_prefix') or '/'}*"
                lines.append(f"HTTP rule {index}: {methods} to {target} is {verb}.")
                if rule.get("methods") or (rule.get("path_prefix") or "/") != "/":
                    # A backend that reads HTTPS by its SNI only (Docker) sees the host, not this.
                    lines.append(
                        f"HTTP rule {index} over HTTPS, where only the host is checked (SNI, no decryption): "
                        + (
                            f"every request to {rule.get('domain')} is allowed."
                            if rule.get("action") == "allow"
                            else "it cannot be checked and does not apply."
                        )
                    )
        if self.allow_public_traffic:
            lines.append(
                "Inbound: on. Sandbox ports are reachable at their URLs: on Docker with the session's traffic"
                " token or a signed link; on E2B and Cube by anyone with the URL."
            )
        else:
            lines.append(
                "Inbound: off. Sandbox ports are not reachable from outside (on E2B and Cube, only with the"
                " sandbox's traffic token)."
            )
        return lines


class AuditAction(models.TextChoices):
    """Every action the audit log records, named once. The value is what the row stores."""

    API_TOKEN_CREATE = "api_token.create", "API token created"
    API_TOKEN_REVOKE = "api_token.revoke", "API token revoked"
    COMMAND_INPUT = "command.input", "Input sent to a command"
    COMMAND_KILL = "command.kill", "Command killed"
    COMMAND_START = "command.start", "Command started"
    EGRESS_ALLOW_SESSION = "egress.allow_session", "Egress allowed for a session"
    EGRESS_ALLOW_SPACE = "egress.allow_space", "Egress allowed for the space"
    EGRESS_REVOKE_SESSION = "egress.revoke_session", "Session egress exception revoked"
    JOB_CANCEL = "job.cancel", "Job cancelled"
    JOB_START = "job.start", "Job started"
    MEMBER_ADD = "member.add", "Member added"
    MEMBER_REMOVE = "member.remove", "Member removed"
    MEMBER_ROLE = "member.role", "Member role changed"
    NETWORK_POLICY_APPLY = "network_policy.apply", "Network policy applied to running sandboxes"
    NETWORK_POLICY_UPDATE = "network_policy.update", "Network policy changed"
    PLATFORM_BACKEND_CREATE = "platform_backend.create", "Platform backend registered"
    PLATFORM_BACKEND_UPDATE = "platform_backend.update", "Platform backend changed"
    RETENTION_PRUNE = "retention.prune", "Old records pruned"
    SANDBOX_CONFIG_CREATE = "sandbox_config.create", "Sandbox config created"
    SANDBOX_CONFIG_DELETE = "sandbox_config.delete", "Sandbox config deleted"
    SANDBOX_CONFIG_UPDATE = "sandbox_config.update", "Sandbox config changed"
    SECRETS_ROTATE = "secrets.rotate", "Encryption key rotated"
    SESSION_COLLECT_ARTIFACTS = "session.collect_artifacts", "Session artifacts collected"
    SESSION_CREATE = "session.create", "Session created"
    SESSION_DELETE = "session.delete", "Session deleted"
    SESSION_FILE_WRITE = "session.file_write", "File written in a session"
    SESSION_INBOUND_LINK = "session.inbound_link", "Inbound link issued"
    SESSION_INPUT_UPLOAD = "session.input_upload", "Input uploaded to a session"
    SESSION_PAUSE = "session.pause", "Session paused"
    SESSION_REBUILD = "session.rebuild", "Session rebuilt"
    SESSION_RESUME = "session.resume", "Session resumed"
    SESSION_SANDBOX_CREATE = "session.sandbox_create", "Session sandbox created"
    SESSION_UPDATE = "session.update", "Session labels or keep-awake changed"
    SESSION_IMAGE_CLEAR = "session_image.clear", "Session image cleared"
    SESSION_IMAGE_SET = "session_image.set", "Session image set"
    SKILL_CONFIRM_DEPENDENCIES = "skill.confirm_dependencies", "Skill dependencies confirmed"
    SKILL_DELETE_VERSION = "skill.delete_version", "Skill version deleted"
    SKILL_GIT_HOSTS = "skill.git_hosts", "Allowed git hosts for skills changed"
    SKILL_IMPORT = "skill.import", "Skill imported"
    SKILL_IMAGE_DELETE_SNAPSHOTS = "skill_image.delete_snapshots", "Skill image snapshots deleted"
    SKILL_IMAGE_INSTALL = "skill_image.install", "Skill installed"
    SKILL_IMAGE_ROLLBACK = "skill_image.rollback", "Skill image rolled back"
    SKILL_IMAGE_UNINSTALL = "skill_image.uninstall", "Skill uninstalled"
    SNAPSHOT_DELETE = "snapshot.delete", "Snapshot deleted"
    SPACE_CREATE = "space.create", "Space created"
    SPACE_DELETE = "space.delete", "Space deleted"
    SPACE_LIMITS = "space.limits", "Space limits changed"
    SPACE_UPDATE = "space.update", "Space changed"
    TEMPLATE_DELETE = "template.delete", "Template deleted"
    TERMINAL_CLOSE = "terminal.close", "Terminal closed"
    TERMINAL_OPEN = "terminal.open", "Terminal opened"
    UNMANAGED_DELETE = "unmanaged.delete", "Unmanaged resource deleted"
    USER_CREATE = "user.create", "User created"
    USER_DEACTIVATE = "user.deactivate", "User deactivated"
    USER_INVITE = "user.invite", "User invited"
    USER_INVITE_ACCEPT = "user.invite_accept", "Invitation accepted"
    USER_LOGOUT_EVERYWHERE = "user.logout_everywhere", "User logged out everywhere"
    USER_OIDC_LINK = "user.oidc_link", "OIDC identity linked"
    USER_REACTIVATE = "user.reactivate", "User reactivated"
    USER_EMAIL_CLEARED = "user.email_cleared", "User's email cleared (another user had it)"


class AuditEvent(models.Model):
    """One write with side effects: who did what, to what, where, from which address."""

    id = models.BigAutoField(primary_key=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept when the user is deleted, so the log still says who it was.
    actor_name = models.CharField(max_length=150, blank=True)
    space = models.ForeignKey(Space, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    space_name = models.CharField(max_length=200, blank=True)
    action = models.CharField(max_length=64, db_index=True, choices=AuditAction.choices)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=128, blank=True)
    details = models.JSONField(default=dict, blank=True)
    source_ip = models.GenericIPAddressField(null=True, blank=True)
    time = models.DateTimeField(auto_now_add=True)  # indexed first in audit_list_order

    class Meta:
        ordering = ["-time", "-id"]
        # The audit list's keyset order (console.views.AUDIT_ORDER), alone and behind the space.
        indexes = [
            models.Index(fields=["-time", "-id"], name="audit_list_order"),
            models.Index(fields=["space", "-time", "-id"], name="audit_space_order"),
        ]

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_name or 'system'} {self.action}"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


FINISHED_JOB_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


class AdminJob(models.Model):
    """A long action (skill install, backend verification, reaper pass) the UI follows."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=64, db_index=True)
    space = models.ForeignKey(Space, null=True, blank=True, on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True)
    progress = models.PositiveSmallIntegerField(default=0)
    log = models.JSONField(default=list, blank=True)  # [{"time": iso, "message": str}]
    params = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=255, blank=True)
    # The `WorkerProcess` running it (or, in the embedded mode, about to): when that process
    # dies, the job fails "Interrupted by a restart" (console/processes.py).
    owner_process = models.UUIDField(null=True, blank=True, db_index=True)
    created = models.DateTimeField(auto_now_add=True)  # indexed first in job_list_order
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        # The jobs list's keyset order (console.views.JOB_ORDER), alone and behind each of its
        # equality filters: the space, the status, the kind.
        indexes = [
            models.Index(fields=["-created", "-id"], name="job_list_order"),
            models.Index(fields=["space", "-created", "-id"], name="job_space_order"),
            models.Index(fields=["status", "-created", "-id"], name="job_status_order"),
            models.Index(fields=["kind", "-created", "-id"], name="job_kind_order"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} job {self.id} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("console:job_detail", kwargs={"job_id": self.id})

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_JOB_STATUSES

    @property
    def duration_s(self) -> float | None:
        if self.started is None:
            return None
        end = self.finished
        if end is None:
            from django.utils import timezone

            end = timezone.now()
        return (end - self.started).total_seconds()

    def to_summary(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "kind": self.kind,
            "status": self.status,
            "progress": self.progress,
        }


class WorkerProcess(models.Model):
    """A console process (Daphne, Celery worker, a management command) that owns work: exec
    slots, background commands, jobs. It registers itself (a random id, host, pid and what
    tells that pid apart from a later one with the same number) and heartbeats; when its
    heartbeat is older than processes.heartbeat_window_s, or it was on this host and its pid is
    gone, what it owned is released and the row deleted (console/processes.py)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=32, blank=True, help_text="web, worker, or the command that ran it.")
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    # Linux: the boot id and the pid's start time in clock ticks, so a pid number reused
    # after the process died never passes for it ("" where /proc does not say).
    pid_identity = models.CharField(max_length=100, blank=True)
    started = models.DateTimeField()
    heartbeat = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["started"]

    def __str__(self) -> str:
        return f"{self.kind or 'process'} {self.host}:{self.pid}"


class MetricSample(models.Model):
    """One minute of the console's own time series (console/activity.py): the /metrics series
    read at `time`. `totals` holds the counters as read (cumulative, to diff the next sample
    against); `values` the gauges as read and each counter's increase since the previous
    sample, resets handled. `interval_s` is the time since that sample (None: no previous
    sample close enough, so no increases)."""

    id = models.BigAutoField(primary_key=True)
    time = models.DateTimeField(db_index=True)
    interval_s = models.FloatField(null=True, blank=True)
    values = models.JSONField(default=dict)
    totals = models.JSONField(default=dict)

    class Meta:
        ordering = ["-time"]

    def __str__(self) -> str:
        return f"metrics at {self.time:%Y-%m-%d %H:%M:%S}"

    def get_absolute_url(self) -> str:
        return reverse("console:activity")


class Invitation(models.Model):
    """A one-time link that lets an invited user choose a password (console/users.py).

    Only the SHA-256 of the link's token is stored; the link is shown once, to the admin
    who made it. It works once (`used`) until `expires`; a newer invitation revokes it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="invitations")
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField()
    used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"invitation of {self.user} until {self.expires:%Y-%m-%d %H:%M}"


def users_with_email(email: str) -> models.QuerySet[Any]:
    """Users whose email is `email` as the unique index on lower(email) compares them (console
    migration 0014): in the database, with its lower(). `email__iexact` compares upper() of
    each, which some letters pass where lower() does not (the Kelvin sign lowers to "k" but
    uppers to itself), so a check by it lets by what the index then refuses."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.alias(email_lower=Lower("email")).filter(email_lower=Lower(models.Value(email)))


class OidcIdentity(models.Model):
    """The OpenID Connect subject a user signs in as: one subject per user and issuer, so
    two different subjects with one email are never merged (console/oidc.py)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="one_user_per_oidc_subject"),
            models.UniqueConstraint(fields=["user", "issuer"], name="one_oidc_subject_per_user_issuer"),
        ]

    def __str__(self) -> str:
        return f"{self.user} as {self.subject} at {self.issuer}"
