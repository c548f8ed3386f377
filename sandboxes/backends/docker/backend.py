"""Docker backend: one long-lived container per sandbox on a local or remote engine.

Mapping of the contract (see docs/backends.md, "Docker"):

- sandbox id = the container's full id; tini is PID 1 (from the image's entrypoint);
  metadata lives in labels `console.meta.<key>` next to the console's markers
  (`console.managed=1`, `console.kind=sandbox`, `console.template=<template id>`);
- templates are images labelled `console.kind=template` (template id = image tag),
  snapshots are `docker commit` images labelled `console.kind=snapshot`, shown as
  `snap-<12 hex of the image id>`;
- idle = `docker pause` or `docker stop` per the config's idle mode, resumed by connect();
- outbound off = network mode "none"; on = the space's own console-managed bridge network
  (inter-container traffic off), kept off the host's addresses and link-local/metadata by
  the host packet filter of `docker_firewall`. DNS is always 127.0.0.1, so nothing inside a
  sandbox reaches an outside resolver;
- hardening: every capability dropped but `ROOT_CAPABILITIES`, no-new-privileges, the
  engine's default seccomp and AppArmor profiles, no host paths or engine socket inside.

Imports nothing of the project but `base` and `guard` (and the image builder and the host
packet filter next to it).
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import http.client
import io
import json
import os
import posixpath
import re
import secrets
import select
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, NoReturn

import docker
import docker.errors
import docker.tls
import requests.exceptions
import urllib3.exceptions
from docker.constants import MINIMUM_DOCKER_API_VERSION

from ..base import (
    META_SPACE,
    SANDBOX_UID,
    SNAPSHOT_PREFIX,
    WORKSPACE,
    Backend,
    BackendConfig,
    ErrorKind,
    ExecRequest,
    ExecResult,
    FileInfo,
    FilesCapability,
    HealthInfo,
    IdleMode,
    ListQuery,
    NetworkCapabilities,
    NetworkSpec,
    Page,
    PtyCapability,
    PtyHandle,
    PtySize,
    RemoteError,
    SandboxInfo,
    SandboxSpec,
    SandboxState,
    SnapshotInfo,
    SnapshotsCapability,
    TemplateBuildSpec,
    TemplateInfo,
    TemplatesCapability,
    VolumesCapability,
    is_snapshot_id,
)
from ..guard import GuardedHTTPAdapter, Resolver, check_endpoint, system_resolver
from .firewall import apply_ruleset, bridge_name, render_ruleset, table_present
from .image import (
    DEFAULT_BASE_IMAGE,
    KIND_TEMPLATE,
    LABEL_KIND,
    LABEL_MANAGED,
    LABEL_TEMPLATE_DESCRIPTION,
    LABEL_TEMPLATE_NAME,
    ImageBuildError,
    build_rootfs_image,
    template_labels,
)

KIND_SANDBOX = "sandbox"
KIND_SNAPSHOT = "snapshot"
KIND_BUILD = "build"
KIND_WORKSPACE = "workspace"
LABEL_TEMPLATE = "console.template"
LABEL_META_PREFIX = "console.meta."
# Images inherit the labels of the container they were committed from, and containers those
# of their image: this label lists the metadata keys that really belong to the sandbox.
LABEL_META_KEYS = "console.meta-keys"
LABEL_SNAPSHOT_SOURCE = "console.snapshot.source"
LABEL_SNAPSHOT_NAME = "console.snapshot.name"

DEFAULT_NETWORK = "sandbox-console-net"
KIND_NETWORK = "network"
LABEL_NETWORK_SPACE = "console.network.space"
# What the root install path (apt/dpkg, pip, npm, chown of /workspace, killing the session
# user's timed-out commands) needs; every other capability is dropped. Why each is kept:
# docs/security.md, "Sandbox hardening".
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
# Left to the engine on purpose: no "seccomp=…" or "apparmor=…" entry keeps its defaults.
SECURITY_OPTIONS = ("no-new-privileges",)
HOST_FIREWALL_MODES = ("auto", "external")
SNAPSHOT_REPOSITORY = "sandbox-console/snapshots"
TEMPLATE_REPOSITORY = "sandbox-console"
DEFAULT_API_TIMEOUT_S = 120
STOP_GRACE_S = 5
PTY_PID_DIR = "/tmp/.console-pty"  # noqa: S108 - a path inside the sandbox, not on the host

# Exec users: the sandbox account, or root for the explicit install path. (uid, home)
_USERS = {"user": (SANDBOX_UID, "/home/user"), "root": (0, "/root")}
_SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# A named volume, never a host path ("/etc", "./x" would be bind mounts).
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
_TEMPLATE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_STATES = {
    "created": SandboxState.STARTING,
    "restarting": SandboxState.STARTING,
    "running": SandboxState.RUNNING,
    "paused": SandboxState.PAUSED,
    "exited": SandboxState.STOPPED,
    "removing": SandboxState.GONE,
    "dead": SandboxState.GONE,
}

# Every exec runs as `setsid -w timeout -s KILL BACKSTOP /bin/sh -c _EXEC_WRAPPER ...`: its own
# session and process group, led by `timeout`, so a timeout can kill the whole group. The
# console kills the group itself when an exec's deadline passes; `timeout` is the backstop for
# when it cannot (the engine went away mid-call): the group dies inside the sandbox a little
# after the deadline, so no command outlives it. The wrapper records the group's id (its
# parent, `timeout`) where a second exec can find it. $1 is the pid file.
_EXEC_WRAPPER = 'echo $PPID > "$1"; pid_file=$1; shift; "$@"; rc=$?; rm -f "$pid_file"; exit $rc'
EXEC_BACKSTOP_GRACE_S = 2.0
# Waits briefly for the pid file (a very short timeout can beat the wrapper), then kills
# the whole group. $0 is the pid file.
_KILL_GROUP = (
    'for i in 1 2 3 4 5 6 7 8 9 10; do [ -s "$0" ] && break; sleep 0.05; done; '
    '[ -s "$0" ] && kill -KILL -"$(cat "$0")" 2>/dev/null; rm -f "$0"; true'
)
# Prints JSON for stat (one path) or list (a directory's entries); exit 2 = missing,
# 3 = not a directory. Python is in every template (the base image carries python3).
_FS_PROBE = r"""
import json, os, stat, sys
def info(p):
    s = os.lstat(p)
    return {"path": p, "name": os.path.basename(p.rstrip("/")) or "/",
            "dir": stat.S_ISDIR(s.st_mode), "link": stat.S_ISLNK(s.st_mode),
            "size": s.st_size, "mode": stat.S_IMODE(s.st_mode),
            "mtime": s.st_mtime}
op, path = sys.argv[1], sys.argv[2]
if not os.path.lexists(path):
    sys.exit(2)
if op == "stat":
    print(json.dumps(info(path)))
elif not os.path.isdir(path):
    sys.exit(3)
else:
    print(json.dumps([info(os.path.join(path, n)) for n in sorted(os.listdir(path))]))
"""


# ---------------------------------------------------------------------------------------
# Error translation


_CUT_MID_ANSWER = (
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.ProtocolError,
    http.client.IncompleteRead,
)


def _translate(exc: Exception, what: str) -> RemoteError:
    """One docker-py / requests failure as a RemoteError; the vendor type never leaks."""
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, docker.errors.NotFound):
        return RemoteError(ErrorKind.NOT_FOUND, f"{what}: {_explanation(exc)}")
    if isinstance(exc, docker.errors.APIError):
        return _translate_status(exc.status_code or 500, f"{what}: {_explanation(exc)}")
    if isinstance(exc, requests.exceptions.Timeout | socket.timeout):
        return RemoteError(ErrorKind.TIMEOUT, f"{what}: the Docker engine did not answer in time")
    if isinstance(exc, requests.exceptions.ConnectionError | ConnectionError | FileNotFoundError):
        return RemoteError(ErrorKind.UNAVAILABLE, f"{what}: the Docker engine is unreachable ({exc})")
    if isinstance(exc, _CUT_MID_ANSWER):
        # The connection broke while the engine's answer was coming in: the engine went away
        # (or the path to it), the same as a refused connection, not a fault of the call.
        return RemoteError(
            ErrorKind.UNAVAILABLE, f"{what}: the connection to the Docker engine broke mid-answer ({exc})"
        )
    if isinstance(exc, docker.errors.DockerException):
        # Raised by the client constructor when the engine does not answer the version probe.
        return RemoteError(ErrorKind.UNAVAILABLE, f"{what}: the Docker engine is unreachable ({exc})")
    return RemoteError(ErrorKind.INTERNAL, f"{what}: {exc.__class__.__name__}: {exc}")


def _translate_status(status: int, message: str) -> RemoteError:
    kinds = {
        400: ErrorKind.INVALID,
        401: ErrorKind.UNAUTHORIZED,
        403: ErrorKind.FORBIDDEN,
        404: ErrorKind.NOT_FOUND,
        409: ErrorKind.CONFLICT,
        429: ErrorKind.RATE_LIMITED,
        503: ErrorKind.UNAVAILABLE,
    }
    return RemoteError(kinds.get(status, ErrorKind.INTERNAL), message)


def _explanation(exc: docker.errors.APIError) -> str:
    return str(exc.explanation or exc)


@contextmanager
def _engine_call(what: str) -> Iterator[None]:
    try:
        yield
    except RemoteError:
        raise
    except Exception as exc:
        raise _translate(exc, what) from exc


def _parse_time(value: str | int | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return datetime.fromtimestamp(value, UTC)
    if value.startswith("0001-"):
        return None
    with suppress(ValueError):
        # Docker prints nanoseconds; Python keeps microseconds.
        head, _, rest = value.rstrip("Z").partition(".")
        return datetime.fromisoformat(f"{head}.{(rest + '000000')[:6]}+00:00")
    return None


# ---------------------------------------------------------------------------------------
# Labels <-> metadata


def metadata_labels(metadata: Mapping[str, str]) -> dict[str, str]:
    labels = {LABEL_META_PREFIX + key: value for key, value in metadata.items()}
    labels[LABEL_META_KEYS] = json.dumps(sorted(metadata))
    return labels


def metadata_from_labels(labels: Mapping[str, str]) -> dict[str, str]:
    try:
        keys = json.loads(labels.get(LABEL_META_KEYS, "[]"))
    except ValueError:
        keys = []
    return {key: labels[LABEL_META_PREFIX + key] for key in keys if LABEL_META_PREFIX + key in labels}


def _snapshot_id(image_id: str) -> str:
    return SNAPSHOT_PREFIX + image_id.removeprefix("sha256:")[:12]


# ---------------------------------------------------------------------------------------
# Page tokens: keyset in the engine's own order (newest first). A token holds the creation
# second of the previous page's last row and the id prefixes of that page's rows, last first:
# the next page starts right after the newest of them still there, so deletions between pages
# skip nothing and no page re-reads the ones before it.

_ANCHOR_BYTES = 32  # the full id: the engine's `before` filter takes no prefix
MAX_ANCHORS = 100  # the reaper's page: a whole page deleted still never falls back


@dataclasses.dataclass(frozen=True)
class _Cursor:
    created: int
    anchors: tuple[str, ...]


def _encode_token(rows: builtins.list[dict[str, Any]]) -> str:
    """The token after `rows` (the engine rows a page consumed; never empty)."""
    anchors = [row["Id"][: _ANCHOR_BYTES * 2] for row in reversed(rows)][:MAX_ANCHORS]
    payload = int(rows[-1]["Created"]).to_bytes(8, "big") + b"".join(bytes.fromhex(anchor) for anchor in anchors)
    return base64.urlsafe_b64encode(payload).decode().rstrip("=")


def _decode_token(token: str) -> _Cursor:
    try:
        payload = base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4))
    except (ValueError, UnicodeEncodeError):
        raise RemoteError(ErrorKind.INVALID, "malformed page token") from None
    body = payload[8:]
    if len(payload) < 8 + _ANCHOR_BYTES or len(body) % _ANCHOR_BYTES:
        raise RemoteError(ErrorKind.INVALID, "malformed page token")
    anchors = tuple(body[i : i + _ANCHOR_BYTES].hex() for i in range(0, len(body), _ANCHOR_BYTES))
    return _Cursor(created=int.from_bytes(payload[:8], "big"), anchors=anchors)


# ---------------------------------------------------------------------------------------
# The hijacked exec socket


class _ExecStream:
    """The raw socket of an upgraded exec connection, with read-ahead recovered.

    docker-py hands back the socket after http.client has parsed the response headers; its
    buffered reader may already hold the first bytes of output, so they are taken first.
    """

    def __init__(self, sock: Any) -> None:
        # Holding docker-py's wrapper keeps its HTTP response (and so the connection) alive.
        self.holder = sock
        self.raw: socket.socket = getattr(sock, "_sock", sock)
        self.pending = self._buffered_bytes(sock)
        self.raw.settimeout(None)

    def _buffered_bytes(self, sock: Any) -> bytes:
        response = getattr(sock, "_response", None)
        reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
        if reader is None:
            return b""
        self.raw.setblocking(False)
        try:
            data = reader.peek(1) or b""
            return reader.read1(len(data)) if data else b""
        except (OSError, ValueError):
            return b""
        finally:
            self.raw.setblocking(True)

    def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        """Up to max_bytes; b"" at end of stream; TimeoutError when nothing came in time.

        Waits with poll() instead of a socket timeout: the socket stays blocking, so another
        thread can keep sending stdin on it meanwhile.
        """
        if self.pending:
            data, self.pending = self.pending[:max_bytes], self.pending[max_bytes:]
            return data
        poller = select.poll()
        poller.register(self.raw, select.POLLIN | select.POLLHUP | select.POLLERR)
        if not poller.poll(None if timeout is None else max(int(timeout * 1000), 1)):
            raise TimeoutError("no data in time")
        return self.raw.recv(max_bytes)

    def send_all(self, data: bytes) -> None:
        self.raw.sendall(data)

    def close_input(self) -> None:
        with suppress(OSError):
            self.raw.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        # shutdown() first: it wakes a stdin thread blocked in sendall, close() alone does not.
        with suppress(OSError):
            self.raw.shutdown(socket.SHUT_RDWR)
        with suppress(OSError):
            self.raw.close()


class _Demuxer:
    """Splits Docker's multiplexed stream (8-byte header per frame) into stdout and stderr,
    keeping at most `cap` bytes of each; the rest is read and dropped."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buffer = b""
        self.out = {1: bytearray(), 2: bytearray()}
        self.truncated = False

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 8:
            stream, length = self.buffer[0], int.from_bytes(self.buffer[4:8], "big")
            if len(self.buffer) < 8 + length:
                return
            payload, self.buffer = self.buffer[8 : 8 + length], self.buffer[8 + length :]
            self._keep(stream, payload)

    def _keep(self, stream: int, payload: bytes) -> None:
        target = self.out.get(stream)
        if target is None:
            return
        room = self.cap - len(target)
        if len(payload) > room:
            self.truncated = True
        if room > 0:
            target += payload[:room]


# ---------------------------------------------------------------------------------------
# The backend


class DockerBackend(Backend):
    """Sandboxes as long-lived containers on a Docker engine (local socket or base URL).

    Options (BackendConfig.options): `network` (prefix of the per-space bridge networks,
    default "sandbox-console-net"), `timeout` (seconds per engine call, default 120),
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
            # Through the ssh client (no paramiko): its known_hosts decides trust.
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

    def firewall_status(self) -> str:
        """What keeps online sandboxes off the host's addresses, in words (never pretends).
        Read-only: it looks at the host's ruleset and changes nothing."""
        if self.host_firewall == "external":
            return "applied outside the console (host_firewall=external); not checked"
        if not self.engine_is_local():
            return "NOT in force: the engine is remote and the console can only filter its own host"
        present = table_present()
        if present.applied:
            return present.detail
        return f"NOT in force: {present.detail} (applied at the next sandbox with outbound on, as root)"

    def ensure_firewall(self) -> None:
        """Make sure the host ruleset is loaded before an online sandbox exists (it names no
        network: new ones are covered by their bridge-name prefix). Loaded only when missing,
        so live set elements of the same table survive. In "auto" mode a ruleset that cannot
        be loaded refuses the online sandbox: its network would otherwise reach the host's
        own addresses and the metadata range."""
        if self.host_firewall == "external":
            return
        if not self.engine_is_local():
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "outbound needs the host packet filter, which the console applies only to a "
                "local engine; apply it on the engine's host and set host_firewall=external "
                "(docs/security.md)",
            )
        with self._firewall_lock:
            if table_present().applied:
                return
            result = apply_ruleset(render_ruleset())
            if not result.applied:
                raise RemoteError(
                    ErrorKind.UNSUPPORTED,
                    f"outbound needs the host packet filter, and it could not be applied: {result.detail} "
                    "(run the console as root with nftables installed, or apply it yourself and set "
                    "host_firewall=external; docs/security.md)",
                )

    def network_capabilities(self) -> NetworkCapabilities:
        return NetworkCapabilities(outbound_toggle=True, inbound_toggle=False)

    # Lifecycle -------------------------------------------------------------------------

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        self._check_network_spec(spec.network)
        if spec.network.allow_internet_access:
            self.ensure_firewall()  # before anything is made: refused means nothing left behind
        image = self._resolve_image(spec.template_id)
        if spec.workspace_volume and not _VOLUME_NAME.match(spec.workspace_volume):
            raise RemoteError(ErrorKind.INVALID, f"not a volume name: {spec.workspace_volume!r}")
        network_mode = self._network_mode(spec.network, spec.metadata)
        labels = {
            **metadata_labels(spec.metadata),
            LABEL_MANAGED: "1",
            LABEL_KIND: KIND_SANDBOX,
            LABEL_TEMPLATE: spec.template_id,
        }
        if spec.workspace_volume:
            self._ensure_volume(spec.workspace_volume, spec.metadata)
        try:
            container_id = self._create_and_start(image, labels, spec, network_mode)
        except RemoteError as exc:
            # The space's network went away under us: its last sandbox was deleted meanwhile
            # and took it along (see _release_network). Make it again, once.
            if exc.kind != ErrorKind.NOT_FOUND or network_mode == "none":
                raise
            network_mode = self._network_mode(spec.network, spec.metadata)
            container_id = self._create_and_start(image, labels, spec, network_mode)
        return self.get(container_id)

    def _create_and_start(self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str) -> str:
        container_id = self._create_container(image, labels, spec, network_mode)
        try:
            with _engine_call("starting the sandbox"):
                self.api.start(container_id)
            if spec.workspace_volume:
                self._own_workspace(container_id)
        except RemoteError:
            self._remove_container(container_id)
            raise
        return container_id

    def _create_container(self, image: str, labels: dict[str, str], spec: SandboxSpec, network_mode: str) -> str:
        limits = spec.resources
        memory = f"{limits.memory_mb}m" if limits.memory_mb else None
        with _engine_call("creating the sandbox"):
            host_config = self.api.create_host_config(
                network_mode=network_mode,
                dns=["127.0.0.1"],
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

    def list(self, query: ListQuery) -> Page:
        """One page, newest first, filtered by the engine; the token names where the next starts.

        The engine filters by label and state and stops after `limit + 1` rows, so a page costs
        the same however many sandboxes exist; `before=<id>` resumes right after a row of the
        previous page (the engine's own order, creation time to the nanosecond).
        """
        if query.limit <= 0:
            raise RemoteError(ErrorKind.INVALID, "limit must be positive")
        cursor = _decode_token(query.page_token) if query.page_token else None
        filters = self._list_filters(query)
        rows = self._rows_after(cursor, filters, query.limit + 1) if cursor else self._rows(filters, query.limit + 1)
        consumed = rows[: query.limit]
        page = [row for row in consumed if self._row_matches(row, query)]
        next_token = _encode_token(consumed) if len(rows) > query.limit else None
        return Page(items=tuple(self._info_from_row(row) for row in page), next_token=next_token)

    def _list_filters(self, query: ListQuery) -> dict[str, builtins.list[str]]:
        labels = [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SANDBOX}"]
        labels += [f"{LABEL_META_PREFIX}{key}={value}" for key, value in query.metadata.items()]
        filters = {"label": labels}
        if query.states:
            filters["status"] = sorted(status for status, state in _STATES.items() if state in query.states)
        return filters

    def _rows(self, filters: Mapping[str, Any], limit: int | None) -> builtins.list[dict[str, Any]]:
        with _engine_call("listing sandboxes"):
            rows: builtins.list[dict[str, Any]] = self.api.containers(
                all=True, filters=dict(filters), limit=limit if limit is not None else -1
            )
        return rows

    def _rows_after(self, cursor: _Cursor, filters: Mapping[str, Any], limit: int) -> builtins.list[dict[str, Any]]:
        # The newest anchor still there marks the position; anchors newer than it are gone, so
        # nothing the previous page returned comes back. Each deleted row costs one refused
        # call at most once, which keeps a listing linear even while the reaper deletes.
        for anchor in cursor.anchors:
            with _engine_call("listing sandboxes"):
                try:
                    rows: builtins.list[dict[str, Any]] = self.api.containers(
                        all=True, filters={**filters, "before": [anchor]}, limit=limit
                    )
                    return rows
                except docker.errors.APIError as exc:
                    # An anchor deleted since: Docker 20.10 answers 500 for it, later ones 404.
                    if exc.status_code != 404 and "no such container" not in _explanation(exc).lower():
                        raise
        # Every anchor is gone: fall back to creation seconds. Rows of that second not among the
        # anchors may come again (a repeat, never a skip).
        rows = [
            row
            for row in self._rows(filters, None)
            if row["Created"] < cursor.created or (row["Created"] == cursor.created and row["Id"] not in cursor.anchors)
        ]
        return rows[:limit]

    def _row_matches(self, row: dict[str, Any], query: ListQuery) -> bool:
        if query.states and _STATES.get(row["State"], SandboxState.GONE) not in query.states:
            return False
        # The engine matched the labels; the key list says which of them are the sandbox's own.
        metadata = metadata_from_labels(row.get("Labels") or {})
        return all(metadata.get(key) == value for key, value in query.metadata.items())

    def _info_from_row(self, row: dict[str, Any]) -> SandboxInfo:
        labels = row.get("Labels") or {}
        return SandboxInfo(
            sandbox_id=row["Id"],
            state=_STATES.get(row["State"], SandboxState.GONE),
            template_id=labels.get(LABEL_TEMPLATE, ""),
            metadata=metadata_from_labels(labels),
            started_at=_parse_time(int(row["Created"])),
        )

    def delete(self, sandbox_id: str) -> None:
        try:
            info = self._inspect_sandbox(sandbox_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        self._remove_container(info.sandbox_id)
        self._release_network(info.metadata.get(META_SPACE, ""))

    def _release_network(self, space: str) -> None:
        """Remove the space's network once no container is on it, stopped ones included.
        The engine's address pools hold a few dozen networks and spaces can be many more;
        best effort, since a create may be using it again by now (then it stays)."""
        name = self.space_network_name(space)
        with suppress(RemoteError), _engine_call(f"releasing network {name}"):
            try:
                if self.api.containers(all=True, filters={"network": name}):
                    return
                self.api.remove_network(name)
            except docker.errors.APIError:
                return  # already gone, or in use again

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
        )
        self._seen[info.sandbox_id] = info
        return info

    def _container_id(self, sandbox_id: str) -> str:
        """The full id of a console sandbox, inspecting only the first time it is seen."""
        if sandbox_id in self._seen:
            return sandbox_id
        return self._inspect_sandbox(sandbox_id).sandbox_id

    # Images, networks, volumes -------------------------------------------------------

    def _resolve_image(self, template_id: str) -> str:
        """The image id behind a template or snapshot id; not_found names the template."""
        if not template_id:
            raise RemoteError(ErrorKind.INVALID, "no template id given")
        if is_snapshot_id(template_id):
            return self._snapshot_image(template_id)["Id"]
        attrs = self._console_image(template_id, f"template {template_id!r}")
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

    def _check_network_spec(self, network: NetworkSpec) -> None:
        unsupported = [
            name
            for name, value in (
                ("allow_out lists", network.allow_out),
                ("deny_out lists", network.deny_out),
                ("L7 rules", network.l7_rules),
            )
            if value
        ]
        if network.allow_public_traffic:
            unsupported.append("inbound public traffic")
        if unsupported:
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "the Docker backend only switches outbound internet on or off; it cannot honour "
                + ", ".join(unsupported),
            )

    def _network_mode(self, network: NetworkSpec, metadata: Mapping[str, str]) -> str:
        if not network.allow_internet_access:
            return "none"
        name = self.space_network_name(metadata.get(META_SPACE, ""))
        self._ensure_network(name, metadata.get(META_SPACE, ""))
        return name

    def space_network_name(self, space: str) -> str:
        """The bridge network of one space's online sandboxes ("nospace" for none)."""
        return f"{self.network_name}-{re.sub(r'[^A-Za-z0-9_.-]', '_', space)[:64] or 'nospace'}"

    def _ensure_network(self, name: str, space: str) -> None:
        with _engine_call(f"network {name}"):
            try:
                self.api.inspect_network(name)
                return
            except docker.errors.NotFound:
                pass
            try:
                self.api.create_network(
                    name,
                    driver="bridge",
                    options={
                        # Sandboxes of one space do not talk to each other either.
                        "com.docker.network.bridge.enable_icc": "false",
                        # The name prefix is what the host packet filter matches on.
                        "com.docker.network.bridge.name": bridge_name(name),
                    },
                    labels={LABEL_MANAGED: "1", LABEL_KIND: KIND_NETWORK, LABEL_NETWORK_SPACE: space},
                )
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # created meanwhile by another worker
                    raise

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

    # Exec ------------------------------------------------------------------------------

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        container_id = self._container_id(sandbox_id)
        command = list(request.argv) if request.argv is not None else ["/bin/bash", "-c", request.shell or ""]
        return self._run(
            container_id,
            tuple(command),
            user=request.user,
            cwd=request.cwd,
            env=request.env,
            stdin=request.stdin,
            timeout_s=request.timeout_s,
            max_output_bytes=request.max_output_bytes,
        )

    def _run(
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
        uid, home = self._exec_user(user)
        pid_file = f"/tmp/.console-exec-{secrets.token_hex(8)}.pid"  # noqa: S108 - inside the sandbox
        backstop = f"{timeout_s + EXEC_BACKSTOP_GRACE_S:.3f}"
        wrapped = ["setsid", "-w", "timeout", "-s", "KILL", backstop, "/bin/sh", "-c", _EXEC_WRAPPER, "sh", pid_file]
        wrapped += command
        what = f"exec in sandbox {container_id[:12]}"
        started = time.monotonic()
        with _engine_call(what):
            exec_id = self.api.exec_create(
                container_id,
                wrapped,
                stdin=stdin is not None,
                user=f"{uid}:{uid}",
                workdir=cwd,
                environment={"HOME": home, **(env or {})},
            )["Id"]
            stream = _ExecStream(self.api.exec_start(exec_id, socket=True))
        try:
            if stdin is not None:
                # Fed from a thread: a command that writes while it reads would otherwise
                # block on its full stdout while we block on its full stdin.
                threading.Thread(target=self._feed_stdin, args=(stream, stdin), daemon=True).start()
            demux = _Demuxer(max_output_bytes)
            timed_out = not self._pump(stream, demux, started + timeout_s)
        finally:
            stream.close()
        if timed_out:
            self._kill_group(container_id, pid_file)
        exit_code = self._exit_code(exec_id, what, wait_s=2.0 if timed_out else 5.0)
        if exit_code is None and not timed_out:
            # The engine ends the stream only once the command has exited, so a stream that
            # ended while the command still runs was cut on the way. Nobody would read the
            # rest: stop the command rather than leave it running unobserved.
            self._kill_group(container_id, pid_file)
            raise RemoteError(
                ErrorKind.UNAVAILABLE,
                f"{what}: the connection to the Docker engine was cut while the command ran; it was stopped",
            )
        if timed_out or exit_code is None:
            exit_code = 137  # killed by SIGKILL, as a shell would report it
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(demux.out[1]),
            stderr=bytes(demux.out[2]),
            duration_s=time.monotonic() - started,
            truncated=demux.truncated,
            timed_out=timed_out,
        )

    @staticmethod
    def _exec_user(user: str) -> tuple[int, str]:
        """(uid, home) of a contract user name; anything but "user" and "root" is invalid."""
        try:
            return _USERS[user]
        except KeyError:
            raise RemoteError(ErrorKind.INVALID, f"unknown user {user!r} (use 'user' or 'root')") from None

    @staticmethod
    def _feed_stdin(stream: _ExecStream, data: bytes) -> None:
        # A command that exits without reading its input closes the pipe, and a timeout closes
        # the socket under us: neither is a failure of the exec.
        with suppress(OSError):
            stream.send_all(data)
            stream.close_input()

    @staticmethod
    def _pump(stream: _ExecStream, demux: _Demuxer, deadline: float) -> bool:
        """Read until end of stream; False when the deadline passed first."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                chunk = stream.recv(65536, remaining)
            except TimeoutError:
                return False
            except OSError:
                return True
            if not chunk:
                return True
            demux.feed(chunk)

    def _kill_group(self, container_id: str, pid_file: str) -> None:
        """Kill a timed-out command's whole process group inside the sandbox."""
        with suppress(RemoteError):
            self._run(container_id, ("/bin/sh", "-c", _KILL_GROUP, pid_file), user="root", timeout_s=10)

    def _exit_code(self, exec_id: str, what: str, wait_s: float) -> int | None:
        """The exec's exit code, or None while it still runs after wait_s."""
        deadline = time.monotonic() + wait_s
        while True:
            with _engine_call(what):
                state = self.api.exec_inspect(exec_id)
            if not state.get("Running"):
                code = state.get("ExitCode")
                return int(code) if code is not None else None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    # Capabilities ----------------------------------------------------------------------

    def files(self) -> FilesCapability:
        return DockerFiles(self)

    def snapshots(self) -> SnapshotsCapability:
        return DockerSnapshots(self)

    def templates(self) -> TemplatesCapability:
        return DockerTemplates(self)

    def volumes(self) -> VolumesCapability:
        return DockerVolumes(self)

    def pty(self) -> PtyCapability:
        return DockerPtys(self)

    def _run_checked(self, container_id: str, command: tuple[str, ...], what: str, user: str = "root") -> bytes:
        result = self._run(container_id, command, user=user, cwd="/", timeout_s=60)
        if result.exit_code == 0:
            return result.stdout
        _raise_for_command(result, what)


def _hardening() -> dict[str, Any]:
    """Host-config arguments every sandbox and build container gets."""
    return {
        "cap_drop": ["ALL"],
        "cap_add": list(ROOT_CAPABILITIES),
        "security_opt": list(SECURITY_OPTIONS),
        "privileged": False,
    }


def _raise_for_command(result: ExecResult, what: str) -> NoReturn:
    text = (result.stderr or result.stdout).decode(errors="replace").strip()
    if result.exit_code == 2 or "No such file" in text:
        raise RemoteError(ErrorKind.NOT_FOUND, f"{what}: no such file or directory")
    if "Permission denied" in text or "Operation not permitted" in text:
        raise RemoteError(ErrorKind.FORBIDDEN, f"{what}: permission denied")
    if result.exit_code == 3 or "Not a directory" in text:
        raise RemoteError(ErrorKind.INVALID, f"{what}: not a directory")
    raise RemoteError(ErrorKind.INVALID, f"{what}: {text[:500] or f'exit code {result.exit_code}'}")


def _check_path(path: str) -> str:
    """Absolute, NUL-free paths only; returned normalised ("/a/./b/" -> "/a/b")."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise RemoteError(ErrorKind.INVALID, f"path must be absolute: {path!r}")
    normal = posixpath.normpath(path)
    return "/" + normal.lstrip("/")


# ---------------------------------------------------------------------------------------
# Files


class DockerFiles(FilesCapability):
    """Files through the engine's archive API (writes) and small probes run in the sandbox."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def write(
        self,
        sandbox_id: str,
        path: str,
        data: bytes,
        *,
        mode: int | None = None,
        user: str = "user",
    ) -> FileInfo:
        path = _check_path(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "cannot write to /")
        container_id = self.backend._container_id(sandbox_id)
        uid, _ = DockerBackend._exec_user(user)
        parent, name = posixpath.split(path)
        archive = self._tar_one_file(name, data, mode if mode is not None else 0o644, uid)
        try:
            self._put(container_id, parent, archive)
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
            self.make_dir(container_id, parent, user=user)
            self._put(container_id, parent, archive)
        return FileInfo(
            path=path,
            name=name,
            is_dir=False,
            size=len(data),
            mode=(mode if mode is not None else 0o644) & 0o7777,
            modified=datetime.now(UTC),
        )

    @staticmethod
    def _tar_one_file(name: str, data: bytes, mode: int, uid: int) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode = mode & 0o7777
            member.uid = member.gid = uid
            member.mtime = int(time.time())
            tar.addfile(member, io.BytesIO(data))
        return buffer.getvalue()

    def _put(self, container_id: str, directory: str, archive: bytes) -> None:
        with _engine_call(f"writing into {directory}"):
            self.backend.api.put_archive(container_id, directory, archive)

    def read(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        """The file's bytes; with max_bytes, at most that many from the start."""
        path = _check_path(path)
        container_id = self.backend._container_id(sandbox_id)
        with _engine_call(f"reading {path}"):
            chunks, stat = self.backend.api.get_archive(container_id, path)
        if stat.get("mode", 0) & (1 << 31):  # Go's os.ModeDir
            raise RemoteError(ErrorKind.INVALID, f"{path} is a directory")
        with (
            _engine_call(f"reading {path}"),
            tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as tar,
        ):
            for member in tar:
                if not member.isfile():
                    raise RemoteError(ErrorKind.INVALID, f"{path} is not a regular file")
                handle = tar.extractfile(member)
                assert handle is not None
                return handle.read(-1 if max_bytes is None else max_bytes)
        raise RemoteError(ErrorKind.NOT_FOUND, f"{path}: no such file")

    def list(self, sandbox_id: str, path: str) -> builtins.list[FileInfo]:
        path = _check_path(path)
        rows = json.loads(self._probe(sandbox_id, "list", path))
        return [_file_info(row) for row in rows]

    def stat(self, sandbox_id: str, path: str) -> FileInfo:
        path = _check_path(path)
        return _file_info(json.loads(self._probe(sandbox_id, "stat", path)))

    def _probe(self, sandbox_id: str, op: str, path: str) -> bytes:
        container_id = self.backend._container_id(sandbox_id)
        # -I and cwd "/": as root, python must not import modules the session user planted
        # in the working directory (/workspace by default) or name in PYTHON* variables.
        return self.backend._run_checked(container_id, ("python3", "-I", "-c", _FS_PROBE, op, path), f"{op} {path}")

    def make_dir(self, sandbox_id: str, path: str, *, user: str = "user") -> None:
        path = _check_path(path)
        container_id = self.backend._container_id(sandbox_id)
        self.backend._run_checked(container_id, ("mkdir", "-p", "--", path), f"make_dir {path}", user=user)

    def remove(self, sandbox_id: str, path: str) -> None:
        """Remove a file or a directory tree; a missing path is not_found."""
        path = _check_path(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "refusing to remove /")
        container_id = self.backend._container_id(sandbox_id)
        script = 'test -e "$0" || test -L "$0" || exit 2; rm -rf -- "$0"'
        self.backend._run_checked(container_id, ("/bin/sh", "-c", script, path), f"remove {path}")


def _file_info(row: dict[str, Any]) -> FileInfo:
    return FileInfo(
        path=row["path"],
        name=row["name"],
        is_dir=bool(row["dir"]),
        size=int(row["size"]),
        mode=int(row["mode"]),
        is_symlink=bool(row["link"]),
        modified=datetime.fromtimestamp(float(row["mtime"]), UTC),
    )


class _ChunkReader(io.RawIOBase):
    """A file object over docker-py's chunk generator, for streaming tar reads."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.rest = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self.rest:
            try:
                self.rest = next(self.chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self.rest))
        target[:size] = self.rest[:size]
        self.rest = self.rest[size:]
        return size


# ---------------------------------------------------------------------------------------
# Snapshots


class DockerSnapshots(SnapshotsCapability):
    """`docker commit` images labelled console.kind=snapshot; ids are `snap-<12 hex>`."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        info = self.backend.connect(sandbox_id)  # the contract snapshots a running sandbox
        marks = {
            **(labels or {}),
            LABEL_MANAGED: "1",
            LABEL_KIND: KIND_SNAPSHOT,
            LABEL_SNAPSHOT_SOURCE: info.sandbox_id,
            LABEL_SNAPSHOT_NAME: name,
        }
        changes = [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in marks.items()]
        api = self.backend.api
        try:
            with _engine_call(f"snapshot of sandbox {sandbox_id}"):
                # pause=True freezes the processes for a consistent filesystem copy; the
                # engine unfreezes them when the commit returns.
                result = api.commit(
                    info.sandbox_id,
                    repository=SNAPSHOT_REPOSITORY,
                    tag=secrets.token_hex(8),
                    changes=changes,
                    pause=True,
                )
        except RemoteError:
            # A commit that failed midway may leave the sandbox frozen, which would hang
            # every later exec: make sure it runs again.
            self._ensure_unpaused(info.sandbox_id)
            raise
        # Everything the DTO needs is known here; the size is read by list() when shown.
        return SnapshotInfo(
            snapshot_id=_snapshot_id(str(result["Id"])),
            source_sandbox_id=info.sandbox_id,
            name=name,
            created_at=datetime.now(UTC),
            labels=marks,
        )

    def _ensure_unpaused(self, container_id: str) -> None:
        with suppress(RemoteError), _engine_call("unpausing after commit"):
            if self.backend.api.inspect_container(container_id)["State"]["Status"] == "paused":
                self.backend.api.unpause(container_id)

    @staticmethod
    def _info(attrs: dict[str, Any]) -> SnapshotInfo:
        labels = dict(attrs["Config"].get("Labels") or {})
        return SnapshotInfo(
            snapshot_id=_snapshot_id(attrs["Id"]),
            source_sandbox_id=labels.get(LABEL_SNAPSHOT_SOURCE) or None,
            name=labels.get(LABEL_SNAPSHOT_NAME, ""),
            created_at=_parse_time(attrs.get("Created")),
            size_bytes=attrs.get("Size"),
            labels=labels,
        )

    def list(self) -> builtins.list[SnapshotInfo]:
        with _engine_call("listing snapshots"):
            rows = self.backend.api.images(filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_KIND}={KIND_SNAPSHOT}"]})
        rows.sort(key=lambda row: row["Created"])
        return [
            SnapshotInfo(
                snapshot_id=_snapshot_id(row["Id"]),
                source_sandbox_id=(row.get("Labels") or {}).get(LABEL_SNAPSHOT_SOURCE) or None,
                name=(row.get("Labels") or {}).get(LABEL_SNAPSHOT_NAME, ""),
                created_at=_parse_time(int(row["Created"])),
                size_bytes=row.get("Size"),
                labels=dict(row.get("Labels") or {}),
            )
            for row in rows
        ]

    def get(self, snapshot_id: str) -> SnapshotInfo:
        return self._info(self.backend._snapshot_image(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        """Idempotent; conflict while a sandbox still runs from the snapshot."""
        try:
            attrs = self.backend._snapshot_image(snapshot_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        _remove_image(self.backend, attrs["Id"], f"snapshot {snapshot_id}")


def _remove_image(backend: DockerBackend, image_id: str, what: str) -> None:
    try:
        with _engine_call(f"deleting {what}"):
            # Removing by id with one tag untags and deletes; force would also untag images
            # that still have containers, so it stays off.
            backend.api.remove_image(image_id, force=_tag_count(backend, image_id) > 1)
    except RemoteError as exc:
        if exc.kind == ErrorKind.NOT_FOUND:
            return
        if exc.kind == ErrorKind.CONFLICT:
            raise RemoteError(ErrorKind.CONFLICT, f"{what} is still in use: {exc.message}") from exc
        raise


def _real_tags(row: Mapping[str, Any]) -> builtins.list[str]:
    return [tag for tag in row.get("RepoTags") or [] if tag != "<none>:<none>"]


def _tag_count(backend: DockerBackend, image_id: str) -> int:
    with _engine_call("image tags"):
        return len(backend.api.inspect_image(image_id).get("RepoTags") or [])


# ---------------------------------------------------------------------------------------
# Templates


class DockerTemplates(TemplatesCapability):
    """Images labelled console.kind=template; the template id is the image tag.

    Building: Debian packages -> mmdebstrap on the host (the only place with a resolver for
    deb.debian.org; sandboxes get DNS 127.0.0.1), then `docker import`. A script -> run as
    root in a build container (network none) from the base template, then `docker commit`.
    """

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def list(self) -> builtins.list[TemplateInfo]:
        with _engine_call("listing templates"):
            rows = self.backend.api.images(filters={"label": [f"{LABEL_KIND}={KIND_TEMPLATE}"]})
        # Untagged images (a staging parent, an overwritten build) are no templates to offer.
        infos = [self._info_from_row(row) for row in rows if _real_tags(row)]
        return sorted(infos, key=lambda info: info.template_id)

    @staticmethod
    def _info_from_row(row: dict[str, Any]) -> TemplateInfo:
        labels = dict(row.get("Labels") or {})
        tags = _real_tags(row)
        return TemplateInfo(
            template_id=tags[0] if tags else _snapshot_id(row["Id"]),
            name=labels.get(LABEL_TEMPLATE_NAME, ""),
            description=labels.get(LABEL_TEMPLATE_DESCRIPTION, ""),
            created_at=_parse_time(row["Created"]),
            size_bytes=row.get("Size"),
            labels=labels,
        )

    def get(self, template_id: str) -> TemplateInfo:
        if is_snapshot_id(template_id):
            raise RemoteError(ErrorKind.NOT_FOUND, f"{template_id!r} is a snapshot, not a template")
        attrs = self.backend._console_image(template_id, f"template {template_id!r}")
        if attrs["Config"]["Labels"].get(LABEL_KIND) != KIND_TEMPLATE:
            raise RemoteError(ErrorKind.NOT_FOUND, f"template {template_id!r} not found")
        row = {**attrs, "Labels": attrs["Config"]["Labels"], "Created": attrs.get("Created")}
        info = self._info_from_row(row)
        return TemplateInfo(
            template_id=template_id if ":" in template_id else info.template_id,
            name=info.name,
            description=info.description,
            created_at=info.created_at,
            size_bytes=info.size_bytes,
            labels=info.labels,
        )

    def create(self, spec: TemplateBuildSpec) -> TemplateInfo:
        if not _TEMPLATE_NAME.match(spec.name):
            raise RemoteError(ErrorKind.INVALID, "template names are lowercase letters, digits, '.', '_', '-'")
        tag = f"{TEMPLATE_REPOSITORY}/{spec.name}:latest"
        if self._exists(tag):
            raise RemoteError(ErrorKind.CONFLICT, f"template {tag} already exists")
        labels = template_labels(spec.name, spec.labels.get(LABEL_TEMPLATE_DESCRIPTION, ""), spec.labels)
        if spec.debian_packages:
            self._build_from_packages(spec, tag, labels)
        else:
            base = spec.base_template_id or self.backend.base_image
            self._build_from_script(self.backend._resolve_image(base), spec.script, tag, labels)
        return self.get(tag)

    def _exists(self, tag: str) -> bool:
        try:
            with _engine_call(f"template {tag}"):
                self.backend.api.inspect_image(tag)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return False
            raise
        return True

    def _build_from_packages(self, spec: TemplateBuildSpec, tag: str, labels: dict[str, str]) -> None:
        if spec.base_template_id not in (None, "", self.backend.base_image):
            raise RemoteError(
                ErrorKind.UNSUPPORTED,
                "Debian packages can only be added to the base image (sandboxes have no "
                "resolver to reach the mirror); build from packages, then add scripts on top",
            )
        for package in spec.debian_packages:
            if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", package):
                raise RemoteError(ErrorKind.INVALID, f"not a Debian package name: {package!r}")
        if not spec.script:
            self._import_packages(spec, tag, labels)
            return
        # Packages first into a staging image (kind "build", never listed), then the script.
        staging = f"{TEMPLATE_REPOSITORY}/{spec.name}-packages:latest"
        image_id = self._import_packages(spec, staging, {**labels, LABEL_KIND: KIND_BUILD})
        try:
            self._build_from_script(image_id, spec.script, tag, labels)
        finally:
            # Untag only: the template is its child, and the engine removes the untagged
            # parent together with the template later.
            with suppress(RemoteError), _engine_call("untagging the staging image"):
                self.backend.api.remove_image(staging)

    def _import_packages(self, spec: TemplateBuildSpec, tag: str, labels: dict[str, str]) -> str:
        try:
            return build_rootfs_image(self.backend.client, tag, packages=spec.debian_packages, labels=labels)
        except ImageBuildError as exc:
            raise RemoteError(ErrorKind.INVALID, f"building template {spec.name}: {exc}") from exc
        except docker.errors.DockerException as exc:
            raise _translate(exc, f"importing template {spec.name}") from exc

    def _build_from_script(self, image: str, script: str, tag: str, labels: dict[str, str]) -> None:
        api = self.backend.api
        build_labels = {**labels, LABEL_MANAGED: "1", LABEL_KIND: KIND_BUILD}
        with _engine_call("creating the build container"):
            container_id = api.create_container(
                image,
                labels=build_labels,
                host_config=api.create_host_config(network_mode="none", dns=["127.0.0.1"], **_hardening()),
            )["Id"]
        try:
            with _engine_call("starting the build container"):
                api.start(container_id)
            if script:
                result = self.backend._run(
                    container_id,
                    ("/bin/bash", "-euc", script),
                    user="root",
                    timeout_s=1800,
                    max_output_bytes=65536,
                )
                if result.exit_code != 0:
                    detail = (result.stderr or result.stdout)[-2000:].decode(errors="replace")
                    raise RemoteError(ErrorKind.INVALID, f"template script failed ({result.exit_code}): {detail}")
            repository, _, version = tag.rpartition(":")
            changes = [f"LABEL {json.dumps(key)}={json.dumps(value)}" for key, value in labels.items()]
            with _engine_call("committing the template"):
                api.commit(container_id, repository=repository, tag=version, changes=changes)
        finally:
            with suppress(RemoteError), _engine_call("removing the build container"):
                api.remove_container(container_id, force=True)

    def delete(self, template_id: str) -> None:
        """Idempotent; conflict while any console sandbox (running or idle) uses it."""
        try:
            attrs = self.get(template_id)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return
            raise
        image_id = self.backend._resolve_image(attrs.template_id)
        with _engine_call("sandboxes using the template"):
            users = self.backend.api.containers(
                all=True, filters={"ancestor": image_id, "label": f"{LABEL_KIND}={KIND_SANDBOX}"}
            )
        if users:
            raise RemoteError(
                ErrorKind.CONFLICT,
                f"template {template_id} is used by {len(users)} sandbox(es); delete them first",
            )
        _remove_image(self.backend, image_id, f"template {template_id}")


# ---------------------------------------------------------------------------------------
# PTY


class DockerPtys(PtyCapability):
    """Interactive shells as TTY execs on the hijacked socket."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def open(
        self,
        sandbox_id: str,
        size: PtySize,
        *,
        command: tuple[str, ...] = ("bash", "-l"),
        user: str = "user",
        cwd: str = "/workspace",
        env: Mapping[str, str] | None = None,
    ) -> PtyHandle:
        container_id = self.backend._container_id(sandbox_id)
        uid, home = DockerBackend._exec_user(user)
        pty_id = secrets.token_hex(8)
        pid_file = f"{PTY_PID_DIR}/{pty_id}.pid"
        # Record the in-container pid (exec_inspect's Pid is the host's) before becoming the shell.
        launcher = f'mkdir -p -m 1777 {PTY_PID_DIR} 2>/dev/null; echo $$ > {pid_file}; exec "$@"'
        api = self.backend.api
        with _engine_call(f"opening a terminal in sandbox {sandbox_id}"):
            exec_id = api.exec_create(
                container_id,
                ["/bin/sh", "-c", launcher, "sh", *command],
                stdin=True,
                tty=True,
                user=f"{uid}:{uid}",
                workdir=cwd,
                environment={"TERM": "xterm-256color", "HOME": home, **(env or {})},
            )["Id"]
            stream = _ExecStream(api.exec_start(exec_id, tty=True, socket=True))
        handle = DockerPty(self.backend, container_id, exec_id, pty_id, stream)
        try:
            handle.resize(size)
        except RemoteError:
            # A command that ended at once cannot be resized ("no such exec"); its output is
            # still in the stream, so only a running one that refuses the size is an error.
            if handle.is_running():
                handle.kill()
                raise
        return handle


class DockerPty(PtyHandle):
    """One TTY exec. The first resize waits until the engine reports the exec as started."""

    def __init__(
        self,
        backend: DockerBackend,
        container_id: str,
        exec_id: str,
        pty_id: str,
        stream: _ExecStream,
    ):
        self.backend = backend
        self.container_id = container_id
        self.exec_id = exec_id
        self.pty_id = pty_id
        self.stream = stream
        self.pid_file = f"{PTY_PID_DIR}/{pty_id}.pid"
        self._started = False

    def read(self, max_bytes: int = 65536, timeout: float | None = None) -> bytes:
        try:
            return self.stream.recv(max_bytes, timeout)
        except TimeoutError:
            raise RemoteError(ErrorKind.TIMEOUT, "no terminal output in time") from None
        except OSError:
            return b""

    def write(self, data: bytes) -> None:
        try:
            self.stream.send_all(data)
        except OSError as exc:
            raise RemoteError(ErrorKind.GONE, f"terminal {self.pty_id} is closed") from exc

    def resize(self, size: PtySize) -> None:
        size = size.clamped()
        deadline = time.monotonic() + (0 if self._started else 2.0)
        while True:
            try:
                with _engine_call("resizing the terminal"):
                    self.backend.api.exec_resize(self.exec_id, height=size.rows, width=size.cols)
                self._started = True
                return
            except RemoteError:
                # Docker refuses a resize before the exec runs (500); retry briefly once.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.is_running():
            script = (
                'pid=$(cat "$0" 2>/dev/null) || exit 0; kill -HUP "$pid" 2>/dev/null; '
                "for i in 1 2 3 4 5 6 7 8 9 10; do "
                'kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done; '
                'kill -KILL "$pid" 2>/dev/null; rm -f "$0"; true'
            )
            with suppress(RemoteError):
                self.backend._run(self.container_id, ("/bin/sh", "-c", script, self.pid_file), user="root")
        self.stream.close()

    def is_running(self) -> bool:
        try:
            with _engine_call("terminal status"):
                return bool(self.backend.api.exec_inspect(self.exec_id).get("Running"))
        except RemoteError:
            return False

    def fileno(self) -> int | None:
        # Bytes already read ahead are served by read(); event loops should call it once
        # before waiting on the descriptor.
        return self.stream.raw.fileno()

    def has_pending(self) -> bool:
        """True when read() can answer without waiting on the socket."""
        if self.stream.pending:
            return True
        poller = select.poll()
        poller.register(self.stream.raw, select.POLLIN | select.POLLHUP)
        return bool(poller.poll(0))


class DockerVolumes(VolumesCapability):
    """Named volumes as persistent workspaces (one per session)."""

    def __init__(self, backend: DockerBackend) -> None:
        self.backend = backend

    def check(self) -> str:
        with _engine_call("listing workspace volumes"):
            found = self.backend.api.volumes(filters={"label": f"{LABEL_KIND}={KIND_WORKSPACE}"})
        return f"named volumes ({len(found.get('Volumes') or [])} workspaces on this engine)"

    def delete(self, name: str) -> None:
        self.backend.delete_volume(name)
