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

import dataclasses
import logging
import os
import re
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import docker.tls
from docker.constants import MINIMUM_DOCKER_API_VERSION

from ..base import (
    META_SPACE,
    SANDBOX_UID,
    SNAPSHOT_PREFIX,
    WORKSPACE,
    Backend,
    BackendConfig,
    ErrorKind,
    HealthInfo,
    IdleMode,
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
    PtyCapability,
    SnapshotsCapability,
    StatsCapability,
    TemplatesCapability,
    VolumesCapability,
)
from ..guard import GuardedHTTPAdapter, Resolver, check_endpoint, system_resolver
from .common import (
    _SANDBOX_ID,
    _STATES,
    _VOLUME_NAME,
    DEFAULT_API_TIMEOUT_S,
    DEFAULT_NETWORK,
    HOST_FIREWALL_MODES,
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
from .dns import check_upstream
from .egress import DEFAULT_STATE_DIR, DockerEgress
from .exec import DockerExec
from .files import DockerFiles
from .image import (
    DEFAULT_BASE_IMAGE,
    KIND_TEMPLATE,
    LABEL_KIND,
    LABEL_MANAGED,
)
from .inbound import LABEL_TRAFFIC_TOKEN, DockerInboundNetworks, new_traffic_token
from .listing import DockerListing
from .networks import DockerNetworks
from .pty import DockerPtys
from .snapshots import DockerSnapshots
from .templates import DockerTemplates

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# The backend


class DockerBackend(DockerExec, DockerListing, DockerInboundNetworks, DockerNetworks, Backend):
    """Sandboxes as long-lived containers on a Docker engine (local socket or base URL).

    Options (BackendConfig.options): `network` (prefix of the per-space bridge networks,
    default "sandbox-console-net"), `timeout` (seconds per engine call, default 120),
    `dns_upstream` (the resolver the space networks' dnsmasq forwards to: an address,
    optionally `#port`; without it no name resolves), `egress_state_dir` (the host folder of
    the resolvers' and the refusal log's files, default /var/lib/sandbox-console/egress),
    `base_image` (the template used when a build names none), `host_firewall` ("auto":
    the console applies the host packet filter when the engine is local and refuses online
    sandboxes while it is not in force; "external": an operator applies it on the engine's
    host, e.g. for a remote engine, and health says so).
    """

    kind = "docker"
    label = "Docker"

    def __init__(self, config: BackendConfig, *, resolver: Resolver | None = None) -> None:
        super().__init__(config)
        self._client: docker.DockerClient | None = None
        self._tls_dir: tempfile.TemporaryDirectory[str] | None = None
        self.resolver = resolver or system_resolver  # remote engines' names (tcp://, ssh://)
        self.network_name = config.options.get("network", DEFAULT_NETWORK)
        try:
            self.api_timeout = int(config.options.get("timeout", DEFAULT_API_TIMEOUT_S))
        except ValueError:
            raise RemoteError(ErrorKind.INVALID, "option 'timeout' must be a whole number of seconds") from None
        self.base_image = config.options.get("base_image", DEFAULT_BASE_IMAGE)
        self.host_firewall = config.options.get("host_firewall", "auto")
        if self.host_firewall not in HOST_FIREWALL_MODES:
            raise RemoteError(
                ErrorKind.INVALID, f"option 'host_firewall' must be one of {', '.join(HOST_FIREWALL_MODES)}"
            )
        self._firewall_lock = threading.Lock()
        self._firewall_loaded = False
        self.dns_upstream = check_upstream(config.options.get("dns_upstream", ""))
        self.egress_state_dir = config.options.get("egress_state_dir", DEFAULT_STATE_DIR)
        # Console sandboxes by full container id, as last inspected. Ids, labels, template and
        # creation time never change, so an id here needs no check that it is a console
        # sandbox, and a pause needs no inspect before it; the state is never reused.
        self._seen: dict[str, SandboxInfo] = {}

    # Engine connection ---------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with _engine_call("connecting to the Docker engine"):
                if self.config.endpoint.startswith(("tcp://", "ssh://")):
                    self._client = self._remote_client(self.config.endpoint)
                elif self.config.endpoint:
                    self._client = docker.DockerClient(base_url=self.config.endpoint, timeout=self.api_timeout)
                else:
                    self._client = docker.from_env(timeout=self.api_timeout)
                # The engine is never reached through an HTTP proxy; without this, requests
                # scans the whole environment for proxy settings on every call.
                self._client.api.trust_env = False
        return self._client

    def _remote_client(self, endpoint: str) -> docker.DockerClient:
        """A client of a remote engine, checked by the guard when dialled like HTTP endpoints.

        ssh:// connects while the client is built, so its name is judged just before; tcp://
        requests go through the guard's adapter, re-resolved, checked and pinned on each
        request (DNS rebinding), the API version request included.
        """
        allow_private = self.config.allow_private_endpoints
        check_endpoint(endpoint, allow_private=allow_private, resolver=self.resolver)
        if endpoint.startswith("ssh://"):
            # Through the ssh client, not paramiko (docker-py imports it all the same): the
            # account's ~/.ssh/config and known_hosts decide key and trust.
            return docker.DockerClient(base_url=endpoint, timeout=self.api_timeout, use_ssh_client=True)
        # A fixed version makes the constructor send nothing: no request goes out before
        # trust_env is off (requests would verify against REQUESTS_CA_BUNDLE instead of the
        # backend's CA) and before the guard is mounted; then the engine is asked.
        client = docker.DockerClient(
            base_url=endpoint, timeout=self.api_timeout, tls=self._tls_config(), version=MINIMUM_DOCKER_API_VERSION
        )
        client.api.trust_env = False
        guarded = GuardedHTTPAdapter(allow_private=allow_private, resolver=self.resolver)
        client.api.mount("http://", guarded)
        client.api.mount("https://", guarded)
        client.api._version = client.api.version(api_version=False)["ApiVersion"]
        return client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    def _tls_config(self) -> docker.tls.TLSConfig | bool:
        """tcp:// with TLS: options tls_cert/tls_key (client certificate) and tls_ca (PEM), written
        to a private directory for the client's lifetime (the library reads files only)."""
        options = self.config.options
        if not (options.get("tls_cert") or options.get("tls_ca")):
            return False
        self._tls_dir = tempfile.TemporaryDirectory(prefix="console-docker-tls-")
        paths = {}
        for name in ("tls_ca", "tls_cert", "tls_key"):
            if options.get(name):
                path = os.path.join(self._tls_dir.name, name + ".pem")
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                    handle.write(options[name])
                paths[name] = path
        client_cert = (paths["tls_cert"], paths["tls_key"]) if "tls_cert" in paths and "tls_key" in paths else None
        return docker.tls.TLSConfig(
            client_cert=client_cert, ca_cert=paths.get("tls_ca"), verify=bool(paths.get("tls_ca"))
        )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._tls_dir is not None:
            self._tls_dir.cleanup()
            self._tls_dir = None

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
            detail=f"{version.get('Os', '')}/{version.get('Arch', '')}; host firewall: {self.firewall_status()}",
        )

    # Host packet filter ----------------------------------------------------------------

    def engine_is_local(self) -> bool:
        """True when the engine is reached over a unix socket, i.e. runs on this host
        (decided from the endpoint alone: no engine call)."""
        endpoint = self.config.endpoint or os.environ.get("DOCKER_HOST", "")
        return endpoint == "" or endpoint.startswith("unix://")

    # Lifecycle -------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        self._check_network_spec(spec.network)
        if spec.network.allow_internet_access:
            self.ensure_firewall()  # before anything is made: refused means nothing left behind
        image = self._resolve_image(spec.template_id, owner=spec.metadata)
        if spec.workspace_volume and not _VOLUME_NAME.match(spec.workspace_volume):
            raise RemoteError(ErrorKind.INVALID, f"not a volume name: {spec.workspace_volume!r}")
        network_mode, gateway = self._network_mode(spec.network, spec.metadata)
        labels = {
            **metadata_labels(spec.metadata),
            LABEL_MANAGED: "1",
            LABEL_KIND: KIND_SANDBOX,
            LABEL_TEMPLATE: spec.template_id,
            # Guards the sandbox's inbound URLs (the console's proxy checks it; inbound.py).
            LABEL_TRAFFIC_TOKEN: new_traffic_token(),
        }
        if self.enforces_lists():
            labels[LABEL_NETWORK] = self.space_network_name(spec.metadata.get(META_SPACE, ""))
        if spec.workspace_volume:
            self._ensure_volume(spec.workspace_volume, spec.metadata)
        try:
            container_id = self._create_and_start(image, labels, spec, network_mode, gateway)
        except RemoteError as exc:
            # The space's network went away under us: its last sandbox was deleted meanwhile
            # and took it along (see _release_network). Make it again, once.
            if exc.kind != ErrorKind.NOT_FOUND or network_mode == "none":
                raise
            network_mode, gateway = self._network_mode(spec.network, spec.metadata)
            container_id = self._create_and_start(image, labels, spec, network_mode, gateway)
        logger.info(
            "created sandbox %s",
            container_id,
            extra={"sandbox_id": container_id, "template": spec.template_id, "network": network_mode},
        )
        self._settle_http_rules(spec.network)
        return self.get(container_id)

    def _create_and_start(
        self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str, resolver: str
    ) -> str:
        container_id = self._create_container(image, labels, spec, network_mode, resolver)
        try:
            with _engine_call("starting the sandbox"):
                self.api.start(container_id)
            if self.enforces_lists():
                # Until its chain is in, the bridge drops everything from the new address.
                DockerEgress(self).apply_policy(container_id, labels[LABEL_NETWORK], spec.network)
            if spec.workspace_volume:
                self._own_workspace(container_id)
        except RemoteError:
            self._remove_container(container_id)
            raise
        return container_id

    def _create_container(
        self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str, resolver: str
    ) -> str:
        limits = spec.resources
        memory = f"{limits.memory_mb}m" if limits.memory_mb else None
        with _engine_call("creating the sandbox"):
            host_config = self.api.create_host_config(
                network_mode=network_mode,
                dns=[resolver],
                mem_limit=memory,
                memswap_limit=memory,  # no swap beyond the memory limit
                nano_cpus=int(limits.cpus * 1e9) if limits.cpus else None,
                pids_limit=limits.pids,
                **_hardening(),
                binds=({spec.workspace_volume: {"bind": WORKSPACE, "mode": "rw"}} if spec.workspace_volume else None),
            )
            created = self.api.create_container(
                image,
                labels=labels,
                environment=dict(spec.env),
                hostname="sandbox",
                host_config=host_config,
            )
        return str(created["Id"])

    def connect(self, sandbox_id: str) -> SandboxInfo:
        info = self.check_state(self.get(sandbox_id))
        if info.state == SandboxState.RUNNING:
            return info  # the common, warm case: one inspect, nothing to resume
        with _engine_call(f"resuming sandbox {sandbox_id}"):
            if info.state == SandboxState.PAUSED:
                self.api.unpause(info.sandbox_id)
            elif info.state in (SandboxState.STOPPED, SandboxState.STARTING):
                self.api.start(info.sandbox_id)
        if self.enforces_lists():
            # A restarted container may have a new address; one switched on while paused has
            # its resolver pointed now.
            DockerEgress(self).reapply(info.sandbox_id)
        logger.info("resumed sandbox %s (%s)", sandbox_id, info.state, extra={"sandbox_id": sandbox_id})
        return dataclasses.replace(info, state=SandboxState.RUNNING)

    def pause(self, sandbox_id: str) -> SandboxInfo:
        seen = self._seen.get(sandbox_id)
        if seen is not None and self.config.idle_mode != IdleMode.STOP:
            try:
                with _engine_call(f"idling sandbox {sandbox_id}"):
                    self.api.pause(sandbox_id)
                return dataclasses.replace(seen, state=SandboxState.PAUSED)
            except RemoteError as exc:
                if exc.kind == ErrorKind.NOT_FOUND:
                    self._seen.pop(sandbox_id, None)
                if exc.kind != ErrorKind.CONFLICT:
                    raise
                # Already paused, or not running: look, then do what its state needs.
        info = self.get(sandbox_id)
        with _engine_call(f"idling sandbox {sandbox_id}"):
            if self.config.idle_mode == IdleMode.STOP:
                if info.state == SandboxState.PAUSED:
                    self.api.unpause(info.sandbox_id)  # a frozen container cannot take SIGTERM
                if info.state in (SandboxState.RUNNING, SandboxState.PAUSED):
                    self.api.stop(info.sandbox_id, timeout=STOP_GRACE_S)
            elif info.state == SandboxState.RUNNING:
                self.api.pause(info.sandbox_id)
        # The engine answered; the new state is known without another inspect.
        idle_state = SandboxState.STOPPED if self.config.idle_mode == IdleMode.STOP else SandboxState.PAUSED
        if info.state in (SandboxState.RUNNING, SandboxState.PAUSED):
            return dataclasses.replace(info, state=idle_state)
        return info

    def get(self, sandbox_id: str) -> SandboxInfo:
        return self._inspect_sandbox(sandbox_id)

    def delete(self, sandbox_id: str) -> None:
        try:
            info = self._inspect_sandbox(sandbox_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        self._remove_container(info.sandbox_id)
        if self.enforces_lists():
            DockerEgress(self).forget(info.sandbox_id)
        self._release_network(info.metadata.get(META_SPACE, ""))
        logger.info("deleted sandbox %s", info.sandbox_id, extra={"sandbox_id": info.sandbox_id})

    def _remove_container(self, container_id: str) -> None:
        self._seen.pop(container_id, None)
        try:
            with _engine_call(f"deleting sandbox {container_id}"):
                self.api.remove_container(container_id, force=True)
        except RemoteError as exc:
            # Missing, or another caller's removal already in progress: both mean "gone".
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.CONFLICT):
                raise

    def _inspect_sandbox(self, sandbox_id: str) -> SandboxInfo:
        """Inspect a console sandbox (not_found for any other container) and remember it."""
        if not _SANDBOX_ID.match(sandbox_id or ""):
            raise RemoteError(ErrorKind.INVALID, f"malformed sandbox id {sandbox_id!r}")
        with _engine_call(f"sandbox {sandbox_id}"):
            attrs: dict[str, Any] = self.api.inspect_container(sandbox_id)
        labels = attrs["Config"].get("Labels") or {}
        if labels.get(LABEL_MANAGED) != "1" or labels.get(LABEL_KIND) != KIND_SANDBOX:
            raise RemoteError(ErrorKind.NOT_FOUND, f"sandbox {sandbox_id}: no such sandbox")
        info = SandboxInfo(
            sandbox_id=attrs["Id"],
            state=_STATES.get(attrs["State"]["Status"], SandboxState.GONE),
            template_id=labels.get(LABEL_TEMPLATE, ""),
            metadata=metadata_from_labels(labels),
            started_at=_parse_time(attrs.get("Created")),
            traffic_token=labels.get(LABEL_TRAFFIC_TOKEN) or None,
        )
        self._seen[info.sandbox_id] = info
        return info

    def _container_id(self, sandbox_id: str) -> str:
        """The full id of a console sandbox, inspecting only the first time it is seen."""
        if sandbox_id in self._seen:
            return sandbox_id
        return self._inspect_sandbox(sandbox_id).sandbox_id

    # Images, networks, volumes -------------------------------------------------------

    def _resolve_image(self, template_id: str, owner: Mapping[str, str] | None = None) -> str:
        """The image id behind a template or snapshot id; not_found names the template.

        With `owner` (the new sandbox's metadata): an image labelled with another
        installation or space is not found. A tag is only a name: another tenant may build
        one a config still names after its template was deleted."""
        if not template_id:
            raise RemoteError(ErrorKind.INVALID, "no template id given")
        if is_snapshot_id(template_id):
            attrs = self._snapshot_image(template_id)
            _check_image_owner(attrs, owner, template_id)
            return str(attrs["Id"])
        attrs = self._console_image(template_id, f"template {template_id!r}")
        _check_image_owner(attrs, owner, template_id)
        if attrs["Config"]["Labels"].get(LABEL_KIND) != KIND_TEMPLATE:
            # A snapshot is started by its snap- id only: a bare image id would bypass the
            # console's checks of whose snapshot it is.
            raise RemoteError(ErrorKind.NOT_FOUND, f"template {template_id!r} not found (the image is a snapshot)")
        return str(attrs["Id"])

    def _console_image(self, reference: str, what: str) -> dict[str, Any]:
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

    def _snapshot_image(self, snapshot_id: str) -> dict[str, Any]:
        short = snapshot_id.removeprefix(SNAPSHOT_PREFIX)
        if not re.fullmatch(r"[0-9a-f]{12,64}", short):
            raise RemoteError(ErrorKind.NOT_FOUND, f"snapshot {snapshot_id!r} not found")
        attrs = self._console_image(short, f"snapshot {snapshot_id!r}")
        if attrs["Config"]["Labels"].get(LABEL_KIND) != KIND_SNAPSHOT:
            raise RemoteError(ErrorKind.NOT_FOUND, f"snapshot {snapshot_id!r} not found")
        return attrs

    def _ensure_volume(self, name: str, metadata: Mapping[str, str]) -> None:
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
        result = self._run(container_id, ("chown", f"{SANDBOX_UID}:{SANDBOX_UID}", WORKSPACE), user="root")
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

    def release_space(self, space: str) -> list[str]:
        """The space's networks (and, through `_release_network`, their host state) removed
        once no container is on them; conflict naming a network that a container keeps."""
        names = (self.space_network_name(space), self.inbound_network_name(space))
        before = self._networks_named(names)
        self._release_network(space)
        left = self._networks_named(names)
        if left:
            raise RemoteError(ErrorKind.CONFLICT, f"network {', '.join(left)} is still in use by a container")
        return before

    def _networks_named(self, names: tuple[str, ...]) -> list[str]:
        with _engine_call("listing networks"):
            found = {row["Name"] for row in self.api.networks(names=list(names))}
        return [name for name in names if name in found]

    # Exec ------------------------------------------------------------------------------

    # Capabilities ----------------------------------------------------------------------

    def files(self) -> FilesCapability:
        return DockerFiles(self)

    def snapshots(self) -> SnapshotsCapability:
        return DockerSnapshots(self)

    def templates(self) -> TemplatesCapability:
        return DockerTemplates(self)

    def volumes(self) -> VolumesCapability:
        return DockerVolumes(self)

    def egress(self) -> EgressCapability | None:
        return DockerEgress(self) if self.enforces_lists() else None

    def pty(self) -> PtyCapability:
        return DockerPtys(self)

    def stats(self) -> StatsCapability:
        from .stats import DockerStats

        return DockerStats(self)


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
