"""Writes with side effects for sandbox configs, template builds and session images, and the
connection test.

A backend is reached through `bridge.get_backend(config)` only. May import
`sandboxes.backends`, `sandboxes.models`, `console` and `catalog.bridge`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from console.crypto import REDACTED, decrypt, encrypt
from console.models import AuditAction, Space
from console.services import Actor, ServiceError, record_audit

from ..backends.base import (
    META_CONFIG,
    META_INSTALLATION,
    META_PURPOSE,
    ErrorKind,
    ExecRequest,
    Finding,
    ListQuery,
    NetworkSpec,
    RemoteError,
    SandboxSpec,
    TemplateBuildSpec,
    is_snapshot_id,
)
from ..models import IDENTITY_FIELDS, PlatformBackend, SandboxConfig, Session, TemplateRecord
from .bridge import config_fingerprint, console_metadata, get_backend, sandbox_resources, template_owner
from .network import network_spec_for, refuse_unless_honoured

# What a space admin sets; the infrastructure is the platform backend's (sandboxes.catalog.platform).
CONFIG_FIELDS = (
    "name",
    "backend",
    "default_template",
    "cpus",
    "memory_mb",
    "pids_limit",
    "disk_mb",
    "idle_mode",
    "idle_timeout_s",
    "persistent_workspace",
    "protocol_pin",
    "is_default",
)


# --- Configs -----------------------------------------------------------------------------


def count_live_sandboxes(config: SandboxConfig) -> int:
    """Sandboxes this console created with `config` that still exist on the backend."""
    backend = get_backend(config)
    query = ListQuery(metadata={META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID, META_CONFIG: str(config.id)})
    return sum(1 for _ in backend.iter_sandboxes(query))


def _check_template_choice(template_id: str) -> None:
    if is_snapshot_id(template_id):
        raise ServiceError(
            "A snapshot cannot be a config's default template; snapshots live in their own list.",
            field_errors={"default_template": ["snapshot ids (snap-…) are not templates"]},
        )


def _check_template_visible(config: SandboxConfig) -> None:
    """Another tenant's template (on a shared engine) is no choice for this space's config.
    Unlisted or unreachable: left to the connection test, as before."""
    try:
        backend = get_backend(config)
        templates = backend.templates()
        listed = templates.list() if templates is not None else []
        found = next((t for t in listed if t.template_id == config.default_template), None)
        if found is None and templates is not None:
            # Another name of a listed image (a repository without its tag, an image id):
            # judged by what the backend resolves it to, not by the text.
            with suppress(RemoteError):
                found = templates.get(config.default_template)
    except RemoteError:
        return
    if found is not None and template_owner(found, config) is None:
        raise ServiceError(
            "That template is not offered to this space.",
            field_errors={"default_template": ["not a template of the platform or of this space"]},
        )


def _apply_api_key(config: SandboxConfig, api_key: str | None) -> bool:
    """Set the key unless the form sent back the redaction placeholder. True if it changed."""
    if api_key is None or api_key == REDACTED:
        return False
    if api_key == decrypt(config.api_key_encrypted):
        return False
    config.api_key_encrypted = encrypt(api_key)
    return True


def _check_backend_choice(space: Space, backend: PlatformBackend, data: dict[str, Any], api_key: str | None) -> None:
    """The backend is granted to the space, the resources stay within its limits, and an own
    API key is given only where the platform allows one (to a public endpoint)."""
    if not backend.spaces.filter(pk=space.pk).exists():
        raise ServiceError(
            "This backend is not granted to the space.", field_errors={"backend": ["not granted to this space"]}
        )
    limits = (
        ("cpus", backend.max_cpus, "CPU cores"),
        ("memory_mb", backend.max_memory_mb, "MiB"),
        ("pids_limit", backend.max_pids, "processes"),
        ("disk_mb", backend.max_disk_mb, "MiB of disk"),
    )
    errors = {
        field: [f"at most {limit} {unit} on {backend.name}"]
        for field, limit, unit in limits
        if field in data and data[field] is not None and data[field] > limit
    }
    if errors:
        raise ServiceError("Resources above what the platform allows on this backend.", field_errors=errors)
    if api_key and api_key != REDACTED and not backend.allow_space_api_key:
        raise ServiceError(
            "This backend uses the platform's credentials.",
            field_errors={"api_key": ["the platform does not let spaces bring their own key to this backend"]},
        )
    if api_key and api_key != REDACTED:
        from ..backends.guard import check_endpoint

        try:  # an own key is only ever sent to a public endpoint
            check_endpoint(backend.endpoint, allow_private=False)
        except RemoteError as exc:
            raise ServiceError(exc.message, field_errors={"api_key": [exc.message]}) from None


def _lock_backend_choice(space: Space, config: SandboxConfig, data: dict[str, Any], api_key: str | None) -> None:
    """Inside the write's transaction: lock the backend row and check the grant and limits
    again, so a platform admin lowering limits or withdrawing the grant at the same moment
    either waits for this write (and sees it) or is seen by it (sandboxes.catalog.platform locks too)."""
    config.backend = PlatformBackend.objects.select_for_update().get(pk=config.backend_id)
    _check_backend_choice(space, config.backend, data, api_key)


def do_create_config(space: Space, *, data: dict[str, Any], api_key: str, actor: Actor) -> SandboxConfig:
    """A config of the space on a backend granted to it (one audit row)."""
    _check_template_choice(data["default_template"])
    _check_backend_choice(space, data["backend"], data, api_key)
    config = SandboxConfig(space=space, **{k: data[k] for k in CONFIG_FIELDS if k in data})
    _apply_api_key(config, api_key)
    _check_template_visible(config)
    try:
        with transaction.atomic():
            _lock_backend_choice(space, config, data, api_key)
            # The space's first config serves its sessions unless another is chosen.
            has_default = SandboxConfig.objects.select_for_update().filter(space=space, is_default=True).exists()
            if config.is_default and has_default:
                SandboxConfig.objects.filter(space=space, is_default=True).update(is_default=False)
            config.is_default = config.is_default or not has_default
            config.save()
            record_audit(
                actor,
                AuditAction.SANDBOX_CONFIG_CREATE,
                space=space,
                target_type="sandbox_config",
                target_id=config.id,
                target_name=config.name,
                details={"name": config.name, "kind": config.kind, "backend": str(config.backend_id)},
            )
    except IntegrityError:
        raise ServiceError(
            "This space already has a config with this name.", field_errors={"name": ["already used in this space"]}
        ) from None
    return config


def do_update_config(
    config: SandboxConfig,
    *,
    data: dict[str, Any],
    api_key: str | None,
    actor: Actor,
) -> SandboxConfig:
    """Save changes. Identity fields (backend, own key) are frozen while sandboxes live."""
    _check_template_choice(data.get("default_template", config.default_template))
    merged = {k: data.get(k, getattr(config, k)) for k in ("cpus", "memory_mb", "pids_limit", "disk_mb")}
    _check_backend_choice(config.space, data.get("backend", config.backend), merged, api_key)
    original = SandboxConfig.objects.select_related("backend").get(pk=config.pk)
    changed = [k for k in CONFIG_FIELDS if k in data and getattr(original, k) != data[k]]
    key_changed = _apply_api_key(config, api_key)
    identity_changed = [k for k in changed if k in IDENTITY_FIELDS] + (["api_key"] if key_changed else [])
    if identity_changed:
        try:
            live = count_live_sandboxes(original)
        except RemoteError:
            live = 0  # The old backend does not answer: nothing reachable can be orphaned.
        if live:
            config.api_key_encrypted = original.api_key_encrypted
            raise ServiceError(
                f"{live} live sandbox(es) use this config: delete them before changing "
                + ", ".join(identity_changed)
                + ", or create a new config."
            )
    if not changed and not key_changed:
        return config
    for key in changed:
        setattr(config, key, data[key])
    if "backend" in changed:
        # What the old backend's server reported is not the new one's (another kind's protocol
        # would be refused by the new adapter): detected again by the next connection test.
        config.backend_protocol = config.backend_version = ""
    if "default_template" in changed or "backend" in changed:
        _check_template_visible(config)
    try:
        with transaction.atomic():
            _lock_backend_choice(config.space, config, merged, api_key)
            if "is_default" in changed and config.is_default:
                SandboxConfig.objects.filter(space=config.space_id, is_default=True).exclude(pk=config.pk).update(
                    is_default=False
                )
            config.save()
            record_audit(
                actor,
                AuditAction.SANDBOX_CONFIG_UPDATE,
                space=config.space,
                target_type="sandbox_config",
                target_id=config.id,
                target_name=config.name,
                details={
                    "changed": changed + (["api_key"] if key_changed else []),
                    "before": {k: str(getattr(original, k)) for k in changed},
                    "after": {k: str(data[k]) for k in changed},
                },
            )
    except IntegrityError:
        raise ServiceError(
            "This space already has a config with this name.", field_errors={"name": ["already used in this space"]}
        ) from None
    return config


def do_delete_config(config: SandboxConfig, *, actor: Actor, torn_down: dict[str, int] | None = None) -> None:
    """Delete a config's row. Called by the teardown job (`sandboxes.sessions.teardown`)
    once its sessions, sandboxes, volumes and images are gone (`torn_down`: what went);
    without it, refused while anything of the config is left."""
    from ..models import SessionImage

    if torn_down is None:
        if SessionImage.objects.filter(config=config).exists():
            raise ServiceError("A skill image of this space lives on this config: delete the config from its page.")
        if config.sessions.exists():
            raise ServiceError(f"{config.sessions.count()} session(s) use this config: delete them first.")
        try:
            live = count_live_sandboxes(config)
        except RemoteError:
            live = 0
        if live:
            raise ServiceError(f"{live} live sandbox(es) use this config: delete them first.")
    with transaction.atomic():
        record_audit(
            actor,
            AuditAction.SANDBOX_CONFIG_DELETE,
            space=config.space,
            target_type="sandbox_config",
            target_id=config.id,
            target_name=config.name,
            details={"name": config.name, "kind": config.kind, **({"torn_down": torn_down} if torn_down else {})},
        )
        config.delete()


# --- Templates ---------------------------------------------------------------------------
# Listing and deleting are scoped to the space in sandboxes.catalog.


def build_template(config: SandboxConfig, spec: TemplateBuildSpec, *, platform: bool = False) -> str:
    """Build a template of the config's space: it carries the space's labels, so only that
    space sees it (sandboxes.catalog). A platform template (`platform`, started by platform
    admins only) carries none and is offered to every space."""
    if not platform:
        spec = replace(spec, labels={**spec.labels, **console_metadata(config)})
    backend = get_backend(config)
    templates = backend.templates()
    if templates is None:
        raise RemoteError(ErrorKind.UNSUPPORTED, f"{backend.label} cannot build templates from the console")
    template_id = templates.create(spec).template_id
    # E2B and Cube drop the labels: this record is what tells the space's build from the platform's.
    TemplateRecord.objects.update_or_create(
        fingerprint=config_fingerprint(config),
        template_id=template_id,
        defaults={"owner_space": None if platform else config.space_id},
    )
    return template_id


# --- Test connection ---------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    name: str
    ok: bool
    ms: float
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "ms": round(self.ms, 1), "detail": self.detail}


def _timed(name: str, func: Callable[[], str]) -> StepResult:
    started = time.perf_counter()
    try:
        detail = func()
    except RemoteError as exc:
        return StepResult(name, False, (time.perf_counter() - started) * 1000, f"{exc.kind}: {exc.message}")
    return StepResult(name, True, (time.perf_counter() - started) * 1000, detail)


def findings_step(findings: list[Finding]) -> str:
    """A backend's preflight findings in words: raises (the step fails) on a failed blocking
    one, naming every failed one; else says what was checked ("" for none)."""
    if not findings:
        return ""
    failed = [f for f in findings if not f.ok]
    said = "; ".join(f"{f.name}: {f.detail}" for f in failed)
    if any(f.blocking for f in failed):
        raise RemoteError(ErrorKind.INVALID, said)
    passed = f"{len(findings) - len(failed)} of {len(findings)} checks passed"
    return f"{passed}; {said}" if failed else passed


def run_connection_test(config: SandboxConfig, report: Callable[[StepResult], None]) -> list[StepResult]:
    """Health, whether persistent workspaces can be made (when the config keeps them), then a
    short create -> exec -> delete, each step timed. Stops at a failure."""
    steps: list[StepResult] = []
    sandbox_ids: list[str] = []
    backend = get_backend(config)

    def health() -> str:
        info = backend.health()
        if not info.ok:
            raise RemoteError(ErrorKind.UNAVAILABLE, info.detail or "unhealthy")
        recorded = {"backend_version": info.version[:100], "backend_protocol": info.protocol[:16]}
        changed = {k: v for k, v in recorded.items() if v and v != getattr(config, k)}
        if changed:
            SandboxConfig.objects.filter(pk=config.pk).update(**changed)
        found = findings_step(backend.preflight())  # the parts and permissions it needs, where it says
        return f"{info.version or 'ok'}; {found}" if found else (info.version or "ok")

    def create() -> str:
        spec = SandboxSpec(
            template_id=config.default_template,
            network=NetworkSpec(allow_internet_access=False, allow_public_traffic=False),
            metadata=console_metadata(config, **{META_PURPOSE: "connection-test"}),
            resources=sandbox_resources(config),
            timeout_s=120,
        )
        info = backend.create(spec)
        sandbox_ids.append(info.sandbox_id)
        return f"sandbox {info.sandbox_id[:12]} from {config.default_template}"

    def execute() -> str:
        result = backend.exec(sandbox_ids[0], ExecRequest(argv=("sh", "-c", "echo ok; id -u"), timeout_s=30))
        out = result.stdout.decode(errors="replace").split()
        if result.exit_code != 0 or out[:1] != ["ok"]:
            raise RemoteError(ErrorKind.INTERNAL, f"exit {result.exit_code}: {result.stderr[:200]!r}")
        return f"echo ok as uid {out[1] if len(out) > 1 else '?'}"

    def delete() -> str:
        backend.delete(sandbox_ids.pop())
        return "deleted"

    plan: list[tuple[str, Callable[[], str]]] = [("health", health)]
    volumes = backend.volumes() if config.persistent_workspace else None
    if volumes is not None:
        plan.append(("persistent workspace", volumes.check))

    def policy() -> str:
        refuse_unless_honoured(network_spec_for(config.space), backend, config.name)
        return "the space's network policy can be enforced here"

    plan += [("create", create), ("exec", execute), ("delete", delete), ("network policy", policy)]
    try:
        for name, func in plan:
            step = _timed(name, func)
            steps.append(step)
            report(step)
            if not step.ok:
                break
    finally:
        for leftover in sandbox_ids:
            with suppress(RemoteError):
                backend.delete(leftover)
    return steps


# --- Session images (written by the skills app) ------------------------------------------


def do_set_session_image(
    space: Space,
    config: SandboxConfig,
    *,
    snapshot_id: str,
    fingerprint: str,
    label: str,
    actor: Actor,
) -> None:
    """Point the space's new sessions on `config` at a snapshot, and mark that config's sessions
    stale (those on the space's other configs do not start from it).

    The skills app records skill images through this function, so the runtime never imports
    skills. A pointer without a fingerprint is refused: the runtime could never tell whether
    the snapshot belongs to the config's current backend account.
    """
    from ..models import SessionImage

    if not fingerprint:
        raise ServiceError("A session image needs the fingerprint of the account that holds its snapshot.")
    if not snapshot_id:
        raise ServiceError("A session image needs a snapshot id.")
    with transaction.atomic():
        SessionImage.objects.update_or_create(
            space=space,
            config=config,
            defaults={"snapshot_id": snapshot_id, "fingerprint": fingerprint, "label": label[:200]},
        )
        stale = mark_config_stale(space, config)
        record_audit(
            actor,
            AuditAction.SESSION_IMAGE_SET,
            space=space,
            target_type="sandbox_config",
            target_id=config.id,
            target_name=config.name,
            details={"snapshot_id": snapshot_id, "label": label, "sessions_marked_stale": stale},
        )


def do_clear_session_image(space: Space, config: SandboxConfig, *, actor: Actor) -> None:
    """Sessions go back to the config's default template (e.g. every skill uninstalled)."""
    from ..models import SessionImage

    with transaction.atomic():
        deleted, _ = SessionImage.objects.filter(space=space, config=config).delete()
        if not deleted:
            return
        stale = mark_config_stale(space, config)
        record_audit(
            actor,
            AuditAction.SESSION_IMAGE_CLEAR,
            space=space,
            target_type="sandbox_config",
            target_id=config.id,
            target_name=config.name,
            details={"sessions_marked_stale": stale},
        )


def sessions_using_snapshot(snapshot_id: str) -> int:
    """Sessions whose current sandbox was started from `snapshot_id`."""
    from ..models import Session

    return Session.objects.filter(template_id=snapshot_id).exclude(sandbox_id="").count()


# Staleness: sessions whose image changed start afresh at their next turn (runtime.resolve).


def mark_config_stale(space: Space, config: SandboxConfig) -> int:
    """Declare stale the sessions that start from this config's image (its skill image
    changed); sessions on the space's other configs keep their sandboxes. Returns how many."""
    return Session.objects.filter(space=space, config=config).update(stale_at=timezone.now())


def mark_space_stale(space: Space) -> int:
    """Declare every session of the space stale, whatever its config; returns how many."""
    return Session.objects.filter(space=space).update(stale_at=timezone.now())
