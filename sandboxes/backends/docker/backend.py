"""Docker backend: one long-lived container per sandbox on a local or remote engine.

Mapping of the contract (see docs/backends.md, "Docker"):

- sandbox id = the container's full id; tini is PID 1 (from the image's entrypoint);
  metadata lives in labels `console.meta.<key>` next to the console's markers
  (`console.managed=1`, `console.kind=sandbox`, `console.template=<template id>`);
- templates are images labelled `console.kind=template` (template id = image tag),
  snapshots are `docker commit` images labelled `console.kind=snapshot`, shown as
  `snap-<12 hex of the image id>`;
- idle = `docker pause` or `docker stop` per the config's idle mode, resumed by connect();
- inbound = the console's own proxy route (`inbound`), guarded by a traffic token kept in a
  label; inbound on with outbound off = the space's internal network instead of none;
- outbound off = network mode "none"; on = the space's own console-managed bridge network
  (inter-container traffic off), where the host packet filter (`firewall`, each sandbox's
  chain from `egress_rules`) enforces the policy's lists and the always-denied set, and the
  space network's own dnsmasq (`dns`) is the only resolver; switched live by `egress`
  (docs/network.md). A remote engine, or host_firewall=external, keeps on/off only;
- hardening: every capability dropped but `ROOT_CAPABILITIES`, no-new-privileges, the
  engine's default seccomp and AppArmor profiles, no host paths or engine socket inside.

Imports nothing of the project but `base` and `guard` (and the image builder and the host
packet filter next to it).
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors

from ..base import (
    META_SPACE,
    SANDBOX_UID,
    SNAPSHOT_PREFIX,
    WORKSPACE,
    Backend,
    BackendConfig,
    DiskCapabilities,
    ErrorKind,
    ExecRequest,
    ExecResult,
    HealthInfo,
    IdleMode,
    ListQuery,
    Lookahead,
    NetworkCapabilities,
    NetworkSpec,
    Page,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
    VolumeInfo,
    is_snapshot_id,
)
from ..capabilities import (
    EgressCapability,
    FilesCapability,
    InboundCapability,
    LogsCapability,
    PtyCapability,
    SnapshotsCapability,
    StatsCapability,
    TemplatesCapability,
    VolumesCapability,
)
from ..guard import Resolver
from . import repair
from .common import (
    _VOLUME_NAME,
    DEFAULT_API_TIMEOUT_S,
    DEFAULT_NETWORK,
    KIND_SANDBOX,
    KIND_SNAPSHOT,
    KIND_WORKSPACE,
    LABEL_META_PREFIX,
    LABEL_NETWORK,
    LABEL_TEMPLATE,
    STOP_GRACE_S,
    _check_image_owner,
    _engine_call,
    _hardening,
    _parse_time,
    metadata_from_labels,
    metadata_labels,
)
from .disk import DiskPlan, DockerDisk
from .egress.component import DockerEgress, EgressSettings
from .engine import DockerEngine
from .files import DockerFiles
from .image import (
    DEFAULT_BASE_IMAGE,
    KIND_TEMPLATE,
    LABEL_KIND,
    LABEL_MANAGED,
)
from .inbound import LABEL_TRAFFIC_TOKEN, DockerInbound, new_traffic_token
from .layout import lay_out
from .listing import DockerListing
from .networks import DockerNetworks
from .pty import DockerPtys
from .settings import DockerOptions
from .snapshots import DockerSnapshots
from .templates import DockerTemplates
from .wire import Pending

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# The backend


class DockerBackend(Backend):
    """Sandboxes as long-lived containers on a Docker engine (local socket or base URL).

    Composition, no mixins: the backend holds its parts and each receives what it uses —
    `engine` (`DockerEngine`: client, sandbox lookup, commands), `networks` (`DockerNetworks`:
    the space networks on the engine; receives the engine), `listing` (`DockerListing`:
    `list`; receives the engine), `outbound` (`egress.DockerEgress`, the egress component's
    façade: host packet filter, resolvers, squid, refusals; receives the engine and the
    networks). The capabilities are built on the same parts.

    Options (`settings.DockerOptions`, BackendConfig.options): `network` (prefix of the per-space bridge networks,
    default "sandbox-console-net"), `timeout` (seconds per engine call, default 120),
    `control_timeout` (seconds per pause, unpause and inspect, default 10: see repair.py),
    `dns_upstream` (the resolver the space networks' dnsmasq forwards to: an address,
    optionally `#port`; without it no name resolves), `egress_state_dir` (the host folder of
    the resolvers' and the refusal log's files, default /var/lib/sandbox-console/egress),
    `egress_log_max_bytes` (the size at which the egress logs rotate, default 64 MiB),
    `base_image` (the template used when a build names none), `host_firewall` ("auto":
    the console applies the host packet filter when the engine is local and refuses online
    sandboxes while it is not in force; "external": an operator applies it on the engine's
    host, e.g. for a remote engine, and health says so), `snapshot_max_layers` (past this
    depth a snapshot is flattened into one layer instead of committed; default 32: snapshots.py).
    """

    kind = "docker"
    label = "Docker"
    exec_refuses_when_idle = True  # the engine answers 404 or 409 to an exec it will not run

    def __init__(self, config: BackendConfig, *, resolver: Resolver | None = None) -> None:
        super().__init__(config)
        self.options = options = DockerOptions.parse(config.options)
        api_timeout = options.timeout if options.timeout is not None else DEFAULT_API_TIMEOUT_S
        self.base_image = options.base_image or DEFAULT_BASE_IMAGE
        self.engine = DockerEngine(config, options, api_timeout=api_timeout, resolver=resolver)
        self.networks = DockerNetworks(self.engine, options.network or DEFAULT_NETWORK)
        self.listing = DockerListing(self.engine)
        self.outbound = DockerEgress(self.engine, self.networks, EgressSettings.from_options(options))
        self.disk = DockerDisk(self)  # disk limits: bounded file systems, the layer's size
        self.closed = False

    # Engine connection ---------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        return self.engine.client

    @property
    def api(self) -> docker.APIClient:
        return self.engine.api

    def close(self) -> None:
        self.closed = True
        self.engine.close()

    def health(self) -> HealthInfo:
        try:
            with _engine_call("health check"):
                self.api.ping()
                version = self.api.version()
        except RemoteError as exc:
            return HealthInfo(ok=False, detail=exc.message)
        return HealthInfo(
            ok=True,
            version=f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})",
            detail=f"{version.get('Os', '')}/{version.get('Arch', '')}; host firewall: {self.outbound.status()}",
        )

    def engine_is_local(self) -> bool:
        return self.engine.is_local()

    def space_network_name(self, space: str) -> str:
        return self.networks.space_network_name(space)

    def inbound_network_name(self, space: str) -> str:
        return self.networks.inbound_network_name(space)

    # Lifecycle -------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        self.outbound.check(spec.network)
        if spec.network.allow_internet_access:
            self.outbound.ensure_firewall()  # before anything is made: refused means nothing left behind
        image = self.resolve_image(spec.template_id, owner=spec.metadata)
        if spec.workspace_volume and not _VOLUME_NAME.match(spec.workspace_volume):
            raise RemoteError(ErrorKind.INVALID, f"not a volume name: {spec.workspace_volume!r}")
        space = spec.metadata.get(META_SPACE, "")
        network_mode, gateway = self._network_mode(spec.network, space)
        labels = {
            **metadata_labels(spec.metadata),
            LABEL_MANAGED: "1",
            LABEL_KIND: KIND_SANDBOX,
            LABEL_TEMPLATE: spec.template_id,
            # Guards the sandbox's inbound URLs (the console's proxy checks it; inbound.py).
            LABEL_TRAFFIC_TOKEN: new_traffic_token(),
        }
        if self.outbound.enforces_lists():
            labels[LABEL_NETWORK] = self.networks.space_network_name(space)
        if spec.workspace_volume:
            self.disk.ensure_volume(spec.workspace_volume, spec.metadata, spec.resources.disk_mb)
        disk = self.disk.plan(spec)
        try:
            try:
                container_id, ready = self._create_and_start(image, labels, spec, network_mode, gateway, disk)
            except RemoteError as exc:
                # The space's network went away under us: its last sandbox was deleted meanwhile
                # and took it along (see release_network). Make it again, once.
                if exc.kind != ErrorKind.NOT_FOUND or network_mode == "none":
                    raise
                network_mode, gateway = self._network_mode(spec.network, space)
                container_id, ready = self._create_and_start(image, labels, spec, network_mode, gateway, disk)
        except BaseException:
            disk.discard()  # no sandbox, so nothing owns its scratch
            raise
        logger.info(
            "created sandbox %s",
            container_id,
            extra={"sandbox_id": container_id, "template": spec.template_id, "network": network_mode},
        )
        self.outbound.settle(spec.network)
        return dataclasses.replace(self.get(container_id), workspace_ready=ready)

    def _network_mode(self, network: NetworkSpec, space: str) -> tuple[str, str]:
        """(network mode, resolver address). Offline: no network at all (none is made for it:
        the engine's address pools are small), or with inbound on the space's internal
        network; switched on later, the egress component points its resolver."""
        if network.allow_internet_access:
            return self.outbound.prepare(space, network)
        if not network.allow_public_traffic:
            return "none", "127.0.0.1"
        # The internal bridge is an `sbx-` bridge too: the host packet filter keeps it off the
        # host's own addresses (it must be in force first, as for outbound).
        self.outbound.ensure_firewall()
        return self.networks.ensure_internal_network(space), "127.0.0.1"

    def _create_and_start(
        self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str, resolver: str, disk: DiskPlan
    ) -> tuple[str, bool]:
        """The started container, and whether /workspace has the spec's layout (laid out
        before the start, through the archive API: no process run inside; layout.py)."""
        container_id = self._create_container(image, {**labels, **disk.labels}, spec, network_mode, resolver, disk)
        try:
            ready = spec.workspace_layout is not None and lay_out(self.api, container_id, spec.workspace_layout)
            with _engine_call("starting the sandbox"):
                self.api.start(container_id)
            if self.outbound.enforces_lists() and network_mode != "none":
                # Until its chain is in, the bridge drops everything from the new address. On no
                # network there is nothing to filter: a policy switched on later attaches it.
                self.outbound.attach(container_id, labels[LABEL_NETWORK], spec.network)
            if spec.workspace_volume and not ready:
                self._own_workspace(container_id)
        except RemoteError:
            self.engine.remove_container(container_id)
            raise
        return container_id, ready

    def _create_container(
        self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str, resolver: str, disk: DiskPlan
    ) -> str:
        try:
            return self._create_container_once(image, labels, spec, network_mode, resolver, disk)
        except RemoteError as exc:
            if disk.storage_opt is None or "storage-opt" not in exc.message.lower():
                raise
            # overlay2 on xfs without pquota: the engine refuses the layer's size; say so from now on.
            self.disk.layer_refused()
            disk.storage_opt = None
            return self._create_container_once(image, labels, spec, network_mode, resolver, disk)

    def _create_container_once(
        self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str, resolver: str, disk: DiskPlan
    ) -> str:
        limits = spec.resources
        memory = f"{limits.memory_mb}m" if limits.memory_mb else None
        binds = {**({spec.workspace_volume: {"bind": WORKSPACE, "mode": "rw"}} if spec.workspace_volume else {})}
        binds.update(disk.binds)
        with _engine_call("creating the sandbox"):
            host_config = self.api.create_host_config(
                network_mode=network_mode,
                dns=[resolver],
                mem_limit=memory,
                memswap_limit=memory,  # no swap beyond the memory limit
                nano_cpus=int(limits.cpus * 1e9) if limits.cpus else None,
                pids_limit=limits.pids,
                **_hardening(),
                binds=binds or None,
                storage_opt=disk.storage_opt,
            )
            created = self.api.create_container(
                image,
                labels=labels,
                environment=dict(spec.env),
                hostname="sandbox",
                host_config=host_config,
            )
        return str(created["Id"])

    def look_ahead(self, sandbox_id: str) -> Lookahead | None:
        # The inspect `connect` starts with, sent now on the engine's socket (wire.py); a
        # sandbox this adapter paused is resumed by `connect` without one. A closed adapter
        # (replaced by an edit of its config) is not opened again for a look.
        if self.closed or self.engine.paused_here(sandbox_id):
            return None
        try:
            pending = self.engine.look_at_sandbox(sandbox_id)
        except RemoteError:
            return None
        return None if pending is None else _Look(self.engine, sandbox_id, pending)

    def connect(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        seen = self.engine.seen(sandbox_id)
        if seen is not None and self.engine.paused_here(sandbox_id):
            # Paused by this adapter: unpaused in one call. Refused as not paused (resumed or
            # stopped elsewhere since): looked at below, as any other.
            try:
                with _engine_call(f"resuming sandbox {sandbox_id}"):
                    repair.unpause(self, sandbox_id, timeout_s=timeout_s)
            except RemoteError as exc:
                self.engine.paused_here(sandbox_id, False)
                if exc.kind == ErrorKind.NOT_FOUND:
                    self.engine.forget(sandbox_id)
                if exc.kind != ErrorKind.CONFLICT:
                    raise
            else:
                self.engine.paused_here(sandbox_id, False)
                if self.outbound.recorded(sandbox_id):
                    self.outbound.resume(sandbox_id)  # switched on while paused: its resolver now
                logger.info("resumed sandbox %s (paused)", sandbox_id, extra={"sandbox_id": sandbox_id})
                return dataclasses.replace(seen, state=SandboxState.RUNNING)
        info = self.check_state(self.get(sandbox_id, timeout_s=timeout_s))
        if info.state == SandboxState.RUNNING:
            return info  # the common, warm case: one inspect, nothing to resume
        with _engine_call(f"resuming sandbox {sandbox_id}"):
            if info.state == SandboxState.PAUSED:
                repair.unpause(self, info.sandbox_id, timeout_s=timeout_s)
            elif info.state in (SandboxState.STOPPED, SandboxState.STARTING):
                self.disk.remount(info.sandbox_id)  # after a host reboot its disks are unmounted
                self.api.start(info.sandbox_id)
        if self.outbound.recorded(info.sandbox_id):
            # A restarted container may have a new address; one switched on while paused has
            # its resolver pointed now. One made on no network, never switched on: nothing.
            self.outbound.resume(info.sandbox_id)
        logger.info("resumed sandbox %s (%s)", sandbox_id, info.state, extra={"sandbox_id": sandbox_id})
        return dataclasses.replace(info, state=SandboxState.RUNNING)

    def pause(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        seen = self.engine.seen(sandbox_id)
        if seen is not None and self.config.idle_mode != IdleMode.STOP:
            try:
                repair.pause(self, sandbox_id, timeout_s=timeout_s)
                self.engine.paused_here(sandbox_id, True)
                return dataclasses.replace(seen, state=SandboxState.PAUSED)
            except RemoteError as exc:
                if exc.kind == ErrorKind.NOT_FOUND:
                    self.engine.forget(sandbox_id)
                if exc.kind != ErrorKind.CONFLICT:
                    raise
                # Already paused, or not running: look, then do what its state needs.
        info = self.get(sandbox_id, timeout_s=timeout_s)
        with _engine_call(f"idling sandbox {sandbox_id}"):
            if self.config.idle_mode == IdleMode.STOP:
                if info.state == SandboxState.PAUSED:
                    repair.unpause(self, info.sandbox_id, timeout_s=timeout_s)  # a frozen container cannot take SIGTERM
                if info.state in (SandboxState.RUNNING, SandboxState.PAUSED):
                    self.api.stop(info.sandbox_id, timeout=STOP_GRACE_S)
            elif info.state == SandboxState.RUNNING:
                repair.pause(self, info.sandbox_id, timeout_s=timeout_s)
                self.engine.paused_here(info.sandbox_id, True)
        # The engine answered; the new state is known without another inspect.
        idle_state = SandboxState.STOPPED if self.config.idle_mode == IdleMode.STOP else SandboxState.PAUSED
        if info.state in (SandboxState.RUNNING, SandboxState.PAUSED):
            return dataclasses.replace(info, state=idle_state)
        return info

    def get(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        return self.engine.inspect_sandbox(sandbox_id, timeout_s=timeout_s)

    def repair(self, sandbox_id: str) -> str | None:
        return repair.repair(self, sandbox_id)

    def list(self, query: ListQuery) -> Page:
        return self.listing.list(query)

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        return self.engine.exec(sandbox_id, request)

    def delete(self, sandbox_id: str) -> None:
        # A sandbox this adapter has seen needs no look first: its labels (space, scratch
        # disk) never change, and the removal is idempotent.
        info = self.engine.seen(sandbox_id)
        if info is None:
            try:
                info = self.engine.inspect_sandbox(sandbox_id)
            except RemoteError as exc:
                if exc.kind == ErrorKind.NOT_FOUND:
                    return
                raise
        scratch = self.disk.scratch_of(self.engine.labels_of(info.sandbox_id) or {})
        # Made on no network and never switched on (no policy recorded): no network to release.
        networked = self.outbound.recorded(info.sandbox_id) or not self.outbound.enforces_lists()
        self.engine.remove_container(info.sandbox_id)
        self.disk.release(scratch)
        if self.outbound.enforces_lists():
            self.outbound.detach(info.sandbox_id)
        if networked:
            self.release_network(info.metadata.get(META_SPACE, ""))
        logger.info("deleted sandbox %s", info.sandbox_id, extra={"sandbox_id": info.sandbox_id})

    def release_network(self, space: str) -> None:
        """The space's networks removed once no container is on them, stopped ones included,
        and with the space network everything the host kept for it (the egress component's
        `release`: chains' elements, set copies, resolver, squid entry, deny filler lines).
        Best effort: a network in use (again) stays. Called at every delete; the space
        teardown calls it (as `release_space`) once the space's sandboxes are gone."""
        name = self.networks.space_network_name(space)
        gateways = self.networks.remove_if_unused(name)
        if gateways is not None and (self.outbound.enforces_lists() or self.outbound.l7_possible()):
            self.outbound.release(name, *gateways)
        self.networks.remove_if_unused(self.networks.inbound_network_name(space))

    # The name the space teardown (and older callers) use.
    _release_network = release_network

    def network_capabilities(self) -> NetworkCapabilities:
        return self.outbound.capabilities()

    def _check_network_spec(self, network: NetworkSpec) -> None:
        """Refuse a spec this backend cannot honour (the egress component's `check`)."""
        self.outbound.check(network)

    # Images, networks, volumes -------------------------------------------------------

    def resolve_image(self, template_id: str, owner: Mapping[str, str] | None = None) -> str:
        """The image id behind a template or snapshot id; not_found names the template.

        With `owner` (the new sandbox's metadata): an image labelled with another
        installation or space is not found. A tag is only a name: another tenant may build
        one a config still names after its template was deleted."""
        if not template_id:
            raise RemoteError(ErrorKind.INVALID, "no template id given")
        if is_snapshot_id(template_id):
            attrs = self.snapshot_image(template_id)
            _check_image_owner(attrs, owner, template_id)
            return str(attrs["Id"])
        attrs = self.console_image(template_id, f"template {template_id!r}")
        _check_image_owner(attrs, owner, template_id)
        if attrs["Config"]["Labels"].get(LABEL_KIND) != KIND_TEMPLATE:
            # A snapshot is started by its snap- id only: a bare image id would bypass the
            # console's checks of whose snapshot it is.
            raise RemoteError(ErrorKind.NOT_FOUND, f"template {template_id!r} not found (the image is a snapshot)")
        return str(attrs["Id"])

    def console_image(self, reference: str, what: str) -> dict[str, Any]:
        try:
            with _engine_call(what):
                attrs: dict[str, Any] = self.api.inspect_image(reference)
        except RemoteError as exc:
            if exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.INVALID):
                raise RemoteError(ErrorKind.NOT_FOUND, f"{what} not found") from exc
            raise
        labels = (attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_KIND) not in (KIND_TEMPLATE, KIND_SNAPSHOT):
            raise RemoteError(ErrorKind.NOT_FOUND, f"{what} not found (the image is no console template)")
        return attrs

    def snapshot_image(self, snapshot_id: str) -> dict[str, Any]:
        short = snapshot_id.removeprefix(SNAPSHOT_PREFIX)
        if not re.fullmatch(r"[0-9a-f]{12,64}", short):
            raise RemoteError(ErrorKind.NOT_FOUND, f"snapshot {snapshot_id!r} not found")
        attrs = self.console_image(short, f"snapshot {snapshot_id!r}")
        if attrs["Config"]["Labels"].get(LABEL_KIND) != KIND_SNAPSHOT:
            raise RemoteError(ErrorKind.NOT_FOUND, f"snapshot {snapshot_id!r} not found")
        return attrs

    def ensure_volume(self, name: str, metadata: Mapping[str, str]) -> None:
        """The workspace volume `name` made (labelled as the console's) unless it exists."""
        with _engine_call(f"volume {name}"):
            try:
                self.api.inspect_volume(name)
            except docker.errors.NotFound:
                labels = {
                    **metadata_labels(metadata),
                    LABEL_MANAGED: "1",
                    LABEL_KIND: KIND_WORKSPACE,
                }
                self.api.create_volume(name, labels=labels)

    def _own_workspace(self, container_id: str) -> None:
        """A fresh volume copies /workspace from the image; one made elsewhere may be root's."""
        result = self.engine.run(container_id, ("chown", f"{SANDBOX_UID}:{SANDBOX_UID}", WORKSPACE), user="root")
        if result.exit_code != 0:
            raise RemoteError(ErrorKind.INTERNAL, f"could not hand {WORKSPACE} to uid {SANDBOX_UID}")

    def delete_volume(self, name: str) -> None:
        """Remove a workspace volume (idempotent; conflict while a container mounts it).

        Sandboxes never delete their volume: it outlives them by design.
        """
        try:
            with _engine_call(f"deleting volume {name}"):
                self.api.remove_volume(name)
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
        self.disk.release_volume(name)  # its bounded file system, if it has one

    def release_space(self, space: str) -> builtins.list[str]:
        """The space's networks (and, through `release_network`, their host state) removed
        once no container is on them; conflict naming a network that a container keeps."""
        names = (self.networks.space_network_name(space), self.networks.inbound_network_name(space))
        before = self._networks_named(names)
        self.release_network(space)
        left = self._networks_named(names)
        if left:
            raise RemoteError(ErrorKind.CONFLICT, f"network {', '.join(left)} is still in use by a container")
        return before

    def _networks_named(self, names: tuple[str, ...]) -> builtins.list[str]:
        with _engine_call("listing networks"):
            found = {row["Name"] for row in self.api.networks(names=list(names))}
        return [name for name in names if name in found]

    # Capabilities ----------------------------------------------------------------------

    def files(self) -> FilesCapability:
        return DockerFiles(self.engine)

    def snapshots(self) -> SnapshotsCapability:
        return DockerSnapshots(self)

    def templates(self) -> TemplatesCapability:
        return DockerTemplates(self)

    def volumes(self) -> VolumesCapability:
        return DockerVolumes(self)

    def inbound(self) -> InboundCapability:
        return DockerInbound(self.engine, self.networks)

    def egress(self) -> EgressCapability | None:
        return self.outbound if self.outbound.enforces_lists() else None

    def pty(self) -> PtyCapability:
        return DockerPtys(self.engine)

    def disk_capabilities(self) -> DiskCapabilities:
        return self.disk.capabilities()

    def stats(self) -> StatsCapability:
        from .stats import DockerStats

        return DockerStats(self.engine)

    def logs(self) -> LogsCapability:
        from .logs import DockerLogs

        return DockerLogs(self.engine)


class DockerVolumes(VolumesCapability):
    """Named volumes as persistent workspaces (one per session)."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def check(self) -> str:
        with _engine_call("listing workspace volumes"):
            found = self.backend.api.volumes(filters={"label": f"{LABEL_KIND}={KIND_WORKSPACE}"})
        return f"named volumes ({len(found.get('Volumes') or [])} workspaces on this engine)"

    def list(self, metadata: Mapping[str, str]) -> list[VolumeInfo]:
        filters = [f"{LABEL_KIND}={KIND_WORKSPACE}"] + [f"{LABEL_META_PREFIX}{k}={v}" for k, v in metadata.items()]
        with _engine_call("listing workspace volumes"):
            found = self.backend.api.volumes(filters={"label": filters}).get("Volumes") or []
        return [
            VolumeInfo(
                name=str(row["Name"]),
                metadata=metadata_from_labels(row.get("Labels") or {}),
                created_at=_parse_time(row.get("CreatedAt")),
            )
            for row in found
        ]

    def delete(self, name: str) -> None:
        self.backend.delete_volume(name)


class _Look(Lookahead):
    """`connect`'s inspect, sent early: what it answers stands for `connect` only when the
    sandbox runs and this adapter has not paused it since (then `connect` does no more)."""

    def __init__(self, engine: DockerEngine, sandbox_id: str, pending: Pending) -> None:
        self.engine, self.sandbox_id, self.pending = engine, sandbox_id, pending

    def running(self) -> SandboxInfo | None:
        try:
            with _engine_call(f"sandbox {self.sandbox_id}"):
                info = self.engine.sandbox_info(self.sandbox_id, self.pending.answer())
        except RemoteError as exc:
            # Unanswered in time: connect's own inspect (asking again would wait as long again),
            # unless this adapter paused the sandbox meanwhile: connect resumes it without one.
            if exc.kind == ErrorKind.TIMEOUT and not self.engine.paused_here(self.sandbox_id):
                raise
            return None
        if info.state != SandboxState.RUNNING or self.engine.paused_here(self.sandbox_id):
            return None
        return info

    def drop(self) -> None:
        self.pending.drop()
