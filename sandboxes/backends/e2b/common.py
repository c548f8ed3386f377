"""Vocabulary every module of the E2B adapter shares: defaults, the two planes' errors as
`RemoteError`s, time and version parsing, Connect envelopes, the `translating` wrapper
that lets nothing but `RemoteError` out of a capability, metadata filters.

Imports nothing of the project but `sandboxes.backends` (the contract). The Cube adapter
builds on it too.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import re
import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from netpolicy import Domain, Treatment, opened_parts, opened_range
from netpolicy.addresses import classes, networks

from ..base import (
    ErrorKind,
    NetworkSpec,
    RemoteError,
    SandboxState,
)

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
# Pid and stdin files of an exec, by its user. The paths are in the command line, which
# uid 1000 reads in /proc: a root exec's files in /tmp would let the user put a link there
# first, and root would write through it.
EXEC_PID_DIRS = {"user": "/tmp", "root": "/run"}  # noqa: S108 - paths inside the sandbox
# Workspace names: E2B volume names are [a-zA-Z0-9_-]+ (e2b-dev/infra
# packages/api/internal/handlers/volume_create.go), and Cube uses the name as one directory
# under the host root, so nothing that could leave it (/, ..) may pass.
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")

_FLAG_END_STREAM = 0x02
# The largest Connect message read from envd: far above what envd sends (process output
# comes in small chunks), so a bigger length header is a broken or hostile server.
MAX_ENVELOPE_BYTES = 16 * 1024 * 1024
# A process killed by a signal ends with `exited` false (omitted by protojson) and the status
# Go's ProcessState.String() gives: "signal: <name>", plus " (core dumped)" when a core was
# written (os/exec_posix.go); the names are Linux's from the syscall signal table. Its exit
# code is reported the shell's way, 128 + the signal.
_SIGNAL_NUMBERS = {
    name: number
    for number, name in enumerate(
        (
            "hangup", "interrupt", "quit", "illegal instruction", "trace/breakpoint trap", "aborted",
            "bus error", "floating point exception", "killed", "user defined signal 1",
            "segmentation fault", "user defined signal 2", "broken pipe", "alarm clock", "terminated",
            "stack fault", "child exited", "continued", "stopped (signal)", "stopped",
            "stopped (tty input)", "stopped (tty output)", "urgent i/o condition",
            "cpu time limit exceeded", "file size limit exceeded", "virtual timer expired",
            "profiling timer expired", "window changed", "i/o possible", "power failure",
            "bad system call",
        ),
        start=1,
    )
}  # fmt: skip
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
    'pid_file=$0; in_file=$1; shift; { echo $$ > "$pid_file"; } 2>/dev/null; '
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
    # A user exec's file is the user's to rewrite: only a group id above 1 is killed.
    'p=$(cat "$0" 2>/dev/null); case "$p" in ""|*[!0-9]*|0|1) ;; *) kill -KILL -"$p" 2>/dev/null;; esac; '
    'rm -f "$0"; true'
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
    """The server has no such operation, as opposed to a handler's 404 about a thing the
    operation looked for (`is_missing_route`)."""


# What kin-openapi's router says when no operation of the spec matches (routers.ErrPathNotFound,
# routers.ErrMethodNotAllowed). e2b-dev/infra registers oapi-codegen's gin validator as a global
# middleware (packages/api/main.go @54693ff), so it runs under gin's 404 for an unknown route and
# infra's handler answers {"code": 404, "message": "validation error: <reason>"}
# (packages/api/internal/utils/error.go ErrorHandler).
_ROUTER_REASONS = frozenset({"no matching operation was found", "method not allowed"})


def _is_api_error(response: httpx.Response) -> bool:
    """The API's own error body (spec/openapi.yml Error: `code` and `message`, both required;
    CubeAPI the same). A gateway's answer for a path it has no route for may be JSON too
    (Kong: {"message": "no Route matched with those values"}), but has no `code`."""
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(body, dict) and "message" in body and "code" in body


def is_missing_route(response: httpx.Response) -> bool:
    """Whether a 404/405 says the server has no such operation, in each form a control plane
    answers it: a body without the API's {code, message} (gin's "404 page not found" and
    "405 method not allowed", axum's empty body, a reverse proxy's HTML or its own JSON), or
    the API's body carrying the OpenAPI validator's router reason (e2b-dev/infra)."""
    if response.status_code not in (404, 405):
        return False
    if not _is_api_error(response):
        return True
    message = str(response.json().get("message") or "").strip().lower()
    return message.removeprefix("validation error:").strip() in _ROUTER_REASONS


_CREDENTIAL_HEADERS = ("x-api-key", "x-access-token", "authorization")


def status_error(response: httpx.Response, what: str, *, control: bool = False) -> RemoteError:
    """An HTTP error answer as a RemoteError (both planes)."""
    if response.status_code < 400:
        # Redirects are never followed (the guarded transport checks the address asked for,
        # not one a server names), so a 3xx is no answer: often a login or http->https proxy.
        location = response.headers.get("location", "")[:200] or "?"
        return RemoteError(
            ErrorKind.INVALID,
            f"{what}: the server answered a redirect to {location} (HTTP {response.status_code}); redirects are "
            "not followed, so give the address the server answers on itself",
            retryable=False,
        )
    if control and is_missing_route(response):
        return NoRoute(ErrorKind.UNSUPPORTED, f"{what}: the server has no such operation (HTTP {response.status_code})")
    message, error_code = _message_of(response)
    # A server (or a proxy before it) may repeat the credential it was sent; the message
    # reaches health details, job errors and pages that the key's owner never shows.
    try:
        sent = [response.request.headers.get(name) or "" for name in _CREDENTIAL_HEADERS]
    except RuntimeError:  # a response built without its request
        sent = []
    for value in sent:
        for secret in {value, value.partition(" ")[2]}:  # "Basic xyz": the credential part too
            if len(secret) >= 8:
                message = message.replace(secret, "***")
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
    """Connect streaming envelopes (flags, JSON) from raw response chunks.

    An envelope's length is the sender's word: one past MAX_ENVELOPE_BYTES is refused at its
    header instead of buffered (envd sends output in small chunks). The buffer is a bytearray
    consumed from the front, so a large message costs no repeated copies."""
    buffer = bytearray()
    for chunk in chunks:
        buffer += chunk
        while len(buffer) >= 5:
            flags, length = struct.unpack(">BI", buffer[:5])
            if length > MAX_ENVELOPE_BYTES:
                raise RemoteError(
                    ErrorKind.INTERNAL,
                    f"envd sent a message of {length} bytes (at most {MAX_ENVELOPE_BYTES} are read)",
                    retryable=False,
                )
            if len(buffer) < 5 + length:
                break
            payload = bytes(buffer[5 : 5 + length])
            del buffer[: 5 + length]
            yield flags, (json.loads(payload) if payload else {})


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


# E2B's "everything" in denyOut (the SDK's ALL_TRAFFIC): the one range starting at 0.0.0.0
# ever sent (a server may read any 0.0.0.0/n as "all traffic").
ALL_TRAFFIC = "0.0.0.0/0"
_UNSPECIFIED = ipaddress.ip_network("0.0.0.0/8")


def _always_denied_v4() -> list[str]:
    """netpolicy's never-reachable and private IPv4 classes, for denyOut where the console
    allows every destination (an allowOut entry beats them: the private exceptions)."""
    found = [*classes(sandbox=Treatment.NEVER), *classes(sandbox=Treatment.OPENABLE)]
    v4 = [n for n in networks(tuple(found), 4) if isinstance(n, ipaddress.IPv4Network) and not n.overlaps(_UNSPECIFIED)]
    return [str(n) for n in ipaddress.collapse_addresses(v4)]


def _domain_names(domain: Domain) -> list[str]:
    """A plain domain is the name and all its subdomains: E2B matches a plain name exactly,
    so it gets `x` and `*.x`; a wildcard is sent as it is."""
    return [str(domain)] if domain.wildcard else [domain.name, f"*.{domain.name}"]


def network_problems(network: NetworkSpec, *, open_private: bool) -> list[str]:
    """What E2B's allowOut/denyOut (IPv4 CIDRs and names, an allowOut entry beating denyOut)
    cannot express of `network`, in words; the console names the same before a create
    (`NetworkCapabilities`: no domain deny list, allow entries win, private addresses only
    where `open_private`)."""
    if not network.allow_internet_access:
        return []
    problems = []
    if network.domains("deny_out"):
        problems.append(f"cannot deny domains (denyOut takes CIDRs): {[str(d) for d in network.domains('deny_out')]}")
    allowed_names = network.domains("allow_out")
    for deny in network.cidrs("deny_out"):
        holder = next((a for a in (*network.cidrs("allow_out"), *network.allow_private) if a.overlaps(deny)), None)
        if holder is not None:
            problems.append(f"deny entry {deny} inside allow entry {holder} (allowOut beats denyOut)")
        elif allowed_names:
            problems.append(f"deny entry {deny} beside allowed domains (an allowed name's addresses get through)")
    if not open_private:
        private = [*network.allow_private, *(e for e in network.cidrs("allow_out") if opened_range(e) is not None)]
        if private:
            problems.append(f"cannot open private addresses: {[str(e) for e in private]}")
    return problems


def egress_lists(network: NetworkSpec, *, open_private: bool) -> tuple[list[str], list[str]]:
    """The console's lists as E2B's allowOut/denyOut, where an allowOut entry beats denyOut,
    from the typed entries (netpolicy's meaning):

    - allow-only (a non-empty allow list): allowOut = each CIDR as the parts netpolicy opens
      (never the always-denied classes inside it; private ranges only for an entry inside
      one, and only where `open_private`), each plain domain as `x` and `*.x`, and the
      private exceptions; denyOut = everything, then the deny CIDRs;
    - otherwise: allowOut = the private exceptions, denyOut = the deny CIDRs and netpolicy's
      always-denied IPv4 classes.
    IPv4 entries only (the sandboxes have no IPv6 route). A deny entry inside an allowed range
    or beside allowed domains cannot win here (`network_problems`). Outbound off sends empty
    lists (`allow_internet_access` false says it)."""
    if not network.allow_internet_access:
        return [], []
    private = [str(e) for e in network.allow_private if e.version == 4] if open_private else []
    denied = [str(e) for e in network.cidrs("deny_out") if e.version == 4]
    allow: list[str] = []
    if network.allow_out:
        for entry in network.allow_out:
            if isinstance(entry, Domain):
                allow.extend(_domain_names(entry))
            elif entry.version == 4:
                allow.extend(str(part) for part in opened_parts(entry, private=open_private))
        allow.extend(private)
        deny = [ALL_TRAFFIC, *denied]
    else:
        allow = private
        deny = [*denied, *_always_denied_v4()]
    return list(dict.fromkeys(allow)), list(dict.fromkeys(deny))


# Per-sandbox data-plane facts learnt from create / connect / get.
@dataclass(frozen=True)
class _Envd:
    version: tuple[int, int, int]
    access_token: str | None
