"""The Docker engine as the adapter's parts see it: the client (local socket, or a remote
engine through the guard), the console sandbox lookup (inspect, the ids already seen), commands
run in a container (`DockerExec`), and container removal.

Every part of the adapter (`networks`, `listing`, the egress component, the capabilities)
receives this one object and uses its public methods; none reaches into another's members.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors
import docker.tls
from docker.constants import MINIMUM_DOCKER_API_VERSION

from ..base import (
    BackendConfig,
    ErrorKind,
    ExecRequest,
    ExecResult,
    NotStarted,
    RemoteError,
    SandboxInfo,
    SandboxState,
)
from ..guard import GuardedHTTPAdapter, Resolver, check_endpoint, system_resolver
from ..unix_socket import SCHEME, check_unix_socket
from .common import (
    _SANDBOX_ID,
    _STATES,
    KIND_SANDBOX,
    LABEL_TEMPLATE,
    _engine_call,
    _parse_time,
    metadata_from_labels,
)
from .exec import DockerExec
from .image import LABEL_KIND, LABEL_MANAGED
from .inbound import LABEL_TRAFFIC_TOKEN
from .repair import control_timeout
from .settings import DockerOptions
from .wire import Pending, UnixWire

# How many images' layer counts an engine object keeps (a few hundred bytes each) before it
# starts again: a long-lived adapter snapshots from ever new images.
LAYER_COUNTS_KEPT = 512


class DockerEngine:
    """One engine connection and what every part asks of it."""

    def __init__(
        self,
        config: BackendConfig,
        options: DockerOptions | None = None,
        *,
        api_timeout: int,
        resolver: Resolver | None = None,
    ) -> None:
        self.config = config
        self.options = options or DockerOptions.parse(config.options)
        self.api_timeout = api_timeout
        self.resolver = resolver or system_resolver  # remote engines' names (tcp://, ssh://)
        self._client: docker.DockerClient | None = None
        self._wire: UnixWire | None = None
        # Request threads' first calls build one client and one wire. Taken in this order only
        # (`wire` asks `client` under its lock), so neither waits on the other in a cycle.
        self._wire_lock = threading.Lock()
        self._client_lock = threading.Lock()
        self._tls_dir: tempfile.TemporaryDirectory[str] | None = None
        # Console sandboxes by full container id, as last inspected. Ids, labels, template and
        # creation time never change, so an id here needs no check that it is a console
        # sandbox, and a pause needs no inspect before it; the state is never reused.
        self._seen: dict[str, SandboxInfo] = {}
        # Labels of the console sandboxes seen (a delete reads its scratch disk's from them),
        # and those this engine object paused since (a connect unpauses without an inspect).
        self._labels: dict[str, dict[str, str]] = {}
        self._paused: set[str] = set()
        # The image of each sandbox seen, and the layer count of each image asked about: a
        # container's image and an image's layers (its id is their digest) never change, so a
        # snapshot asks the engine for neither after the first time. Each snapshot is a new
        # image, and a deleted one is never forgotten otherwise: the layer counts start again
        # once LAYER_COUNTS_KEPT are kept.
        self._images: dict[str, str] = {}
        self._layer_counts: dict[str, int] = {}
        self.commands = DockerExec(self)
        # Seconds one control call (inspect, pause, unpause) may take: the backend option
        # `control_timeout` (repair.py), so a wedged engine answers `timeout` in seconds.
        self.control_timeout = control_timeout(self.options.control_timeout)

    # Connection ------------------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        client = self._client
        if client is None:
            # Under a lock: threads racing on the first call would each build one, and all but
            # the one kept would leave their connections open.
            with self._client_lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
        return client

    def _connect(self) -> docker.DockerClient:
        with _engine_call("connecting to the Docker engine"):
            if self.config.endpoint.startswith(("tcp://", "ssh://")):
                client = self._remote_client(self.config.endpoint)
            elif self.config.endpoint:
                if self.config.endpoint.startswith(SCHEME):
                    try:
                        check_unix_socket(self.config.endpoint)  # a socket, never /etc/passwd
                    except RemoteError as exc:
                        raise RemoteError(
                            exc.kind, f"connecting to the Docker engine: {exc.message}", retryable=exc.retryable
                        ) from None
                client = docker.DockerClient(base_url=self.config.endpoint, timeout=self.api_timeout)
            else:
                client = docker.from_env(timeout=self.api_timeout)
            # The engine is never reached through an HTTP proxy; without this, requests
            # scans the whole environment for proxy settings on every call.
            client.api.trust_env = False
        return client

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    @property
    def wire(self) -> UnixWire | None:
        """The engine's unix socket spoken directly (wire.py), for the exec path; None for an
        engine reached otherwise (docker-py then)."""
        if self._wire is None and self.is_local():
            # Under a lock: threads racing on the first exec would each build one, and all but
            # the one kept would leave their kept connections open.
            with self._wire_lock:
                if self._wire is None:
                    endpoint = (
                        self.config.endpoint or os.environ.get("DOCKER_HOST", "") or f"{SCHEME}/var/run/docker.sock"
                    )
                    version = self.api.api_version  # connects first: the checks of `client` apply
                    self._wire = UnixWire(endpoint.removeprefix(SCHEME), version, self.api_timeout)
        return self._wire

    def is_local(self) -> bool:
        """True when the engine is reached over a unix socket, i.e. runs on this host
        (decided from the endpoint alone: no engine call)."""
        endpoint = self.config.endpoint or os.environ.get("DOCKER_HOST", "")
        return endpoint == "" or endpoint.startswith("unix://")

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

    def _tls_config(self) -> docker.tls.TLSConfig | bool:
        """tcp:// with TLS: options tls_cert/tls_key (client certificate) and tls_ca (PEM), written
        to a private directory for the client's lifetime (the library reads files only)."""
        options = self.options
        if not (options.tls_cert or options.tls_ca):
            return False
        self._tls_dir = tempfile.TemporaryDirectory(prefix="console-docker-tls-")
        paths = {}
        for name in ("tls_ca", "tls_cert", "tls_key"):
            if pem := getattr(options, name):
                path = os.path.join(self._tls_dir.name, name + ".pem")
                with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                    handle.write(pem)
                paths[name] = path
        client_cert = (paths["tls_cert"], paths["tls_key"]) if "tls_cert" in paths and "tls_key" in paths else None
        return docker.tls.TLSConfig(
            client_cert=client_cert, ca_cert=paths.get("tls_ca"), verify=bool(paths.get("tls_ca"))
        )

    def close(self) -> None:
        # Under both locks: a client or wire being built meanwhile is closed too, not kept open.
        with self._wire_lock, self._client_lock:
            if self._wire is not None:
                self._wire.close()
                self._wire = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._tls_dir is not None:
                self._tls_dir.cleanup()
                self._tls_dir = None

    # Console sandboxes -------------------------------------------------------------------

    def inspect_sandbox(self, sandbox_id: str, *, timeout_s: float | None = None) -> SandboxInfo:
        """Inspect a console sandbox (not_found for any other container) and remember it."""
        if not _SANDBOX_ID.match(sandbox_id or ""):
            raise RemoteError(ErrorKind.INVALID, f"malformed sandbox id {sandbox_id!r}")
        return self.sandbox_info(sandbox_id, self.inspect_container(sandbox_id, timeout_s=timeout_s))

    def look_at_sandbox(self, sandbox_id: str) -> Pending | None:
        """`inspect_sandbox`'s engine call sent now, its answer read by `sandbox_info(sandbox_id,
        pending.answer())` (bounded as a control call). None when this engine is not spoken to directly (wire.py)."""
        wire = self.wire if _SANDBOX_ID.match(sandbox_id or "") else None
        if wire is None:
            return None
        with _engine_call(f"sandbox {sandbox_id}"):
            return wire.begin_container_inspect(sandbox_id, timeout=self.control_timeout)

    def sandbox_info(self, sandbox_id: str, attrs: dict[str, Any]) -> SandboxInfo:
        """The console sandbox `sandbox_id` from its inspect (not_found for any other container),
        remembered."""
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
        self._labels[info.sandbox_id] = dict(labels)
        self._images[info.sandbox_id] = str(attrs.get("Image") or "")
        return info

    def bound(self, timeout_s: float | None) -> float:
        """A control call's timeout: the caller's, never above `control_timeout`."""
        return min(timeout_s, self.control_timeout) if timeout_s else self.control_timeout

    def inspect_container(self, container: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """`docker inspect`, bounded by `bound(timeout_s)` (a wedged container hangs it)."""
        with _engine_call(f"sandbox {container}"):
            wire = self.wire
            if wire is not None:
                return wire.container_inspect(container, timeout=self.bound(timeout_s))
            api = self.api
            response = api._get(api._url("/containers/{0}/json", container), timeout=self.bound(timeout_s))
            attrs: dict[str, Any] = api._result(response, True)
        return attrs

    def container_id(self, sandbox_id: str) -> str:
        """The full id of a console sandbox, inspecting only the first time it is seen."""
        if sandbox_id in self._seen:
            return sandbox_id
        return self.inspect_sandbox(sandbox_id).sandbox_id

    def seen(self, sandbox_id: str) -> SandboxInfo | None:
        """The sandbox as last inspected by this engine object (None: not seen yet)."""
        return self._seen.get(sandbox_id)

    def labels_of(self, sandbox_id: str) -> dict[str, str] | None:
        """The sandbox's labels as last inspected (None: not seen)."""
        return self._labels.get(sandbox_id)

    def layer_count(self, sandbox_id: str) -> int:
        """How many layers the sandbox's image has, asked of the engine once per image (and
        the image once per sandbox, if no inspect has named it yet)."""
        image = self._images.get(sandbox_id) or str(self.inspect_container(sandbox_id)["Image"])
        count = self._layer_counts.get(image)
        if count is None:
            with _engine_call(f"image of sandbox {sandbox_id}"):
                count = len(self.api.inspect_image(image)["RootFS"].get("Layers") or [])
            if len(self._layer_counts) >= LAYER_COUNTS_KEPT:
                self._layer_counts.clear()  # one call, safe among threads; each asked again once
            self._layer_counts[image] = count
        return count

    def paused_here(self, sandbox_id: str, paused: bool | None = None) -> bool:
        """Whether this engine object paused the sandbox and has not resumed it since; with
        `paused`, record that first."""
        if paused is True:
            self._paused.add(sandbox_id)
        elif paused is False:
            self._paused.discard(sandbox_id)
        return sandbox_id in self._paused

    def forget(self, sandbox_id: str) -> None:
        self._seen.pop(sandbox_id, None)
        self._labels.pop(sandbox_id, None)
        self._images.pop(sandbox_id, None)
        self._paused.discard(sandbox_id)

    def networks_of(self, container_id: str) -> dict[str, Any]:
        """The container's endpoints by network name (inspected now)."""
        with _engine_call(f"sandbox {container_id}"):
            attrs = self.api.inspect_container(container_id)
        return dict(attrs["NetworkSettings"]["Networks"] or {})

    def remove_container(self, container_id: str) -> None:
        """Removed (idempotent: missing, or another caller's removal in progress, is gone)."""
        self.forget(container_id)
        try:
            with _engine_call(f"deleting sandbox {container_id}"):
                self.api.remove_container(container_id, force=True)
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.CONFLICT):
                raise

    # Commands --------------------------------------------------------------------------

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        try:
            container_id = self.container_id(sandbox_id)
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
            raise NotStarted(exc.kind, exc.message) from exc
        return self.commands.exec(container_id, request)

    def run(
        self,
        container_id: str,
        command: tuple[str, ...],
        *,
        user: str = "user",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float = 60.0,
        max_output_bytes: int = 1024 * 1024,
    ) -> ExecResult:
        return self.commands.run(
            container_id,
            command,
            user=user,
            cwd=cwd,
            env=env,
            stdin=stdin,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
        )

    def run_checked(self, container_id: str, command: tuple[str, ...], what: str, user: str = "root") -> bytes:
        return self.commands.run_checked(container_id, command, what, user=user)
