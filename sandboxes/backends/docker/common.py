"""Vocabulary every module of the Docker adapter shares: labels and kinds, states, the
engine's errors as `RemoteError`s, metadata labels and page tokens, command-result checks.

Imports nothing of the project but `sandboxes.backends` (the contract).
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import http.client
import json
import posixpath
import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any, NoReturn

import docker
import docker.errors
import docker.tls
import requests.exceptions
import urllib3.exceptions

from ..base import (
    META_INSTALLATION,
    META_SPACE,
    SANDBOX_UID,
    SNAPSHOT_PREFIX,
    ErrorKind,
    ExecResult,
    RemoteError,
    SandboxState,
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
# On a sandbox: its space's network (also while outbound is off and it is on none).
LABEL_NETWORK = "console.network"
# What the root install path (apt/dpkg, pip, npm, chown of /workspace, killing the session
# user's timed-out commands) needs; every other capability is dropped. Why each is kept:
# docs/security.md, "Sandbox hardening".
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
# Left to the engine on purpose: no "seccomp=…" or "apparmor=…" entry keeps its defaults.
SECURITY_OPTIONS = ("no-new-privileges",)
HOST_FIREWALL_MODES = ("auto", "external")
SNAPSHOT_REPOSITORY = "sandbox-console/snapshots"
TEMPLATE_REPOSITORY = "sandbox-console"
# The engine's layer store refuses an image deeper than this ("max depth exceeded").
DOCKER_MAX_LAYERS = 125
DEFAULT_API_TIMEOUT_S = 120
STOP_GRACE_S = 5
# Where a terminal records its shell's in-container pid, by the terminal's user: (folder, mode).
# The path shows in the launcher's command line, so a root terminal's is in /run, which uid 1000
# cannot write: in /tmp the user could plant a link at it first (the host's fs.protected_symlinks
# may be 0) and root would write through it. The session user's may stay where it can write.
PTY_PID_DIRS = {
    "user": ("/tmp/.console-pty", "1777"),  # noqa: S108 - a path inside the sandbox, not on the host
    "root": ("/run/.console-pty", "700"),
}

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

# Every exec runs as `timeout -s KILL BACKSTOP COMMAND...`, one process between the engine and
# the command. The engine starts it as the leader of a session and process group of its own
# (docker exec does), and `timeout` keeps that group for the command and all it starts (it calls
# setpgid(0, 0) unless --foreground): a timeout kills the whole group. The console kills the
# group itself when an exec's deadline passes; `timeout` is the backstop for when it cannot
# (the engine went away mid-call): the group dies inside the sandbox a little after the
# deadline, so no command outlives it. (A shell and `setsid` around it cost three more
# processes, ~4 ms on every exec: bench/sandbox_lifecycle.py.)
EXEC_BACKSTOP_GRACE_S = 2.0
# BACKSTOP carries the exec's mark: random digits past the millisecond (`62.000` then 15 digits,
# the same deadline to `timeout`), by which a second exec finds the group again in
# /proc/*/cmdline. Nothing is written in the sandbox: no pid file a user could plant a link at
# for a root exec to write through, and none left behind.
EXEC_MARK_DIGITS = 15
# Finds the exec's `timeout` by its mark (one whole argument: -x on NUL-ended records) and kills
# its group; $0 is the mark. Only a process of the killer's own user (`-O`: a root exec's killer
# never kills on a mark the user copied into a process of theirs), named `timeout`, leading its
# own group, and not the killer's own `timeout` (its parent, whose arguments hold the mark too).
# Waits briefly for it (a very short timeout can beat the engine starting it).
_KILL_GROUP = (
    "for i in 1 2 3 4 5 6 7 8 9 10; do "
    'for f in $(grep -lsaxzF -- "$0" /proc/[0-9]*/cmdline); do '
    'p=${f#/proc/}; p=${p%/cmdline}; [ "$p" != "$PPID" ] && [ -O "/proc/$p" ] || continue; '
    'read -r c < "/proc/$p/comm" && [ "$c" = timeout ] || continue; '
    # The fields after the command name (which may hold spaces): state, parent, group.
    'read -r s < "/proc/$p/stat" || continue; s=${s##*) }; set -- $s; [ "$3" = "$p" ] || continue; '
    'kill -KILL -"$p" 2>/dev/null; exit 0; done; sleep 0.05; done; true'
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
    http.client.HTTPException,  # IncompleteRead, a head cut short (wire.py)
)


class EngineAnswer(Exception):
    """An error answer of the engine read without docker-py (wire.py): its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def _translate(exc: Exception, what: str) -> RemoteError:
    """One docker-py / requests failure as a RemoteError; the vendor type never leaks."""
    if isinstance(exc, RemoteError):
        return exc
    if isinstance(exc, EngineAnswer):
        return _translate_status(exc.status, f"{what}: {exc.message}")
    if isinstance(exc, docker.errors.NotFound):
        return RemoteError(ErrorKind.NOT_FOUND, f"{what}: {_explanation(exc)}")
    if isinstance(exc, docker.errors.APIError) and "max depth exceeded" in _explanation(exc):
        return RemoteError(
            ErrorKind.INVALID,
            f"{what}: the image has Docker's maximum of {DOCKER_MAX_LAYERS} layers (max depth exceeded). Snapshots "
            "flatten before that (option snapshot_max_layers), so the image came from elsewhere: rebuild the "
            "template with fewer layers, or flatten it (docker export of a container, then docker import).",
        )
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


def _check_image_owner(attrs: Mapping[str, Any], owner: Mapping[str, str] | None, template_id: str) -> None:
    """An image with owner labels (installation, space) starts sandboxes of that owner only."""
    if owner is None:
        return
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    for key in (META_INSTALLATION, META_SPACE):
        if key in labels and labels[key] != owner.get(key):
            raise RemoteError(ErrorKind.NOT_FOUND, f"template {template_id!r} not found (another tenant's image)")


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


def _hardening() -> dict[str, Any]:
    """Host-config arguments every sandbox and build container gets."""
    return {
        "cap_drop": ["ALL"],
        "cap_add": list(ROOT_CAPABILITIES),
        "security_opt": list(SECURITY_OPTIONS),
        "privileged": False,
    }
