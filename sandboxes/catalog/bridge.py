"""The bridge from a config row to a backend adapter, and what the console tells a backend.

`get_backend(config)` is **the** way views, the API, tasks and consumers reach a backend
(none builds one from a row itself): one long-lived adapter per row version, built observed
(`catalog.observed`); `backend_config_for` merges the platform backend's
infrastructure with the config's settings; the console's metadata labels and the ownership
rules read from them (`console_metadata`, `template_owner`); the account fingerprint
(`config_fingerprint`); the space's network policy as a `NetworkSpec` and what a backend
cannot honour of it.

Reads only (no writes, no audit rows). May import `sandboxes.backends`, `sandboxes.models`,
`console` and `catalog.observed` (backends are built observed); nothing else of
`sandboxes.catalog` (the catalog's other modules import it).
"""

from __future__ import annotations

import hashlib
import threading
from datetime import datetime
from typing import Any

from django.conf import settings

from console.crypto import decrypt
from console.models import Space

from ..backends import backend_class, build_backend, describe
from ..backends.base import (
    META_CONFIG,
    META_INSTALLATION,
    META_SPACE,
    Backend,
    BackendConfig,
    ErrorKind,
    Finding,
    IdleMode,
    RemoteError,
    Resources,
    TemplateInfo,
)
from ..backends.settings import Options, Scope
from ..models import PlatformBackend, SandboxConfig, TemplateRecord
from .observed import observe
from .tuning import CATALOG


def effective_api_key(config: SandboxConfig) -> str:
    """The space's own key where its backend allows one, else the platform backend's."""
    if config.api_key_encrypted and config.backend.allow_space_api_key:
        return decrypt(config.api_key_encrypted)
    return decrypt(config.backend.api_key_encrypted)


def uses_own_api_key(config: SandboxConfig) -> bool:
    return bool(config.api_key_encrypted) and config.backend.allow_space_api_key


def account_identity(config: SandboxConfig) -> tuple[str, str, str, str]:
    """Provider, endpoint, domain and credential: the account holding the config's sandboxes."""
    backend = config.backend
    return (backend.kind, backend.endpoint, backend.domain, effective_api_key(config))


def backend_config_for(config: SandboxConfig) -> BackendConfig:
    """The platform backend's infrastructure merged with the config's own settings."""
    backend = config.backend
    return BackendConfig(
        kind=backend.kind,
        endpoint=backend.endpoint,
        domain=backend.domain,
        api_key=effective_api_key(config),
        # A space's own key goes to a public endpoint only: the guard refuses private ranges.
        allow_private_endpoints=backend.allow_private_endpoints and not uses_own_api_key(config),
        idle_mode=IdleMode(config.idle_mode),
        options=kind_options(
            backend.kind,
            {
                **backend_offers(backend),
                **workspace_options(config),
                **protocol_options(config),
            },
        ),
    )


def platform_backend_config(backend: PlatformBackend) -> BackendConfig:
    """A platform backend on its own account, without a config: what the per-installation
    clean-up (`sessions.unmanaged`) lists and deletes through once a space and its configs
    are gone."""
    return BackendConfig(
        kind=backend.kind,
        endpoint=backend.endpoint,
        domain=backend.domain,
        api_key=decrypt(backend.api_key_encrypted),
        allow_private_endpoints=backend.allow_private_endpoints,
        options=kind_options(backend.kind, backend_offers(backend)),
    )


def kind_options(kind: str, offered: dict[str, Any]) -> Options:
    """The kind's typed options (its schema's `Options`) from what the console offers every
    kind: each adapter takes the keys it declares, the rest is not its business."""
    return describe(kind).options.parse(offered)


def backend_offers(backend: PlatformBackend) -> dict[str, Any]:
    """What the console offers every kind's adapter, from the platform backend and the
    deployment: the data-plane URL, TLS material, the resolver's and disks' host folders
    (docs/network.md, docs/operations.md), and the console's own inbound route (with a
    wildcard INBOUND_BASE_URL the issued URL is a host per sandbox port instead,
    sandboxes/inbound/hosts.py, and this path stays for the token header)."""
    offered: dict[str, Any] = {
        "sandbox_url": backend.sandbox_url,
        "tls_ca": decrypt(backend.tls_ca_encrypted),
        "tls_cert": decrypt(backend.tls_cert_encrypted),
        "tls_key": decrypt(backend.tls_key_encrypted),
        "dns_upstream": settings.EGRESS_DNS_UPSTREAM,
        "egress_state_dir": settings.EGRESS_STATE_DIR,
        "egress_log_max_bytes": CATALOG.egress_log_max_bytes,
        "disk_dir": settings.WORKSPACE_DISK_DIR,
        "template_build_disk_mb": CATALOG.template_build_disk_mb,
        "inbound_url": "/inbound/",
        # A cluster's (Kubernetes): its ways in besides endpoint and key, where its sandboxes go.
        "kubeconfig": decrypt(backend.kubeconfig_encrypted),
        "in_cluster": backend.in_cluster,
        "namespace": backend.namespace,
        "namespace_mode": backend.namespace_mode,
        "storage_class": backend.storage_class,
        "runtime_class": backend.runtime_class,
        "workspace_size": backend.workspace_size,
        "registry_url": backend.registry_url,
        "registry_username": backend.registry_username,
        "registry_password": decrypt(backend.registry_password_encrypted),
    }
    return {key: value for key, value in offered.items() if value not in ("", None)}


def sandbox_resources(config: SandboxConfig) -> Resources:
    """What each of the config's sandboxes gets: CPUs, memory, processes, and disk where
    its kind declares a disk limit."""
    return Resources(
        cpus=float(config.cpus),
        memory_mb=config.memory_mb,
        pids=config.pids_limit,
        disk_mb=config.disk_mb if describe(config.kind).takes("disk_mb", Scope.CONFIG) else None,
    )


def protocol_options(config: SandboxConfig) -> dict[str, Any]:
    """The TTL create and connect send (the config's idle timeout), and the wire protocol,
    pinned or as last detected (an adapter with a versioned protocol detects it again when
    not pinned; one without none declares these options)."""
    options: dict[str, Any] = {"sandbox_timeout": config.idle_timeout_s}
    if config.protocol_pin:
        options.update(protocol=config.protocol_pin, protocol_pinned=True)
    elif config.backend_protocol:
        options["protocol"] = config.backend_protocol
    return options


def workspace_options(config: SandboxConfig) -> dict[str, Any]:
    """Kinds that keep persistent workspaces under a host directory (Cube) manage them with
    housekeeping sandboxes: from the config's template, carrying its console metadata so the
    reaper can find a leftover one.

    Not on a space's own account: the host root holds every space's workspaces, and there the
    template (and so what runs beside the mount) is the space's own."""
    if not config.workspace_host_root or uses_own_api_key(config):
        return {}
    return {
        "workspace_host_root": config.workspace_host_root,
        "workspace_template": config.default_template,
        "housekeeping_metadata": console_metadata(config),
    }


# Measured (bench/module_caches.py): a get on the kept backend 1.2 ms, on a new one 12.6 ms.
# Keyed on the row's `updated` (and its platform backend's) compared exactly, never by order:
# two hosts' clocks may disagree, so a later save may carry an earlier time.
_Key = tuple[str, str, datetime | None, datetime | None]  # (row kind, id, its stamp, its backend's)
_backends: dict[_Key, Backend] = {}
_backends_lock = threading.Lock()


def get_backend(config: SandboxConfig | PlatformBackend) -> Backend:
    """The backend of a config (the config's account on its platform backend), or of a
    platform backend on its own account (the per-installation clean-up and its health).

    One long-lived adapter per row and version (its connection pools reused), shared by the
    pages, the API, the runtime, the reaper, the terminal and the skills app: a saved edit of
    the config or its platform backend builds a new one and closes the old. Never close it.
    A row not saved yet (a form's probe) gets an adapter of its own. Raises RemoteError only."""
    if config._state.adding or config.pk is None:
        return _build(config)
    key = _key_of(config)
    backend = _backends.get(key)
    if backend is not None:
        return backend
    with _backends_lock:
        backend = _backends.get(key)
        if backend is not None:
            return backend
        kept = [k for k in _backends if k[:2] == key[:2]]
        if kept:
            # Another version is kept: the database says which one is current. A copy of the
            # row loaded before a saved edit (held by a long call) gets the current adapter.
            current = _current_key(config)
            if current is None:  # deleted meanwhile: an adapter of its own, not kept
                return _build(config)
            if current in _backends:
                return _backends[current]
            for stale in kept:
                _backends.pop(stale).close()
            if current != key:
                config = type(config).objects.select_related(*_related(config)).get(pk=config.pk)
                key = current
        backend = _build(config)
        _backends[key] = backend
    return backend


def _related(config: SandboxConfig | PlatformBackend) -> tuple[str, ...]:
    return () if isinstance(config, PlatformBackend) else ("backend",)


def _key_of(config: SandboxConfig | PlatformBackend) -> _Key:
    if isinstance(config, PlatformBackend):
        return ("platform", str(config.pk), config.updated, None)
    return ("config", str(config.pk), config.updated, config.backend.updated)


def _current_key(config: SandboxConfig | PlatformBackend) -> _Key | None:
    """The key of the row as saved now (one small query, only when versions differ)."""
    if isinstance(config, PlatformBackend):
        stamp = PlatformBackend.objects.filter(pk=config.pk).values_list("updated", flat=True).first()
        return None if stamp is None else ("platform", str(config.pk), stamp, None)
    stamps = SandboxConfig.objects.filter(pk=config.pk).values_list("updated", "backend__updated").first()
    return None if stamps is None else ("config", str(config.pk), *stamps)


def _build(config: SandboxConfig | PlatformBackend) -> Backend:
    """A new adapter, every contract call on it counted, timed and logged."""
    if isinstance(config, PlatformBackend):
        return observe(build_backend(platform_backend_config(config)))
    return observe(build_backend(backend_config_for(config)))


def preflight(config: SandboxConfig | PlatformBackend) -> list[Finding]:
    """What the row's backend finds of its account beyond health (`Backend.preflight`), on an
    adapter of its own built from the row as it stands (unsaved settings too: a form's probe),
    closed after. A backend that cannot be built or asked is the first finding, failed; a kind
    whose adapter checks nothing beyond health is not built at all."""
    try:
        if backend_class(config.kind).preflight is Backend.preflight:
            return []
        backend = _build(config)
    except RemoteError as exc:
        return [Finding("connect", False, f"{exc.kind}: {exc.message}")]
    try:
        return backend.preflight()
    except RemoteError as exc:
        return [Finding("connect", False, f"{exc.kind}: {exc.message}")]
    except Exception as exc:  # an adapter's bug must not cost the admin the page
        return [Finding("connect", False, f"{ErrorKind.INTERNAL}: {type(exc).__name__}")]
    finally:
        backend.close()


def console_metadata(config: SandboxConfig, **extra: str) -> dict[str, str]:
    """The metadata every sandbox this console creates carries (see DESIGN: sessions)."""
    return {
        META_INSTALLATION: settings.CONSOLE_INSTALLATION_ID,
        META_SPACE: str(config.space_id),
        META_CONFIG: str(config.id),
        **extra,
    }


# Ownership as the console's labels say it (written by `console_metadata`); read by the
# catalog (`templates`) and by the config checks (`services`).
OWN = "own"
PLATFORM = "platform"


def labelled_owner(labels: Any, space: Space) -> str | None:
    """OWN, "other" or None (no owner labels) as the labels say."""
    installation, owner = labels.get(META_INSTALLATION), labels.get(META_SPACE)
    if installation is None and owner is None:
        return None
    if installation == settings.CONSOLE_INSTALLATION_ID and owner == str(space.pk):
        return OWN
    return "other"


def template_owner(
    template: TemplateInfo, config: SandboxConfig, recorded: dict[str, str | None] | None = None
) -> str | None:
    """OWN, PLATFORM or None (another tenant's: hidden), for the config's space.

    Labels decide where the backend keeps them (Docker). Without labels, the console's
    record of the build on this account does: the space's own, the platform's, or another
    space's (hidden). A template without labels or record was built outside the console
    (the base image, the account's own templates): the platform's. `recorded` is
    `recorded_template_owners(config)`, passed in when judging many templates."""
    owner = labelled_owner(template.labels, config.space)
    if owner is not None:
        return OWN if owner == OWN else None
    if recorded is None:
        recorded = recorded_template_owners(config, [template.template_id])
    if template.template_id not in recorded:
        return PLATFORM
    space_id = recorded[template.template_id]
    if space_id is None:
        return PLATFORM
    return OWN if space_id == str(config.space_id) else None


def config_fingerprint(config: SandboxConfig) -> str:
    """SHA-256 over provider, endpoint and credential: which backend account holds a snapshot."""
    material = "\n".join(account_identity(config))  # the platform backend's, or the space's own key
    return hashlib.sha256(material.encode()).hexdigest()


def recorded_template_owners(config: SandboxConfig, template_ids: list[str] | None = None) -> dict[str, str | None]:
    """Template id -> the space id it was built for (None: the platform), on this account."""
    records = TemplateRecord.objects.filter(fingerprint=config_fingerprint(config))
    if template_ids is not None:
        records = records.filter(template_id__in=template_ids)
    return {
        template_id: (str(space) if space is not None else None)
        for template_id, space in records.values_list("template_id", "owner_space")
    }
