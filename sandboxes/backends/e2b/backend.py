"""E2B backend: sandboxes on E2B cloud or any E2B-compatible control plane.

Both planes are spoken over httpx through the guarded transport (`guard.GuardedTransport`),
so every request to the tenant-controlled control plane *and* to each sandbox's envd is
re-checked and pinned at dial time. The `e2b` SDK (pinned `>=2.63,<3`) is the protocol
reference and what the fake server is tested against, but its REST calls and its envd
client (Connect over `pyqwest`, a Rust HTTP stack) accept no httpx transport, so they could
not be guarded; the wire format used here is the one SDK 2.63 speaks (docs/backends.md, "E2B").

Mapping of the contract:

- control plane `<endpoint>` (default `https://api.<domain>`, domain default `e2b.app`):
  create `POST /v2/sandboxes` (the SDK's, with `Idempotency-Key`, so it may be retried) where
  the server has it, else the published spec's `POST /sandboxes` (never retried); which one
  is learnt from the server's answer (a missing route) and reported as the config's
  protocol (`e2b-v2` / `e2b-v1`, `options["protocol"]` pins it). Connect is the spec's
  `POST /sandboxes/{id}/connect` (it suffices: the SDK's /v2 adds only `memory`) and its
  answer is the SandboxInfo (no second call). Get `GET /sandboxes/{id}`, list
  `GET /v2/sandboxes` (cursor in `X-Next-Token`), delete, pause, snapshots, templates;
- data plane: envd on port 49983, at `options["sandbox_url"]` (one URL for every sandbox,
  routed by the `E2b-Sandbox-Id` header) or `https://49983-<id>.<domain>`;
- snapshot ids are presented as `snap-<E2B snapshot id>` (E2B's own look like
  `team/name:tag`), so `is_snapshot_id` works; the prefix is stripped again on use;
- a persistent workspace (`SandboxSpec.workspace_volume`) is an E2B team volume, created by
  name if missing (`POST /volumes`) and mounted at /workspace (`volumeMounts`); a fresh
  volume is empty and root's, so the adapter lays /workspace out after create.

Imports nothing of the project but `base` and `guard`.
"""

from __future__ import annotations

import base64
import builtins
import functools
import json
import posixpath
import random
import re
import secrets
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from ..base import (
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
    InboundCapability,
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
from ..guard import GuardedTransport, Resolver, system_resolver

DEFAULT_DOMAIN = "e2b.app"
# Domains whose envd is reached at https://sandbox.<domain> with routing headers
# (e2b/sandbox_domains.py in SDK 2.63).
HEADER_ROUTED_DOMAINS = frozenset({"e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev"})
ENVD_PORT = 49983
DEFAULT_REQUEST_TIMEOUT_S = 60.0
# Cube answers snapshot create and template delete within 240 s (its route timeout).
SLOW_REQUEST_TIMEOUT_S = 300.0
DEFAULT_RETRIES = 4
CONNECT_RETRIES = 2
MAX_BACKOFF_S = 30.0
DEFAULT_SANDBOX_TTL_S = 300
STDIN_CHUNK = 256 * 1024
KEEPALIVE_INTERVAL_S = 50
EXEC_PID_DIR = "/tmp"  # noqa: S108 - a path inside the sandbox, not on the host
# Workspace names: E2B volume names are [a-zA-Z0-9_-]+ (e2b-dev/infra
# packages/api/internal/handlers/volume_create.go), and Cube uses the name as one directory
# under the host root, so nothing that could leave it (/, ..) may pass.
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")

_FLAG_END_STREAM = 0x02
# A process killed by a signal ends with `exited` false (omitted by protojson) and a Go
# ProcessState status such as "signal: killed"; its exit code is reported the shell's way.
_SIGNAL_NUMBERS = {
    "hangup": 1,
    "interrupt": 2,
    "quit": 3,
    "aborted": 6,
    "killed": 9,
    "segmentation fault": 11,
    "broken pipe": 13,
    "alarm clock": 14,
    "terminated": 15,
}
PROTOCOL_V1 = "e2b-v1"  # the published spec's operations only (e2b-dev/infra spec/openapi.yml)
PROTOCOL_V2 = "e2b-v2"  # plus the SDK's POST /v2/sandboxes (SDK >= 2.51)

# envd versions that change the wire (e2b/envd/versions.py): the Start `stdin` flag exists
# from 0.3.0; below 0.4.0 envd has no default user (we always send one explicitly).
ENVD_STDIN_FLAG = (0, 3, 0)

_STATES = {
    "running": SandboxState.RUNNING,
    "paused": SandboxState.PAUSED,
    "pausing": SandboxState.PAUSING,
    "starting": SandboxState.STARTING,
    "killed": SandboxState.GONE,
}

# HTTP status -> error kind, shared by both planes.
_STATUS_KINDS = {
    400: ErrorKind.INVALID,
    401: ErrorKind.UNAUTHORIZED,
    402: ErrorKind.QUOTA,
    403: ErrorKind.FORBIDDEN,
    404: ErrorKind.NOT_FOUND,
    405: ErrorKind.UNSUPPORTED,
    408: ErrorKind.TIMEOUT,
    409: ErrorKind.CONFLICT,
    410: ErrorKind.GONE,
    413: ErrorKind.INVALID,
    422: ErrorKind.INVALID,
    429: ErrorKind.RATE_LIMITED,
    500: ErrorKind.INTERNAL,
    501: ErrorKind.UNSUPPORTED,
    502: ErrorKind.UNAVAILABLE,
    503: ErrorKind.UNAVAILABLE,
    504: ErrorKind.TIMEOUT,
    507: ErrorKind.QUOTA,
}
# E2B `error_code` values that say more than the status does (spec/openapi.yml Error).
_ERROR_CODE_KINDS = {
    "sandbox_capacity_unavailable": ErrorKind.QUOTA,
    "sandbox_no_compatible_node": ErrorKind.UNAVAILABLE,
    "sandbox_placement_timeout": ErrorKind.TIMEOUT,
    "sandbox_snapshot_guest_agent_unresponsive": ErrorKind.UNAVAILABLE,
}
# Connect error codes (https://connectrpc.com/docs/protocol) -> error kind.
_CONNECT_KINDS = {
    "canceled": ErrorKind.UNAVAILABLE,
    "invalid_argument": ErrorKind.INVALID,
    "deadline_exceeded": ErrorKind.TIMEOUT,
    "not_found": ErrorKind.NOT_FOUND,
    "already_exists": ErrorKind.CONFLICT,
    "permission_denied": ErrorKind.FORBIDDEN,
    "resource_exhausted": ErrorKind.QUOTA,
    "failed_precondition": ErrorKind.CONFLICT,
    "aborted": ErrorKind.CONFLICT,
    "out_of_range": ErrorKind.INVALID,
    "unimplemented": ErrorKind.UNSUPPORTED,
    "internal": ErrorKind.INTERNAL,
    "unavailable": ErrorKind.UNAVAILABLE,
    "data_loss": ErrorKind.INTERNAL,
    "unauthenticated": ErrorKind.UNAUTHORIZED,
}

# Every command runs in its own session (so a timeout kills the whole process group), with
# stdin from a staged file or /dev/null. $0 = pid file, $1 = stdin file ("" = none).
_EXEC_WRAPPER = (
    'pid_file=$0; in_file=$1; shift; echo $$ > "$pid_file"; '
    'if [ -n "$in_file" ]; then exec < "$in_file"; rm -f "$in_file"; else exec < /dev/null; fi; '
    '"$@"; rc=$?; rm -f "$pid_file"; exit $rc'
)
_EXEC_LAUNCHER = (
    'if command -v setsid > /dev/null 2>&1; then exec setsid -w /bin/sh -c "$0" "$@"; fi; exec /bin/sh -c "$0" "$@"'
)
# /workspace as the Docker base image lays it out: owned by the sandbox user, with input/ and
# output/. Idempotent, and never recursive: on a rebuilt sandbox an existing workspace keeps
# its files and their owners. $0 = the workspace, $1 = the sandbox uid.
_WORKSPACE_LAYOUT = (
    'cd "$0" && for d in input output; do [ -d "$d" ] || { mkdir "$d" && chown "$1:$1" "$d"; }; done'
    ' && chown "$1:$1" "$0"'
)
_KILL_GROUP = (
    'for i in 1 2 3 4 5 6 7 8 9 10; do [ -s "$0" ] && break; sleep 0.05; done; '
    '[ -s "$0" ] && kill -KILL -"$(cat "$0")" 2>/dev/null; rm -f "$0"; true'
)


# ---------------------------------------------------------------------------------------
# Error translation


def _message_of(response: httpx.Response) -> tuple[str, str]:
    """(message, error_code) of an error body ({code, message, error_code?}), else the text."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        return response.text[:500] or response.reason_phrase, ""
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or body)[:500], str(body.get("error_code") or "")
    return str(body)[:500], ""


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    with suppress(ValueError):
        return max(0.0, float(value))
    return None


class NoRoute(RemoteError):
    """The server has no such operation: its router answered 404/405 without the API's
    error body (gin's plain text, axum's empty body), as opposed to a handler's 404."""


def _is_api_error(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(body, dict) and "message" in body


def status_error(response: httpx.Response, what: str, *, control: bool = False) -> RemoteError:
    """An HTTP error answer as a RemoteError (both planes)."""
    if control and response.status_code in (404, 405) and not _is_api_error(response):
        return NoRoute(ErrorKind.UNSUPPORTED, f"{what}: the server has no such operation (HTTP {response.status_code})")
    message, error_code = _message_of(response)
    kind = _ERROR_CODE_KINDS.get(error_code) or _STATUS_KINDS.get(response.status_code)
    if kind is None:
        kind = ErrorKind.INTERNAL if response.status_code >= 500 else ErrorKind.INVALID
    retry_after = _retry_after(response) if kind in (ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE) else None
    return RemoteError(kind, f"{what}: {message} (HTTP {response.status_code})", retry_after=retry_after)


def transport_error(exc: Exception, what: str) -> RemoteError:
    """An httpx failure (or anything unexpected) as a RemoteError; vendor types never leak."""
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, httpx.TimeoutException):
        return RemoteError(ErrorKind.TIMEOUT, f"{what}: no answer in time ({exc.__class__.__name__})")
    if isinstance(exc, httpx.TransportError):
        return RemoteError(ErrorKind.UNAVAILABLE, f"{what}: cannot reach the server ({exc.__class__.__name__}: {exc})")
    if isinstance(exc, httpx.HTTPError | ValueError | KeyError | TypeError):
        return RemoteError(ErrorKind.INTERNAL, f"{what}: unexpected answer ({exc.__class__.__name__}: {exc})")
    return RemoteError(ErrorKind.INTERNAL, f"{what}: {exc.__class__.__name__}: {exc}")


def connect_error(error: Mapping[str, Any], what: str) -> RemoteError:
    code = str(error.get("code") or "unknown")
    return RemoteError(_CONNECT_KINDS.get(code, ErrorKind.INTERNAL), f"{what}: {error.get('message') or code}")


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = re.match(r"\d*", rest)
        frac = digits.group(0) if digits else ""
        text = f"{head}.{(frac + '000000')[:6]}{rest[len(frac) :]}"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def parse_version(value: str | None) -> tuple[int, int, int]:
    """`0.5.7+fake` -> (0, 5, 7); unparsable -> (0, 0, 0), the most conservative gate."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", value or "")
    if not match:
        return (0, 0, 0)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


def check_volume_name(name: str) -> str:
    """A workspace volume name the backends can use as is (see _VOLUME_NAME)."""
    if not _VOLUME_NAME.match(name):
        raise RemoteError(
            ErrorKind.INVALID,
            f"workspace volume name {name!r}: letters, digits, '-' and '_', starting with a letter or digit, "
            "at most 128",
        )
    return name


def _basic_auth(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def envelope(message: Mapping[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def iter_envelopes(chunks: Iterator[bytes]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Connect streaming envelopes (flags, JSON) from raw response chunks."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if len(buffer) < 5 + length:
                break
            payload, buffer = buffer[5 : 5 + length], buffer[5 + length :]
            yield flags, (json.loads(payload) if payload else {})


# ---------------------------------------------------------------------------------------
# Per-sandbox data-plane facts learnt from create / connect / get


@dataclass(frozen=True)
class _Envd:
    version: tuple[int, int, int]
    access_token: str | None


# ---------------------------------------------------------------------------------------
# The backend


class E2BBackend(Backend):
    """Sandboxes on an E2B control plane.

    BackendConfig: `endpoint` = control-plane URL (empty: `https://api.<domain>`), `domain` =
    sandbox domain (default `e2b.app`), `api_key`, `allow_private_endpoints`. Options:
    `sandbox_url` (one envd URL for every sandbox, routed by header: E2B_SANDBOX_URL's
    meaning; used for the fake server and for a Cube reverse proxy), `request_timeout`
    (seconds, default 60), `retries` (attempts after the first for retryable failures,
    default 4), `sandbox_timeout` (TTL set on connect, default 300), `protocol` (`e2b-v2` or
    `e2b-v1`: recorded or pinned create flavour) with `protocol_pinned`.
    """

    kind = "e2b"
    label = "E2B"

    def idles_itself(self) -> bool:
        return True  # create sets the TTL with autoPause; connect resumes

    default_domain = DEFAULT_DOMAIN

    def __init__(self, config: BackendConfig, *, resolver: Resolver | None = None) -> None:
        super().__init__(config)
        self.domain = (config.domain or self.default_domain).strip().strip(".")
        self.api_url = (config.endpoint or f"https://api.{self.domain}").rstrip("/")
        self.sandbox_url = (config.options.get("sandbox_url") or "").rstrip("/")
        self.request_timeout = self._number_option("request_timeout", DEFAULT_REQUEST_TIMEOUT_S)
        self.retries = int(self._number_option("retries", DEFAULT_RETRIES))
        self.sandbox_ttl = int(self._number_option("sandbox_timeout", DEFAULT_SANDBOX_TTL_S))
        self.resolver = resolver or system_resolver
        self._http: httpx.Client | None = None
        self._lock = threading.Lock()
        self._envd: dict[str, _Envd] = {}
        self._traffic_tokens: dict[str, str] = {}
        # Metadata learnt at create/get/list, so a connect answer (which carries none) still
        # makes a full SandboxInfo.
        self._metadata: dict[str, dict[str, str]] = {}
        self.protocol_pinned = config.options.get("protocol_pinned", "") in ("1", "true", "yes")
        self.protocol = self._initial_protocol(config.options.get("protocol", ""))
        # Waits between retries go through here so tests can observe the backoff.
        self.sleep: Callable[[float], None] = time.sleep

    def _initial_protocol(self, value: str) -> str:
        """The recorded or pinned protocol ("" = learn it from the server)."""
        if value in ("", PROTOCOL_V1, PROTOCOL_V2):
            return value
        raise RemoteError(ErrorKind.INVALID, f"option 'protocol' must be {PROTOCOL_V1!r} or {PROTOCOL_V2!r}")

    def _number_option(self, name: str, default: float) -> float:
        raw = self.config.options.get(name)
        if raw in (None, ""):
            return default
        try:
            value = float(raw)
        except ValueError:
            raise RemoteError(ErrorKind.INVALID, f"option {name!r} must be a number") from None
        if value < 0:
            raise RemoteError(ErrorKind.INVALID, f"option {name!r} must not be negative")
        return value

    # HTTP ------------------------------------------------------------------------------

    @property
    def http(self) -> httpx.Client:
        """One client per backend; every request goes through the guarded transport."""
        if self._http is None:
            with self._lock:
                if self._http is None:
                    transport = GuardedTransport(
                        allow_private=self.config.allow_private_endpoints, resolver=self.resolver
                    )
                    self._http = httpx.Client(
                        transport=transport,
                        timeout=httpx.Timeout(self.request_timeout or None, connect=10.0),
                        follow_redirects=False,
                        headers={"User-Agent": "sandbox-console"},
                    )
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def _api_headers(self) -> dict[str, str]:
        return {"X-API-Key": self.config.api_key}

    def _send(
        self,
        method: str,
        url: str,
        what: str,
        *,
        idempotent: bool,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        control: bool = False,
        **kwargs: Any,
    ) -> httpx.Response:
        """One request with retries: rate_limited and unavailable answers (and connection
        failures) are retried with exponential backoff, honouring Retry-After, but only for
        idempotent calls. Any other failure is raised as a RemoteError at once."""
        attempt = 0
        while True:
            try:
                response = self.http.request(
                    method,
                    url,
                    headers=headers,
                    timeout=httpx.Timeout(timeout, connect=10.0) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                    **kwargs,
                )
                error = None if response.status_code < 400 else status_error(response, what, control=control)
            except RemoteError:
                raise
            except Exception as exc:
                error = transport_error(exc, what)
                if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
                    # Nothing reached the server: safe to retry whatever the call.
                    error = RemoteError(ErrorKind.UNAVAILABLE, error.message)
                    # Fewer tries than for a busy server: a refused connection rarely heals
                    # within seconds, and pages that ask a dead endpoint should not hang.
                    if attempt < min(self.retries, CONNECT_RETRIES):
                        attempt += 1
                        self.sleep(self._backoff(attempt, None))
                        continue
                raise error from exc
            if error is None:
                return response
            retry = idempotent and error.kind in (ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE)
            if not retry or attempt >= self.retries:
                raise error
            attempt += 1
            self.sleep(self._backoff(attempt, error.retry_after))

    @staticmethod
    def _backoff(attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, MAX_BACKOFF_S)
        return min(0.25 * 2 ** (attempt - 1), MAX_BACKOFF_S) * (0.5 + random.random() / 2)  # noqa: S311

    def _api(
        self,
        method: str,
        path: str,
        what: str,
        *,
        idempotent: bool,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        return self._send(
            method,
            self.api_url + path,
            what,
            idempotent=idempotent,
            timeout=timeout,
            headers={**self._api_headers(), **(headers or {})},
            control=True,
            **kwargs,
        )

    # Health ----------------------------------------------------------------------------

    def health(self) -> HealthInfo:
        try:
            self._api("GET", "/health", "health check", idempotent=True)
            # /health needs no key: list one sandbox to prove the key works too.
            self._api("GET", "/v2/sandboxes", "checking the API key", idempotent=True, params={"limit": 1})
            protocol = self.protocol if self.protocol_pinned else self.probe_protocol()
        except RemoteError as exc:
            return HealthInfo(ok=False, detail=exc.message)
        flavour = "SDK /v2 create" if protocol == PROTOCOL_V2 else "published-spec create (POST /sandboxes)"
        return HealthInfo(
            ok=True,
            version=f"E2B API at {self.api_url} ({flavour})",
            detail=f"sandbox domain {self.domain}",
            protocol=protocol,
        )

    def probe_protocol(self) -> str:
        """Whether the control plane serves the SDK's `POST /v2/sandboxes`. The probe body
        lacks the required templateID, so a server that has the route refuses it (400)
        without creating anything; one that lacks it answers with its router's 404/405."""
        try:
            self._api("POST", "/v2/sandboxes", "probing the create operation", idempotent=True, json={})
        except NoRoute:
            self.protocol = PROTOCOL_V1
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.INVALID, ErrorKind.NOT_FOUND):
                raise
            self.protocol = PROTOCOL_V2
        else:
            self.protocol = PROTOCOL_V2
        return self.protocol

    def network_capabilities(self) -> NetworkCapabilities:
        # E2B: allowOut takes CIDRs, IPs and domains; denyOut CIDRs and IPs only (no domain
        # deny list); `network.rules` are header transforms, not allow/deny rules.
        return NetworkCapabilities(
            outbound_toggle=True,
            allow_out_cidr=True,
            allow_out_domain=True,
            deny_out_cidr=True,
            deny_out_domain=False,
            l7_rules=False,
            inbound_toggle=True,
        )

    # Lifecycle -------------------------------------------------------------------------

    def _template_for_api(self, template_id: str) -> str:
        """A console template id (possibly a presented snapshot id) as the API knows it."""
        if is_snapshot_id(template_id):
            return self._raw_snapshot_id(template_id)
        return template_id

    @staticmethod
    def _raw_snapshot_id(snapshot_id: str) -> str:
        return snapshot_id.removeprefix(SNAPSHOT_PREFIX)

    @staticmethod
    def _presented_snapshot_id(raw: str) -> str:
        return SNAPSHOT_PREFIX + raw

    def _check_network(self, network: NetworkSpec) -> None:
        domains = [entry for entry in network.deny_out if _is_domain(entry)]
        if domains:
            raise RemoteError(
                ErrorKind.UNSUPPORTED, f"{self.label} cannot deny domains (denyOut takes CIDRs): {domains}"
            )
        if network.l7_rules:
            raise RemoteError(ErrorKind.UNSUPPORTED, f"{self.label} has no L7 allow/deny rules")

    def _network_body(self, network: NetworkSpec) -> dict[str, Any]:
        return {
            "allowPublicTraffic": network.allow_public_traffic,
            "allowOut": list(network.allow_out),
            "denyOut": list(network.deny_out),
        }

    def _create_body(self, spec: SandboxSpec) -> dict[str, Any]:
        self._check_network(spec.network)
        body: dict[str, Any] = {
            "templateID": self._template_for_api(spec.template_id),
            "timeout": self._ttl(spec.timeout_s),
            "autoPause": spec.auto_pause,
            # Auto-resume requires pause-on-timeout (spec/openapi.yml NewSandbox).
            "autoResume": {"enabled": bool(spec.auto_pause and spec.auto_resume)},
            # The network switches are always explicit (never a template default);
            # `allow_internet_access` is snake_case in the API.
            "allow_internet_access": spec.network.allow_internet_access,
            "network": self._network_body(spec.network),
            "metadata": dict(spec.metadata),
            "envVars": dict(spec.env),
        }
        if spec.workspace_volume:
            self._mount_workspace(body, spec.workspace_volume)
        return body

    def _mount_workspace(self, body: dict[str, Any], name: str) -> None:
        # spec/openapi.yml NewSandbox.volumeMounts: [{name, path}], the volume by name.
        body["volumeMounts"] = [{"name": name, "path": WORKSPACE}]

    def _check_spec(self, spec: SandboxSpec) -> None:
        if not spec.workspace_volume:
            return
        if self.volumes() is None:
            raise RemoteError(
                ErrorKind.UNSUPPORTED, f"this {self.label} config has no storage for a persistent /workspace"
            )
        check_volume_name(spec.workspace_volume)

    def create(self, spec: SandboxSpec) -> SandboxInfo:
        self._check_spec(spec)
        body = self._create_body(spec)
        if spec.workspace_volume:
            self._provide_workspace(spec.workspace_volume)
        info = self._submit(body, spec)
        if spec.workspace_volume:
            self._lay_out_workspace(info.sandbox_id)
        return info

    def _provide_workspace(self, name: str) -> None:
        """Make the workspace's storage exist before a sandbox mounts it."""
        E2BVolumes(self).ensure(name)

    def _submit(self, body: Mapping[str, Any], spec: SandboxSpec) -> SandboxInfo:
        what = f"creating a sandbox from {spec.template_id!r}"
        if self.protocol != PROTOCOL_V1:
            try:
                # The Idempotency-Key makes a retried create return the same sandbox.
                response = self._api(
                    "POST",
                    "/v2/sandboxes",
                    what,
                    idempotent=True,
                    headers={"Idempotency-Key": str(uuid.uuid4())},
                    json=body,
                )
                self.protocol = PROTOCOL_V2
                return self._created(response.json(), spec)
            except NoRoute:
                if self.protocol_pinned:
                    raise
                self.protocol = PROTOCOL_V1  # a control plane built from the published spec
        # spec/openapi.yml POST /sandboxes: no Idempotency-Key, so never retried; `secure`
        # asks for the envd access token that NewSandboxV2 always gives.
        response = self._api("POST", "/sandboxes", what, idempotent=False, json={**body, "secure": True})
        return self._created(response.json(), spec)

    def _lay_out_workspace(self, sandbox_id: str) -> None:
        """Give a mounted workspace the layout sessions expect (a fresh volume is empty and
        root's); a sandbox whose workspace cannot be laid out is deleted again."""
        request = ExecRequest(
            argv=("/bin/sh", "-c", _WORKSPACE_LAYOUT, WORKSPACE, str(SANDBOX_UID)), user="root", timeout_s=60
        )
        try:
            result = self.exec(sandbox_id, request)
            if result.exit_code != 0:
                problem = result.stderr.decode(errors="replace").strip() or f"exit {result.exit_code}"
                raise RemoteError(ErrorKind.INTERNAL, f"laying out {WORKSPACE} in sandbox {sandbox_id}: {problem}")
        except RemoteError:
            with suppress(RemoteError):
                self.delete(sandbox_id)
            raise

    def _created(self, data: Mapping[str, Any], spec: SandboxSpec) -> SandboxInfo:
        sandbox_id = str(data["sandboxID"])
        self._remember(sandbox_id, data)
        token = self._keep_token(sandbox_id, data)
        with self._lock:
            self._metadata[sandbox_id] = dict(spec.metadata)
        return SandboxInfo(
            sandbox_id=sandbox_id,
            state=SandboxState.RUNNING,
            template_id=spec.template_id,
            metadata=dict(spec.metadata),
            started_at=None,
            traffic_token=token,
        )

    def _keep_token(self, sandbox_id: str, data: Mapping[str, Any]) -> str | None:
        """The traffic token of a create/connect answer, else the one kept from before (Cube
        sends it at create only; spec/openapi.yml Sandbox.trafficAccessToken is nullable)."""
        token = data.get("trafficAccessToken") or None
        with self._lock:
            if token:
                self._traffic_tokens[sandbox_id] = str(token)
                return str(token)
            return self._traffic_tokens.get(sandbox_id)

    def _remember(self, sandbox_id: str, data: Mapping[str, Any]) -> None:
        if "envdVersion" not in data:
            return
        with self._lock:
            self._envd[sandbox_id] = _Envd(
                version=parse_version(data.get("envdVersion")), access_token=data.get("envdAccessToken") or None
            )

    def connect(self, sandbox_id: str) -> SandboxInfo:
        """One call: the connect answer (spec/openapi.yml Sandbox) says what a warm resolve
        needs; state is running (connect resumes), the TTL runs from now."""
        ttl = self._ttl(self.sandbox_ttl)
        response = self._api(
            "POST",
            f"/sandboxes/{_q(sandbox_id)}/connect",
            f"connecting to sandbox {sandbox_id}",
            idempotent=True,
            json={"timeout": ttl},
            timeout=max(self.request_timeout, 130.0),
        )
        data = response.json()
        # Keep the id the control plane answers with (E2B #884: it changed after a resume).
        new_id = str(data.get("sandboxID") or sandbox_id)
        self._remember(new_id, data)
        token = self._keep_token(new_id, data)
        with self._lock:
            metadata = dict(self._metadata.get(new_id) or self._metadata.get(sandbox_id) or {})
        return SandboxInfo(
            sandbox_id=new_id,
            state=SandboxState.RUNNING,
            template_id=self._presented_template(str(data.get("templateID") or "")),
            metadata=metadata,
            end_at=datetime.now(UTC) + timedelta(seconds=ttl),
            traffic_token=token,
        )

    def _ttl(self, seconds: int) -> int:
        """The TTL sent at create and connect (Cube before v0.5 adds a margin)."""
        return seconds

    def get(self, sandbox_id: str) -> SandboxInfo:
        response = self._api("GET", f"/sandboxes/{_q(sandbox_id)}", f"sandbox {sandbox_id}", idempotent=True)
        data = response.json()
        self._remember(sandbox_id, data)
        info = self._info(data)
        with self._lock:
            self._metadata[info.sandbox_id] = dict(info.metadata)
        return info

    def _info(self, data: Mapping[str, Any]) -> SandboxInfo:
        # Only sandboxID is relied on: Cube leaves out endAt (never-timeout sandboxes) and
        # diskSizeMB, and metadata when empty (CubeAPI models ListedSandbox/SandboxDetail).
        template = str(data.get("templateID") or "")
        return SandboxInfo(
            sandbox_id=str(data["sandboxID"]),
            state=_STATES.get(str(data.get("state") or ""), SandboxState.STARTING),
            template_id=self._presented_template(template),
            metadata=dict(data.get("metadata") or {}),
            started_at=parse_time(data.get("startedAt")),
            end_at=parse_time(data.get("endAt")),
        )

    def _presented_template(self, template: str) -> str:
        return template

    def list(self, query: ListQuery) -> Page:
        params: dict[str, Any] = {"limit": max(1, min(query.limit, 100))}
        if query.metadata:
            params["metadata"] = encode_metadata_filter(query.metadata)
        states = self._api_states(query.states)
        if states:
            params["state"] = ",".join(states)
        if query.page_token:
            params["nextToken"] = query.page_token
        response = self._api("GET", "/v2/sandboxes", "listing sandboxes", idempotent=True, params=params)
        items = tuple(self._info(row) for row in response.json())
        return Page(items=items, next_token=response.headers.get("x-next-token") or None)

    @staticmethod
    def _api_states(states: frozenset[SandboxState]) -> builtins.list[str]:
        wanted = []
        if SandboxState.RUNNING in states:
            wanted.append("running")
        if states & {SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.STOPPED}:
            wanted.append("paused")
        if not wanted and states:
            # Only states E2B never reports (starting, gone): ask for both and filter to none.
            wanted = ["running", "paused"]
        return wanted

    def delete(self, sandbox_id: str) -> None:
        try:
            self._api("DELETE", f"/sandboxes/{_q(sandbox_id)}", f"deleting sandbox {sandbox_id}", idempotent=True)
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise
        with self._lock:
            self._envd.pop(sandbox_id, None)
            self._traffic_tokens.pop(sandbox_id, None)
            self._metadata.pop(sandbox_id, None)

    def pause(self, sandbox_id: str) -> SandboxInfo:
        try:
            self._api(
                "POST",
                f"/sandboxes/{_q(sandbox_id)}/pause",
                f"pausing sandbox {sandbox_id}",
                idempotent=True,
                json={},
                timeout=max(self.request_timeout, 130.0),
            )
        except RemoteError as exc:
            if exc.kind != ErrorKind.CONFLICT:  # 409: already paused
                raise
        return self.get(sandbox_id)

    # Data plane ------------------------------------------------------------------------

    def _envd_facts(self, sandbox_id: str) -> _Envd:
        with self._lock:
            facts = self._envd.get(sandbox_id)
        if facts is None:
            self.get(sandbox_id)  # the detail carries envdVersion and envdAccessToken
            with self._lock:
                facts = self._envd.get(sandbox_id, _Envd(version=(0, 0, 0), access_token=None))
        return facts

    def envd_url(self, sandbox_id: str) -> str:
        if self.sandbox_url:
            return self.sandbox_url
        if self.domain in HEADER_ROUTED_DOMAINS:
            return f"https://sandbox.{self.domain}"
        return f"https://{ENVD_PORT}-{sandbox_id}.{self.domain}"

    def _route_headers(self, sandbox_id: str) -> dict[str, str]:
        """Headers that route a data-plane request to the sandbox (E2B: E2b-Sandbox-Id)."""
        return {}

    def _envd_headers(self, sandbox_id: str, user: str) -> dict[str, str]:
        facts = self._envd_facts(sandbox_id)
        headers = {
            **self._route_headers(sandbox_id),
            "E2b-Sandbox-Id": sandbox_id,
            "E2b-Sandbox-Port": str(ENVD_PORT),
            # Always name the user: envd < 0.4.0 (Cube reports 0.2.0) has no default user
            # and the SDK would silently run as `user`.
            "Authorization": _basic_auth(user),
        }
        if facts.access_token:
            headers["X-Access-Token"] = facts.access_token
        return headers

    def _envd_failure(self, sandbox_id: str, error: RemoteError) -> RemoteError:
        """Explain a 502 from the sandbox proxy: the sandbox is gone, or paused."""
        if error.kind != ErrorKind.UNAVAILABLE or "(HTTP 502)" not in error.message:
            return error
        try:
            info = self.get(sandbox_id)
        except RemoteError as exc:
            if exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                return RemoteError(exc.kind, f"sandbox {sandbox_id} does not exist")
            return error
        if info.state in (SandboxState.PAUSED, SandboxState.PAUSING):
            return RemoteError(ErrorKind.CONFLICT, f"sandbox {sandbox_id} is paused; connect first")
        return error

    def envd_request(
        self,
        sandbox_id: str,
        method: str,
        path: str,
        what: str,
        *,
        user: str = "user",
        idempotent: bool = True,
        headers: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        try:
            return self._send(
                method,
                self.envd_url(sandbox_id) + path,
                what,
                idempotent=idempotent,
                headers={**self._envd_headers(sandbox_id, user), **(headers or {})},
                **kwargs,
            )
        except RemoteError as exc:
            raise self._envd_failure(sandbox_id, exc) from None

    def rpc(self, sandbox_id: str, method: str, body: Mapping[str, Any], what: str, *, user: str = "root") -> Any:
        """A unary Connect call (JSON codec) to envd."""
        response = self.envd_request(
            sandbox_id,
            "POST",
            f"/{method}",
            what,
            user=user,
            idempotent=method.startswith(("filesystem.Filesystem/Stat", "filesystem.Filesystem/ListDir")),
            headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1"},
            content=json.dumps(body).encode(),
        )
        return response.json() if response.content else {}

    def open_stream(
        self, sandbox_id: str, method: str, body: Mapping[str, Any], what: str, *, user: str
    ) -> httpx.Response:
        """A server-streaming Connect call; the caller reads and closes the response."""
        headers = {
            **self._envd_headers(sandbox_id, user),
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            # envd sends keepalive events, so idle streams survive intermediaries.
            "Keepalive-Ping-Interval": str(KEEPALIVE_INTERVAL_S),
        }
        url = self.envd_url(sandbox_id) + f"/{method}"
        attempt = 0
        while True:
            try:
                request = self.http.build_request(
                    "POST",
                    url,
                    headers=headers,
                    content=envelope(body),
                    timeout=httpx.Timeout(None, connect=10.0),
                )
                response = self.http.send(request, stream=True)
            except RemoteError:
                raise
            except Exception as exc:
                raise transport_error(exc, what) from exc
            if response.status_code < 400:
                return response
            response.read()
            error = self._envd_failure(sandbox_id, status_error(response, what))
            response.close()
            # A plain HTTP 503 comes from the sandbox proxy before envd saw the call (Cube:
            # resume failed, Retry-After), so even a process start may be retried.
            if error.kind in (ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE) and attempt < self.retries:
                attempt += 1
                self.sleep(self._backoff(attempt, error.retry_after))
                continue
            raise error

    def _start_body(
        self,
        sandbox_id: str,
        argv: tuple[str, ...],
        *,
        cwd: str | None,
        env: Mapping[str, str],
        pty: PtySize | None = None,
    ) -> dict[str, Any]:
        process: dict[str, Any] = {"cmd": argv[0], "args": list(argv[1:]), "envs": dict(env)}
        if cwd:
            process["cwd"] = cwd
        body: dict[str, Any] = {"process": process}
        if pty is not None:
            body["pty"] = {"size": {"cols": pty.cols, "rows": pty.rows}}
        elif self._envd_facts(sandbox_id).version >= ENVD_STDIN_FLAG:
            # envd >= 0.3.0 knows the flag; older envd keeps stdin open, which the exec
            # wrapper makes harmless by redirecting stdin itself.
            body["stdin"] = False
        return body

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        started = time.monotonic()
        if request.user not in ("user", "root"):
            raise RemoteError(ErrorKind.INVALID, f"unknown sandbox user {request.user!r}")
        argv = request.argv if request.argv is not None else ("/bin/bash", "-c", request.shell or "")
        tag = secrets.token_hex(8)
        pid_file = f"{EXEC_PID_DIR}/.console-exec-{tag}.pid"
        in_file = ""
        if request.stdin:
            in_file = f"{EXEC_PID_DIR}/.console-stdin-{tag}"
            self._upload(sandbox_id, in_file, request.stdin, user=request.user)
        wrapped = ("/bin/sh", "-c", _EXEC_LAUNCHER, _EXEC_WRAPPER, pid_file, in_file, *argv)
        body = self._start_body(sandbox_id, wrapped, cwd=request.cwd, env=request.env)
        response = self.open_stream(
            sandbox_id, "process.Process/Start", body, f"running a command in sandbox {sandbox_id}", user=request.user
        )
        reader = _ExecReader(response, request.max_output_bytes)
        thread = threading.Thread(target=reader.run, name=f"e2b-exec-{tag}", daemon=True)
        thread.start()
        thread.join(request.timeout_s)
        timed_out = thread.is_alive()
        if timed_out:
            # Kill the whole process group inside the sandbox; the stream then ends.
            with suppress(RemoteError):
                self._kill_group(sandbox_id, pid_file)
            thread.join(10)
        response.close()
        thread.join(2)
        duration = time.monotonic() - started
        if timed_out:
            return reader.result(duration, timed_out=True)
        if reader.error is not None:
            raise reader.error
        if not reader.ended:
            raise RemoteError(ErrorKind.UNAVAILABLE, f"the command stream of sandbox {sandbox_id} was cut")
        return reader.result(duration, timed_out=False)

    def _kill_group(self, sandbox_id: str, pid_file: str) -> None:
        body = self._start_body(sandbox_id, ("/bin/sh", "-c", _KILL_GROUP, pid_file), cwd=None, env={})
        response = self.open_stream(sandbox_id, "process.Process/Start", body, "stopping a command", user="root")
        try:
            deadline = time.monotonic() + 10
            for flags, message in iter_envelopes(response.iter_raw()):
                if flags & _FLAG_END_STREAM or "end" in (message.get("event") or {}):
                    break
                if time.monotonic() > deadline:
                    break
        except httpx.HTTPError:
            pass
        finally:
            response.close()

    def _upload(self, sandbox_id: str, path: str, data: bytes, *, user: str) -> None:
        # Multipart works on every envd version (octet-stream needs >= 0.5.7).
        self.envd_request(
            sandbox_id,
            "POST",
            "/files",
            f"uploading {path} to sandbox {sandbox_id}",
            user=user,
            params={"path": path, "username": user},
            files={"file": (posixpath.basename(path) or "file", data, "application/octet-stream")},
            timeout=max(self.request_timeout, 120.0),
        )

    # Capabilities ----------------------------------------------------------------------

    def files(self) -> FilesCapability:
        return E2BFiles(self)

    def snapshots(self) -> SnapshotsCapability | None:
        return E2BSnapshots(self)

    def templates(self) -> TemplatesCapability | None:
        return E2BTemplates(self)

    def inbound(self) -> InboundCapability | None:
        return E2BInbound(self)

    def pty(self) -> PtyCapability:
        return E2BPtys(self)

    def volumes(self) -> VolumesCapability | None:
        return E2BVolumes(self)

    # Snapshot helpers shared by the capabilities ------------------------------------------

    def _verify_snapshot(self, info: SnapshotInfo) -> None:
        """Hook for control planes whose snapshot answer cannot be trusted (Cube C-May)."""
        return None

    def snapshot_infos(self) -> builtins.list[SnapshotInfo]:
        rows = self.paged_rows("/snapshots", "listing snapshots")
        return [self._snapshot_info(row) for row in rows]

    def _snapshot_info(self, row: Mapping[str, Any], *, source: str | None = None, name: str = "") -> SnapshotInfo:
        names = row.get("names") or []
        return SnapshotInfo(
            snapshot_id=self._presented_snapshot_id(str(row["snapshotID"])),
            source_sandbox_id=row.get("originSandboxID") or source,
            name=name or (str(names[0]) if names else ""),
            created_at=parse_time(row.get("createdAt")),
        )

    def paged_rows(self, path: str, what: str, params: Mapping[str, Any] | None = None) -> builtins.list[Any]:
        """Every row of a cursor-paged list; a repeated cursor stops with an error."""
        rows: builtins.list[Any] = []
        token: str | None = None
        seen: set[str] = set()
        while True:
            query = {**(params or {}), "limit": 100, **({"nextToken": token} if token else {})}
            response = self._api("GET", path, what, idempotent=True, params=query)
            rows.extend(response.json())
            token = response.headers.get("x-next-token") or None
            if not token:
                return rows
            if token in seen:
                raise RemoteError(ErrorKind.INTERNAL, f"{what}: the server repeated a page token", retryable=False)
            seen.add(token)


def translating(cls: type, *names: str) -> None:
    """Wrap the named methods defined on `cls` so that nothing but RemoteError leaves them
    (an answer of the wrong shape, a codec error, an httpx error)."""
    for name in names:
        func = cls.__dict__.get(name)
        if func is None:
            continue

        def wrapper(*args: Any, __func: Callable[..., Any] = func, __name: str = name, **kwargs: Any) -> Any:
            try:
                return __func(*args, **kwargs)
            except RemoteError:
                raise
            except Exception as exc:
                raise transport_error(exc, f"{cls.__name__}.{__name}") from exc

        functools.update_wrapper(wrapper, func)
        setattr(cls, name, wrapper)


def _q(segment: str) -> str:
    return quote(segment, safe="")


def encode_metadata_filter(metadata: Mapping[str, str]) -> str:
    """The `metadata` query value of GET /v2/sandboxes as e2b-dev/infra's parseFilters reads
    it: it unescapes the whole value, splits on `&` and `=`, then unescapes each key and
    value. So each key and value is escaped, the pairs joined as a form, and httpx escapes
    the whole once more (what SDK 2.63 sandbox_sync/paginator.py does): any character
    round-trips, `& = + %` included."""
    return urlencode({quote(k, safe=""): quote(v, safe="") for k, v in metadata.items()})


def _is_domain(entry: str) -> bool:
    return bool(re.search(r"[A-Za-z*]", entry)) and ":" not in entry


# ---------------------------------------------------------------------------------------
# Exec stream reader


class _ExecReader:
    """Reads a process.Start stream: output (capped per stream), exit, stream errors."""

    def __init__(self, response: httpx.Response, cap: int) -> None:
        self.response = response
        self.cap = cap
        self.out = {"stdout": bytearray(), "stderr": bytearray()}
        self.truncated = False
        self.ended = False
        self.exit_code = -1
        self.signalled = False
        self.status = ""
        self.error: RemoteError | None = None

    def run(self) -> None:
        try:
            for flags, message in iter_envelopes(self.response.iter_raw()):
                if flags & _FLAG_END_STREAM:
                    if message.get("error"):
                        self.error = connect_error(message["error"], "running the command")
                    return
                event = message.get("event") or {}
                if "data" in event:
                    for stream, value in event["data"].items():
                        if stream in self.out:
                            self._keep(self.out[stream], base64.b64decode(value))
                elif "end" in event:
                    # proto3 JSON omits defaults: no exitCode is 0, no `exited` is false.
                    end = event["end"]
                    self.ended = True
                    self.exit_code = int(end.get("exitCode", 0) or 0)
                    self.signalled = not end.get("exited", False)
                    self.status = str(end.get("status") or "")
        except (httpx.HTTPError, OSError, ValueError, RuntimeError):
            return  # closed by the caller, or cut: `ended` tells which

    def _keep(self, target: bytearray, data: bytes) -> None:
        room = self.cap - len(target)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            target += data[:room]

    def result(self, duration: float, *, timed_out: bool) -> ExecResult:
        exit_code = self.exit_code
        if timed_out:
            exit_code = 137  # killed, as a shell reports SIGKILL
        elif self.signalled and exit_code <= 0:
            # Ended by a signal (envd: exitCode -1 or omitted): 128 + the signal, as a shell does.
            name = self.status.removeprefix("signal: ").strip().lower()
            exit_code = 128 + _SIGNAL_NUMBERS.get(name, 9)
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(self.out["stdout"]),
            stderr=bytes(self.out["stderr"]),
            duration_s=duration,
            truncated=self.truncated,
            timed_out=timed_out,
        )


# ---------------------------------------------------------------------------------------
# Files


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise RemoteError(ErrorKind.INVALID, f"{path!r}: paths must be absolute")
    return posixpath.normpath(path)


def file_info(entry: Mapping[str, Any]) -> FileInfo:
    """An envd EntryInfo (filesystem.proto) as a FileInfo."""
    kind = str(entry.get("type") or "")
    mode = int(entry.get("mode") or 0)
    return FileInfo(
        path=str(entry.get("path") or ""),
        name=str(entry.get("name") or ""),
        is_dir=kind == "FILE_TYPE_DIRECTORY",
        size=int(entry.get("size") or 0),
        mode=mode & 0o7777,  # drop Go's type bits (os.ModeDir is 1 << 31)
        is_symlink=kind == "FILE_TYPE_SYMLINK" or bool(entry.get("symlinkTarget")),
        modified=parse_time(entry.get("modifiedTime")),
    )


def _read_capped(response: httpx.Response, max_bytes: int | None) -> bytes:
    if max_bytes is None:
        return response.read()
    out = bytearray()
    for chunk in response.iter_bytes():
        out += chunk
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


class E2BFiles(FilesCapability):
    """envd `/files` for content (multipart upload, streamed download) and
    `filesystem.Filesystem` for metadata. Modes are set with chmod after upload (envd's
    upload has no mode parameter)."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def write(
        self, sandbox_id: str, path: str, data: bytes, *, mode: int | None = None, user: str = "user"
    ) -> FileInfo:
        path = _absolute(path)
        self.backend._upload(sandbox_id, path, data, user=user)
        if mode is not None:
            result = self.backend.exec(
                sandbox_id, ExecRequest(argv=("chmod", format(mode & 0o7777, "o"), path), user=user)
            )
            if result.exit_code != 0:
                raise RemoteError(ErrorKind.INVALID, f"chmod {path}: {result.stderr.decode(errors='replace')}")
        return self.stat(sandbox_id, path)

    def read(self, sandbox_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        path = _absolute(path)
        backend = self.backend
        url = backend.envd_url(sandbox_id) + "/files"
        what = f"reading {path} in sandbox {sandbox_id}"
        attempt = 0
        while True:
            headers = backend._envd_headers(sandbox_id, "root")
            try:
                with backend.http.stream(
                    "GET", url, headers=headers, params={"path": path, "username": "root"}
                ) as response:
                    if response.status_code < 400:
                        return _read_capped(response, max_bytes)
                    response.read()
                    error = backend._envd_failure(sandbox_id, status_error(response, what))
            except RemoteError:
                raise
            except Exception as exc:
                raise transport_error(exc, what) from exc
            # A read is idempotent: retry what the proxy says is passing (Cube's 503).
            if error.kind not in (ErrorKind.RATE_LIMITED, ErrorKind.UNAVAILABLE) or attempt >= backend.retries:
                raise error
            attempt += 1
            backend.sleep(backend._backoff(attempt, error.retry_after))

    def list(self, sandbox_id: str, path: str) -> builtins.list[FileInfo]:
        path = _absolute(path)
        answer = self.backend.rpc(
            sandbox_id, "filesystem.Filesystem/ListDir", {"path": path, "depth": 1}, f"listing {path}"
        )
        return sorted((file_info(entry) for entry in answer.get("entries") or []), key=lambda info: info.name)

    def make_dir(self, sandbox_id: str, path: str, *, user: str = "user") -> None:
        path = _absolute(path)
        try:
            self.backend.rpc(sandbox_id, "filesystem.Filesystem/MakeDir", {"path": path}, f"creating {path}", user=user)
        except RemoteError as exc:
            if exc.kind != ErrorKind.CONFLICT:  # already_exists: fine
                raise

    def remove(self, sandbox_id: str, path: str) -> None:
        path = _absolute(path)
        if path == "/":
            raise RemoteError(ErrorKind.INVALID, "refusing to remove /")
        try:
            self.backend.rpc(sandbox_id, "filesystem.Filesystem/Remove", {"path": path}, f"removing {path}")
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise

    def stat(self, sandbox_id: str, path: str) -> FileInfo:
        path = _absolute(path)
        answer = self.backend.rpc(sandbox_id, "filesystem.Filesystem/Stat", {"path": path}, f"stat {path}")
        return file_info(answer.get("entry") or {})


# ---------------------------------------------------------------------------------------
# Snapshots, templates, inbound


class E2BSnapshots(SnapshotsCapability):
    """`POST /sandboxes/{id}/snapshots`, `GET /snapshots`, `DELETE /templates/{snapshot id}`.
    E2B snapshot ids (`team/name:tag`) are presented as `snap-<id>`."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def create(self, sandbox_id: str, *, name: str = "", labels: Mapping[str, str] | None = None) -> SnapshotInfo:
        # Names are unique per team: suffix one so repeated names never collide.
        unique = f"{_slug(name) or 'snapshot'}-{secrets.token_hex(4)}"
        response = self.backend._api(
            "POST",
            f"/sandboxes/{_q(sandbox_id)}/snapshots",
            f"snapshotting sandbox {sandbox_id}",
            idempotent=False,
            json={"name": unique},
            timeout=SLOW_REQUEST_TIMEOUT_S,
        )
        info = self.backend._snapshot_info(response.json(), source=sandbox_id, name=name or unique)
        self.backend._verify_snapshot(info)
        return info

    def list(self) -> builtins.list[SnapshotInfo]:
        return self.backend.snapshot_infos()

    def delete(self, snapshot_id: str) -> None:
        raw = self.backend._raw_snapshot_id(snapshot_id) if is_snapshot_id(snapshot_id) else snapshot_id
        try:
            self.backend._api(
                "DELETE",
                f"/templates/{_q(raw)}",
                f"deleting snapshot {snapshot_id}",
                idempotent=True,
                timeout=SLOW_REQUEST_TIMEOUT_S,
            )
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40]


class E2BTemplates(TemplatesCapability):
    """`GET /v2/templates` minus every snapshot (the spec does not promise they are apart).
    E2B templates are built with E2B's own build system: create/delete are unsupported."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def list(self) -> builtins.list[TemplateInfo]:
        rows = self.backend.paged_rows("/v2/templates", "listing templates")
        snapshots = {self.backend._raw_snapshot_id(s.snapshot_id) for s in self.backend.snapshot_infos()}
        infos = [_e2b_template(row) for row in rows if str(row.get("templateID")) not in snapshots]
        infos = [info for info in infos if not (set(info.labels.get("names", "").split(",")) & snapshots)]
        return sorted(infos, key=lambda info: info.template_id)

    def get(self, template_id: str) -> TemplateInfo:
        if is_snapshot_id(template_id):
            raise RemoteError(ErrorKind.NOT_FOUND, f"{template_id!r} is a snapshot, not a template")
        response = self.backend._api("GET", f"/templates/{_q(template_id)}", f"template {template_id}", idempotent=True)
        return _e2b_template(response.json())

    def create(self, spec: TemplateBuildSpec) -> TemplateInfo:
        raise RemoteError(ErrorKind.UNSUPPORTED, "E2B templates are built with the E2B CLI or SDK, not the console")

    def delete(self, template_id: str) -> None:
        raise RemoteError(ErrorKind.UNSUPPORTED, "E2B templates are deleted with the E2B CLI or dashboard")


def _e2b_template(row: Mapping[str, Any]) -> TemplateInfo:
    names = [str(n) for n in (row.get("names") or row.get("aliases") or [])]
    return TemplateInfo(
        template_id=str(row["templateID"]),
        name=names[0] if names else str(row["templateID"]),
        created_at=parse_time(row.get("createdAt")),
        size_bytes=int(row["diskSizeMB"]) * 1024 * 1024 if row.get("diskSizeMB") else None,
        labels={"names": ",".join(names)} if names else {},
    )


class E2BInbound(InboundCapability):
    """Port URLs `https://<port>-<id>.<domain>`; the traffic token (needed when public
    traffic is off) comes from the create/connect answer and is cached per backend."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def public_url(self, sandbox_id: str, port: int) -> str:
        if not 1 <= port <= 65535:
            raise RemoteError(ErrorKind.INVALID, f"invalid port {port}")
        return f"https://{port}-{sandbox_id}.{self.backend.domain}"

    def traffic_token(self, sandbox_id: str) -> str | None:
        with self.backend._lock:
            return self.backend._traffic_tokens.get(sandbox_id)


# ---------------------------------------------------------------------------------------
# Volumes


class E2BVolumes(VolumesCapability):
    """E2B team volumes as persistent workspaces: `POST /volumes {name}`, `GET /volumes`,
    `DELETE /volumes/{id}` (e2b SDK 2.63 api/client/api/volumes). E2B addresses a volume by id;
    the console knows its workspaces by name, so both calls look the name up first."""

    def __init__(self, backend: E2BBackend) -> None:
        self.backend = backend

    def check(self) -> str:
        with self._no_volumes_is_unsupported():
            response = self.backend._api("GET", "/volumes", "listing volumes", idempotent=True)
        return f"team volumes available ({len(response.json())} on the team)"

    def ensure(self, name: str) -> None:
        """The volume exists afterwards (created when missing)."""
        if self._find(name) is not None:
            return
        try:
            with self._no_volumes_is_unsupported():
                self.backend._api("POST", "/volumes", f"creating volume {name}", idempotent=False, json={"name": name})
        except RemoteError as exc:
            # A name taken meanwhile is a 400 "already exists" (infra volume_create.go): look again.
            if exc.kind != ErrorKind.INVALID or self._find(name) is None:
                raise

    def delete(self, name: str) -> None:
        """Idempotent. E2B deletes a mounted volume too (its data goes in the background)."""
        volume_id = self._find(check_volume_name(name))
        if volume_id is None:
            return
        try:
            self.backend._api("DELETE", f"/volumes/{_q(volume_id)}", f"deleting volume {name}", idempotent=True)
        except RemoteError as exc:
            if exc.kind not in (ErrorKind.NOT_FOUND, ErrorKind.GONE):
                raise

    @staticmethod
    @contextmanager
    def _no_volumes_is_unsupported() -> Iterator[None]:
        try:
            yield
        except RemoteError as exc:
            if exc.kind in (ErrorKind.FORBIDDEN, ErrorKind.UNSUPPORTED):
                # 403 "use of volumes is not enabled", 501 volume tokens not configured.
                raise RemoteError(
                    ErrorKind.UNSUPPORTED,
                    f"this E2B team has no volumes ({exc.message}); turn the persistent /workspace off",
                ) from None
            raise

    def _find(self, name: str) -> str | None:
        with self._no_volumes_is_unsupported():
            response = self.backend._api("GET", "/volumes", "listing volumes", idempotent=True)
        ids = [str(row["volumeID"]) for row in response.json() if row.get("name") == name]
        return ids[0] if ids else None


# ---------------------------------------------------------------------------------------
# PTY


class E2BPtys(PtyCapability):
    """Terminals as envd PTY processes (`process.Process/Start` with `pty`). The stream has no
    deadline (the SDK's `timeout=0`), and asks for keepalive events."""

    def __init__(self, backend: E2BBackend) -> None:
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
        if not command:
            raise RemoteError(ErrorKind.INVALID, "empty terminal command")
        envs = {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", **(env or {})}
        body = self.backend._start_body(sandbox_id, command, cwd=cwd, env=envs, pty=size.clamped())
        response = self.backend.open_stream(
            sandbox_id, "process.Process/Start", body, f"opening a terminal in sandbox {sandbox_id}", user=user
        )
        handle = E2BPty(self.backend, sandbox_id, response)
        handle.wait_started()
        return handle


class E2BPty(PtyHandle):
    """One PTY process; a reader thread moves its output into a buffer."""

    def __init__(self, backend: E2BBackend, sandbox_id: str, response: httpx.Response) -> None:
        self.backend = backend
        self.sandbox_id = sandbox_id
        self.response = response
        self.pid: int | None = None
        self.pty_id = ""
        self._buffer = bytearray()
        self._cond = threading.Condition()
        self._ended = False
        self._dropped = False
        self._error: RemoteError | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._pump, name=f"e2b-pty-{sandbox_id[:12]}", daemon=True)
        self._thread.start()

    def wait_started(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self.pid is not None or self._ended or self._dropped, timeout)
        if self.pid is None:
            self.response.close()
            raise self._error or RemoteError(ErrorKind.UNAVAILABLE, "the terminal did not start")

    def _pump(self) -> None:
        clean = False
        try:
            for flags, message in iter_envelopes(self.response.iter_raw()):
                if flags & _FLAG_END_STREAM:
                    if message.get("error"):
                        self._error = connect_error(message["error"], "terminal")
                    clean = True
                    break
                event = message.get("event") or {}
                with self._cond:
                    if "start" in event:
                        self.pid = int(event["start"]["pid"])
                        self.pty_id = str(self.pid)
                    elif "data" in event and "pty" in event["data"]:
                        self._buffer += base64.b64decode(event["data"]["pty"])
                    elif "end" in event:
                        clean = True
                    self._cond.notify_all()
        except (httpx.HTTPError, OSError, ValueError, RuntimeError):
            pass
        with self._cond:
            self._ended = True
            # A stream that stops without the end event or end envelope was cut.
            self._dropped = not clean and not self._closing
            self._cond.notify_all()

    def read(self, max_bytes: int = 65536, timeout: float | None = None) -> bytes:
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._buffer) or self._ended, timeout):
                raise RemoteError(ErrorKind.TIMEOUT, "no terminal output in time")
            if self._buffer:
                data = bytes(self._buffer[:max_bytes])
                del self._buffer[:max_bytes]
                return data
            if self._dropped:
                raise RemoteError(ErrorKind.UNAVAILABLE, f"the terminal stream of sandbox {self.sandbox_id} was cut")
            return b""

    def _require_pid(self) -> int:
        if self.pid is None or self._ended:
            raise RemoteError(ErrorKind.GONE, "the terminal has ended")
        return self.pid

    def write(self, data: bytes) -> None:
        pid = self._require_pid()
        self.backend.rpc(
            self.sandbox_id,
            "process.Process/SendInput",
            {"process": {"pid": pid}, "input": {"pty": base64.b64encode(data).decode()}},
            "terminal input",
        )

    def resize(self, size: PtySize) -> None:
        pid = self._require_pid()
        size = size.clamped()
        self.backend.rpc(
            self.sandbox_id,
            "process.Process/Update",
            {"process": {"pid": pid}, "pty": {"size": {"cols": size.cols, "rows": size.rows}}},
            "terminal resize",
        )

    def kill(self) -> None:
        if self.pid is not None and not self._ended:
            with suppress(RemoteError):
                self.backend.rpc(
                    self.sandbox_id,
                    "process.Process/SendSignal",
                    {"process": {"pid": self.pid}, "signal": "SIGNAL_SIGKILL"},
                    "terminal kill",
                )
            with self._cond:
                self._cond.wait_for(lambda: self._ended, 5)
        with self._cond:
            self._closing = True
        self.response.close()
        self._thread.join(5)

    def is_running(self) -> bool:
        return self.pid is not None and not self._ended


_BACKEND_METHODS = ("create", "connect", "get", "list", "delete", "pause", "exec")
translating(E2BBackend, *_BACKEND_METHODS)
translating(E2BFiles, "write", "read", "list", "make_dir", "remove", "stat")
translating(E2BSnapshots, "create", "list", "delete")
translating(E2BTemplates, "list", "get", "create", "delete")
translating(E2BInbound, "public_url", "traffic_token")
translating(E2BVolumes, "ensure", "delete")
translating(E2BPtys, "open")
translating(E2BPty, "read", "write", "resize", "kill")
