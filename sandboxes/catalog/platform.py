"""Platform-owned backends: the infrastructure platform admins register and grant to spaces.

Writes here are for platform admins only (checked again in every `do_*`, not only in the
views). Space admins reach a backend only by choosing a granted one for a config
(sandboxes.catalog.services.do_create_config / do_update_config).
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from console.access import is_platform_admin
from console.crypto import REDACTED, decrypt, encrypt
from console.models import AuditAction, Space
from console.services import SYSTEM, Actor, ServiceError, record_audit

from ..backends import all_settings, describe
from ..backends.base import Finding, RemoteError
from ..backends.settings import Scope
from ..models import PlatformBackend, SandboxConfig, Session, SessionState
from .bridge import preflight
from .services import count_live_sandboxes

BACKEND_FIELDS = (
    "name",
    "kind",
    "endpoint",
    "domain",
    "sandbox_url",
    "allow_private_endpoints",
    "allow_space_api_key",
    "workspace_host_root",
    "pip_index_url",
    "pip_find_links",
    "npm_registry_url",
    "npm_folder",
    "apt_folder",
    "apt_url",
    "apt_suite",
    "apt_trusted",
    "max_cpus",
    "max_memory_mb",
    "max_pids",
    "max_disk_mb",
    "max_pool_size",
    "in_cluster",
    "namespace",
    "namespace_mode",
    "storage_class",
    "runtime_class",
    "workspace_size",
    "registry_url",
    "registry_username",
)
# A package source folder wins over its kind's URL: a folder is set only where neither is.
SOURCE_ALTERNATIVES = {
    "pip_find_links": ("pip_index_url",),
    "npm_folder": ("npm_registry_url",),
    "apt_folder": ("apt_url",),
}
# Every secret a kind declares for its platform backend, stored in `<name>_encrypted`.
SECRET_FIELDS = tuple(name for name, declared in all_settings(Scope.BACKEND).items() if declared[0][1].secret)
# Changing these while sandboxes live would orphan them on the old account or engine.
IDENTITY = ("kind", "endpoint", "domain")
LIVE_STATES = (SessionState.RUNNING, SessionState.PAUSED)


class NotPlatformAdmin(ServiceError):
    """Only platform admins register and grant infrastructure."""


def _require_platform_admin(actor: Actor) -> None:
    if not is_platform_admin(actor.user):
        raise NotPlatformAdmin("Only platform admins manage platform backends.")


def _apply_secrets(backend: PlatformBackend, secrets: dict[str, Any]) -> list[str]:
    """Set each secret given; None, *** and '' (for PEM material) keep the stored one. The
    kind's switches that clear secrets (`Setting.clears`) clear them. Returns the names that
    changed."""
    kind = describe(backend.kind)
    changed = []
    for name in SECRET_FIELDS:
        value = secrets.get(name)
        keeps_when_empty = kind.takes(name) and kind.setting(name).keeps_when_empty
        if value is None or value == REDACTED or (value == "" and keeps_when_empty):
            continue
        attr = f"{name}_encrypted"
        if value != decrypt(getattr(backend, attr)):
            setattr(backend, attr, encrypt(value))
            changed.append(name)
    # A kind keeps no secret it does not declare (a switch of kind leaves none behind).
    cleared = [name for name in SECRET_FIELDS if not kind.takes(name)]
    for switch in kind.of(Scope.BACKEND):
        if switch.clears and secrets.get(switch.name):
            cleared.extend(switch.clears)
    for name in cleared:
        if getattr(backend, f"{name}_encrypted"):
            setattr(backend, f"{name}_encrypted", "")
            changed.append(name)
    return changed


def _check_pins_fit_kind(backend: PlatformBackend) -> None:
    """A config pinned to another kind's protocol could not open on this kind (the adapter
    refuses the option): the switch is refused, naming them."""
    kind = describe(backend.kind)
    offered = (
        {value for value, _ in kind.setting("protocol_pin", Scope.CONFIG).choices}
        if kind.takes("protocol_pin", Scope.CONFIG)
        else set()
    )
    pinned = SandboxConfig.objects.filter(backend=backend).exclude(protocol_pin="")
    wrong = [c for c in pinned.select_related("space") if c.protocol_pin not in offered]
    if wrong:
        names = ", ".join(f"{c.space.name}/{c.name}" for c in wrong)
        raise ServiceError(
            f"Configs {names} pin a protocol of another kind: unpin it (Protocol: detect) before changing the kind.",
            field_errors={"kind": [f"configs pin another kind's protocol: {names}"]},
        )


def _check_limits_cover_configs(backend: PlatformBackend) -> None:
    """Lowering a limit below what a config already gives its sandboxes is refused."""
    configs = SandboxConfig.objects.filter(backend=backend)
    over = (
        configs.filter(cpus__gt=backend.max_cpus).count()
        + configs.filter(memory_mb__gt=backend.max_memory_mb).count()
        + configs.filter(pids_limit__gt=backend.max_pids).count()
        + configs.filter(disk_mb__gt=backend.max_disk_mb).count()
    )
    if over:
        raise ServiceError(f"{over} config setting(s) on this backend are above the new limits: lower them first.")


def _save_refused(backend: PlatformBackend) -> ServiceError:
    """What an IntegrityError on saving `backend` meant: its name taken meanwhile, or a row it
    refers to (a granted space) deleted meanwhile. Nothing was saved either way."""
    if PlatformBackend.objects.filter(name=backend.name).exclude(pk=backend.pk).exists():
        return ServiceError("A backend with this name exists.", field_errors={"name": ["already used"]})
    return ServiceError(
        "Something this backend refers to changed while it was saved (a space deleted?). Nothing was saved: try again."
    )


def do_create_platform_backend(
    *, data: dict[str, Any], secrets: dict[str, str | None], spaces: list[Space], actor: Actor
) -> PlatformBackend:
    """Register infrastructure and grant it to `spaces` (one audit row)."""
    _require_platform_admin(actor)
    backend = PlatformBackend(**{k: data[k] for k in BACKEND_FIELDS if k in data})
    _apply_secrets(backend, secrets)
    try:
        with transaction.atomic():
            backend.save()
            backend.spaces.set(spaces)
            record_audit(
                actor,
                AuditAction.PLATFORM_BACKEND_CREATE,
                target_type="platform_backend",
                target_id=backend.id,
                target_name=backend.name,
                details={
                    "name": backend.name,
                    "kind": backend.kind,
                    "endpoint": backend.endpoint,
                    "tls": backend.has_tls,
                    "granted": sorted(str(space.pk) for space in spaces),
                },
            )
    except IntegrityError:
        raise _save_refused(backend) from None
    return backend


def do_register_local_engine(
    *, name: str, kind: str, pip_find_links: str, spaces: list[Space], apt_folder: str = "", npm_folder: str = ""
) -> PlatformBackend:
    """Register this host's engine (the command names its kind) as a platform backend granted
    to `spaces`: the one-command start (`manage.py register_local_engine`), done by the system."""
    with transaction.atomic():
        backend = PlatformBackend.objects.create(
            name=name, kind=kind, pip_find_links=pip_find_links, apt_folder=apt_folder, npm_folder=npm_folder
        )
        backend.spaces.set(spaces)
        record_audit(
            SYSTEM,
            AuditAction.PLATFORM_BACKEND_CREATE,
            target_type="platform_backend",
            target_id=backend.id,
            target_name=backend.name,
            details={
                "name": name,
                "kind": kind,
                "endpoint": "",
                "pip_find_links": pip_find_links,
                "apt_folder": apt_folder,
                "npm_folder": npm_folder,
                "granted": [str(s.pk) for s in spaces],
            },
        )
    return backend


def do_fill_local_engine_sources(backend: PlatformBackend, *, folders: dict[str, str]) -> list[str]:
    """Give the local engine's backend (a re-run of `manage.py register_local_engine`) the
    package source folders the start prepared since: only for a kind of package with no source
    yet (neither folder nor URL), so a platform admin's choice stays. Done by the system;
    returns the fields set."""
    with transaction.atomic():
        locked = PlatformBackend.objects.select_for_update().get(pk=backend.pk)
        changed = [
            key
            for key, value in folders.items()
            if value and not any(getattr(locked, k) for k in (key, *SOURCE_ALTERNATIVES[key]))
        ]
        if not changed:
            return []
        for key in changed:
            setattr(locked, key, folders[key])
        locked.save(update_fields=changed)
        record_audit(
            SYSTEM,
            AuditAction.PLATFORM_BACKEND_UPDATE,
            target_type="platform_backend",
            target_id=locked.id,
            target_name=locked.name,
            details={
                "changed": changed,
                "before": dict.fromkeys(changed, ""),
                "after": {key: folders[key] for key in changed},
                "granted": [],
                "revoked": [],
            },
        )
    for key in changed:
        setattr(backend, key, folders[key])
    return changed


def do_update_platform_backend(
    backend: PlatformBackend,
    *,
    data: dict[str, Any],
    secrets: dict[str, str | None],
    spaces: list[Space],
    actor: Actor,
) -> PlatformBackend:
    """Save changes and grants. The account (kind, endpoint, domain, key, TLS) is frozen while
    its configs' sandboxes live; a grant cannot be withdrawn from a space with configs on it."""
    _require_platform_admin(actor)
    original = PlatformBackend.objects.get(pk=backend.pk)
    changed = [k for k in BACKEND_FIELDS if k in data and getattr(original, k) != data[k]]
    for key in changed:
        setattr(backend, key, data[key])
    secrets_changed = _apply_secrets(backend, secrets)
    if "kind" in changed:
        _check_pins_fit_kind(backend)
    identity_changed = [k for k in changed if k in IDENTITY] + [s for s in secrets_changed if s != "api_key"]
    if "api_key" in secrets_changed:
        identity_changed.append("api_key")
    if (
        "allow_space_api_key" in changed
        and SandboxConfig.objects.filter(backend=original).exclude(api_key_encrypted="").exists()
    ):
        # Configs with their own key change account (theirs <-> the platform's).
        identity_changed.append("allow_space_api_key")
    if identity_changed:
        live = 0
        for config in SandboxConfig.objects.filter(backend=original).select_related("backend"):
            try:
                live += count_live_sandboxes(config)
            except RemoteError:
                # The old account does not answer now: the sessions last seen on it still count
                # (a moment's outage must not orphan their sandboxes there).
                live += Session.objects.filter(config=config, state__in=LIVE_STATES).count()
        if live:
            raise ServiceError(
                f"{live} live sandbox(es) run on this backend: delete them before changing "
                + ", ".join(identity_changed)
                + ", or register a new backend."
            )
    new_spaces = {space.pk for space in spaces}
    try:
        with transaction.atomic():
            # Locked before the checks: a config saved at the same moment (which locks this
            # row too, sandboxes.catalog.services) is either seen here or sees the new limits and grants.
            PlatformBackend.objects.select_for_update().get(pk=backend.pk)
            old_spaces = set(original.spaces.values_list("pk", flat=True))
            revoked = old_spaces - new_spaces
            in_use = Space.objects.filter(pk__in=revoked, sandbox_configs__backend=original).distinct()
            if in_use:
                names = ", ".join(space.name for space in in_use)
                raise ServiceError(
                    f"{names} still run configs on this backend: they must move to another backend first.",
                    field_errors={"spaces": [f"configs of {names} use it"]},
                )
            _check_limits_cover_configs(backend)
            backend.save()
            backend.spaces.set(spaces)
            if "kind" in changed:  # what the old kind's server reported is no longer this kind's
                configs = SandboxConfig.objects.filter(backend=backend)
                configs.update(backend_protocol="", backend_version="")
                if not describe(backend.kind).takes("api_key", Scope.CONFIG):  # nor a space's own key, to come back
                    configs.update(api_key_encrypted="")
            record_audit(
                actor,
                AuditAction.PLATFORM_BACKEND_UPDATE,
                target_type="platform_backend",
                target_id=backend.id,
                target_name=backend.name,
                details={
                    "changed": changed + secrets_changed,
                    "before": {k: str(getattr(original, k)) for k in changed},
                    "after": {k: str(data[k]) for k in changed},
                    "granted": sorted(str(pk) for pk in new_spaces - old_spaces),
                    "revoked": sorted(str(pk) for pk in revoked),
                },
            )
    except IntegrityError:
        raise _save_refused(backend) from None
    return backend


def check_platform_backend(
    backend: PlatformBackend | None, *, data: dict[str, Any], secrets: dict[str, str | None]
) -> list[Finding]:
    """What the backend's adapter finds of its account (`Backend.preflight`) with the settings
    a form holds, before anything is saved: a row of its own, never written (`backend`: the
    stored one whose secrets a form's *** keeps)."""
    probe = PlatformBackend(**{k: data[k] for k in BACKEND_FIELDS if k in data})
    if backend is not None:
        stored = PlatformBackend.objects.get(pk=backend.pk)
        for name in SECRET_FIELDS:
            setattr(probe, f"{name}_encrypted", getattr(stored, f"{name}_encrypted"))
    _apply_secrets(probe, secrets)
    return preflight(probe)


def granted_backends(space: Space) -> QuerySet[PlatformBackend]:
    """The backends a space's configs may choose, by name."""
    return PlatformBackend.objects.filter(spaces=space).order_by("name")
