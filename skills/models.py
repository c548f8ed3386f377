"""The skill catalog: skills, their content-addressed versions, and the versions' files.

Skills are platform-wide (not space-scoped). A version is identified by the SHA-256 of its
content (see `skills.services.content_hash`); its files live in the database as bytes, so an
import is one transaction and a failure leaves nothing behind.
"""

from __future__ import annotations

import stat
import uuid

from django.conf import settings
from django.db import models
from django.urls import reverse


class Skill(models.Model):
    """A skill name in the catalog, pointing at its latest imported version."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=255, unique=True)
    latest_version = models.ForeignKey(
        "SkillVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("skills:skill_detail", kwargs={"skill_id": self.id})


class SkillVersion(models.Model):
    """One immutable content of a skill: parsed frontmatter, body, findings, dependencies."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    skill = models.ForeignKey(Skill, on_delete=models.CASCADE, related_name="versions")
    # SHA-256 over the sorted (path, mode, content) of its files.
    content_hash = models.CharField(max_length=64, unique=True)
    # The folder the skill came in (may differ from `name`: a warning, see docs/skills.md).
    folder_name = models.CharField(max_length=255)
    description = models.TextField()
    license = models.TextField(blank=True)
    compatibility = models.TextField(blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    allowed_tools = models.JSONField(default=list, blank=True)
    # Frontmatter keys outside the six of the spec, kept for display.
    extra_frontmatter = models.JSONField(default=dict, blank=True)
    body = models.TextField(blank=True)
    # [{"severity": "warning"|"info", "message": str, "line": int|None}]
    warnings = models.JSONField(default=list, blank=True)
    # Denormalised from `warnings` so the list page needs no JSON work per row.
    warning_count = models.PositiveIntegerField(default=0)
    # What the installer installs: the declarations, plus the inferred needs an admin confirmed.
    # {"pip": [{"requirement", "name", "source"}], "npm": [{"name", "version", "source"}], "debian": [str]}
    dependencies = models.JSONField(default=dict, blank=True)
    # The report of skills.requirements_report: {"declared", "inferred", "ignored", "declared_plan"}.
    dependency_report = models.JSONField(default=dict, blank=True)
    # The inferred needs confirmed into the install plan: {"keys": [...], "by": name, "at": ISO time}.
    confirmed_dependencies = models.JSONField(default=dict, blank=True)
    size = models.BigIntegerField(default=0)
    file_count = models.PositiveIntegerField(default=0)
    origin = models.CharField(max_length=300, blank=True)
    # The git commit this version was imported from (skills.sources), else ''.
    source_commit = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    imported_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    imported_by_name = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["skill", "-created"], name="skill_version_created")]

    def __str__(self) -> str:
        return f"{self.skill.name} @ {self.short_hash}"

    def get_absolute_url(self) -> str:
        return reverse("skills:version_detail", kwargs={"version_id": self.id})

    @property
    def short_hash(self) -> str:
        return self.content_hash[:12]


class GitSource(models.Model):
    """Where a skill's versions come from: a git repository, a branch or tag, a folder in it.

    `commit` is the commit of the latest import; `remote_commit` the one the ref named at the
    last check (`checked`), or the check's error. A newer commit exists when they differ.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    skill = models.OneToOneField(Skill, on_delete=models.CASCADE, related_name="git_source")
    url = models.CharField(max_length=1000)
    ref = models.CharField(max_length=200, blank=True, help_text="Branch or tag; empty: the default branch.")
    path = models.CharField(max_length=1024, blank=True, help_text="The skill's folder; empty: the root.")
    commit = models.CharField(max_length=64)
    remote_commit = models.CharField(max_length=64, blank=True)
    checked = models.DateTimeField(null=True, blank=True)
    check_error = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["skill__name"]

    def __str__(self) -> str:
        return f"{self.url} {self.path}".strip()

    def get_absolute_url(self) -> str:
        return reverse("skills:skill_detail", kwargs={"skill_id": self.skill_id}) + "#source"

    @property
    def has_newer_commit(self) -> bool:
        return bool(self.remote_commit) and self.remote_commit != self.commit


class GitHostPolicy(models.Model):
    """The platform's one row of rules for git imports: allowed hosts and local paths."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    # One entry per line: `host` (any port) or `host:port`.
    allowed_hosts = models.TextField(blank=True)
    allow_local_paths = models.BooleanField(
        default=False, help_text="Allow file:// URLs: repositories on the console's own disk."
    )
    updated = models.DateTimeField(auto_now=True)
    updated_by_name = models.CharField(max_length=150, blank=True)

    def __str__(self) -> str:
        return "allowed git hosts"

    def get_absolute_url(self) -> str:
        return reverse("skills:git_hosts")

    @property
    def host_list(self) -> list[str]:
        return [line.strip() for line in self.allowed_hosts.splitlines() if line.strip()]


class SkillFile(models.Model):
    """One regular file of a version: path inside the skill, permission bits, bytes."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    version = models.ForeignKey(SkillVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=1024)
    mode = models.PositiveIntegerField()
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    is_text = models.BooleanField(default=False)
    content = models.BinaryField()

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["version", "path"], name="one_skill_file_per_path")]

    def __str__(self) -> str:
        return self.path

    def get_absolute_url(self) -> str:
        return reverse("skills:file_detail", kwargs={"file_id": self.id})

    @property
    def mode_string(self) -> str:
        """Like `ls -l`: -rwxr-xr-x."""
        return stat.filemode(stat.S_IFREG | self.mode)

    @property
    def depth(self) -> int:
        return self.path.count("/")


class SkillImageStatus(models.TextChoices):
    BUILDING = "building", "Building"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
    RETIRED = "retired", "Retired (snapshot deleted)"


class SkillImageAction(models.TextChoices):
    INSTALL = "install", "Install"
    UNINSTALL = "uninstall", "Uninstall"


class SkillImage(models.Model):
    """One generation of a space's skill image on one config: a snapshot with skills installed.

    Generations count 1, 2, … per (space, config). The generation new sessions start from is
    not stored here: it is the sandboxes-side `SessionImage` pointer (written only through
    `sandboxes.catalog.services.do_set_session_image`), and `is_current` is derived from it, so the
    two can never disagree. A ready generation always has a snapshot id and the fingerprint
    of the backend account holding it ("no fingerprint, no record", a database constraint).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    space = models.ForeignKey("console.Space", on_delete=models.CASCADE, related_name="skill_images")
    config = models.ForeignKey("sandboxes.SandboxConfig", on_delete=models.CASCADE, related_name="skill_images")
    generation = models.PositiveIntegerField()
    # The generation this one was built on (None: built from the config's default template).
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=16, choices=SkillImageAction.choices, default=SkillImageAction.INSTALL)
    # What the action was about: the skill installed or uninstalled (for the history).
    subject = models.CharField(max_length=300, blank=True)
    base_template = models.CharField(
        max_length=255, blank=True, help_text="Template or snapshot the build started from."
    )
    snapshot_id = models.CharField(max_length=255, blank=True)
    fingerprint = models.CharField(max_length=64, blank=True)
    # [{"name", "version_id", "content_hash", "size", "file_count", "dependencies": {...}, "installed": [...]}]
    manifest = models.JSONField(default=list, blank=True)
    status = models.CharField(
        max_length=16, choices=SkillImageStatus.choices, default=SkillImageStatus.BUILDING, db_index=True
    )
    # The exact versions this generation's skills got: {"pip": {normalised name: version}}
    # (skills.install.lock). Carried to later generations; a rebuild installs with it.
    lock = models.JSONField(default=dict, blank=True)
    # {"create": seconds, "copy": seconds, ...} in pipeline order.
    timings = models.JSONField(default=dict, blank=True)
    log = models.TextField(blank=True)
    failed_step = models.CharField(max_length=32, blank=True)
    error = models.TextField(blank=True)
    job = models.ForeignKey("console.AdminJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_name = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-generation"]
        constraints = [
            models.UniqueConstraint(fields=["space", "config", "generation"], name="one_skill_image_per_generation"),
            models.CheckConstraint(
                condition=~models.Q(status="ready") | (~models.Q(snapshot_id="") & ~models.Q(fingerprint="")),
                name="ready_skill_image_has_snapshot_and_fingerprint",
            ),
        ]

    def __str__(self) -> str:
        return f"skill image generation {self.generation} of {self.space} on {self.config}"

    def get_absolute_url(self) -> str:
        return reverse("skills:image_detail", kwargs={"space_id": self.space_id}) + f"?config={self.config_id}"

    @property
    def is_current(self) -> bool:
        """Derived from the sandboxes-side pointer (never stored here); `history()` annotates it."""
        annotated = getattr(self, "pointed", None)
        if annotated is not None:
            return bool(annotated)
        from sandboxes.models import SessionImage

        return (
            self.status == SkillImageStatus.READY
            and SessionImage.objects.filter(
                space_id=self.space_id,
                config_id=self.config_id,
                snapshot_id=self.snapshot_id,
                fingerprint=self.fingerprint,
            ).exists()
        )

    @property
    def skill_names(self) -> list[str]:
        return [str(entry.get("name", "")) for entry in self.manifest]

    @property
    def total_seconds(self) -> float:
        return round(sum(float(value) for value in self.timings.values()), 2)


class SkillImageItem(models.Model):
    """One skill held by a generation: the queryable side of its manifest."""

    image = models.ForeignKey(SkillImage, on_delete=models.CASCADE, related_name="items")
    skill = models.ForeignKey(Skill, null=True, on_delete=models.SET_NULL, related_name="image_items")
    version = models.ForeignKey(SkillVersion, null=True, on_delete=models.SET_NULL, related_name="image_items")
    name = models.CharField(max_length=255)
    content_hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["image", "name"], name="one_skill_per_image_name")]

    def __str__(self) -> str:
        return f"{self.name} @ {self.content_hash[:12]} in {self.image}"
