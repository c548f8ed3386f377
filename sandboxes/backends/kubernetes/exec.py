"""Commands in a sandbox's pod through `pods/exec` (`PodExec`): the contract's `exec`, and the
one way `pty` and `files` reach a pod.

`pods/exec` takes only a command: no user, working directory, environment or deadline. So every
command goes through a small launcher run by `/bin/sh` in the pod:
- the user: "root" needs a pod running as root (else `unsupported`, in words); "user" in a pod
  running as root drops to uid/gid 1000 with `setpriv` (util-linux), and in a pod that runs
  as anyone else runs as that user (the pod's own non-root user);
- the working directory (`cd`; a missing one is `invalid`) and the environment (`env`, with
  HOME of the user);
- the deadline: the command runs in its own session and process group (`setsid -w`), led
  by `timeout -s KILL` as a backstop a little past the deadline, and records the group's id
  in a pid file; when the deadline passes first, a second exec kills that group (pods/exec
  has no kill of its own);
- stdin: the command reads it through `head -c <length>`, so it gets EOF after the bytes
  sent whether or not the server speaks v5 (whose close channel also ends it).
The command travels in the exec's URL; one longer than `MAX_QUERY_BYTES` (a proxy in front
of the API server may take a few KiB of request line only) goes on stdin instead, ahead of
the command's own input, read back by exact length (`carried`). The exit code is the one the
status on channel 3 carries.

May import: the contract and `.stream`.
"""

from __future__ import annotations

import re
import secrets
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from ..base import SANDBOX_UID, ErrorKind, ExecRequest, ExecResult, NotStarted, RemoteError
from .stream import STATUS, STDERR, STDIN, STDOUT, ChannelStream, exec_path, exec_query, exit_code_of, open_stream

# Past the deadline, the backstop in the pod kills the command this much later.
BACKSTOP_GRACE_S = 2.0
STDIN_CHUNK = 64 * 1024
HOMES = {"user": "/home/user", "root": "/root"}
# Where pid files go: a root command's in a folder uid 1000 cannot write. The path shows in the
# command line, so in /tmp the user could plant a link at it before the command writes it (the
# node's fs.protected_symlinks may be 0) and root would write its pid through the link.
PID_DIRS = {"user": "/tmp", "root": "/run"}  # noqa: S108 - paths inside the pod
# The longest command sent in the URL; a longer one goes on stdin (`carried`).
MAX_QUERY_BYTES = 6 * 1024
MARK = "console-exec:"
ROOT_REFUSED = "the pod runs as uid"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# argv: WANT INNER ARGS...: become the wanted user, then run INNER with ARGS.
LAUNCH = (
    "want=$1; inner=$2; shift 2; me=$(id -u); "
    'if [ "$want" = root ]; then [ "$me" = 0 ] || { echo "' + MARK + " " + ROOT_REFUSED + " $me, and root "
    'commands need a pod that runs as root" >&2; exit 126; }; exec /bin/sh -c "$inner" sh "$@"; fi; '
    f'if [ "$me" = 0 ]; then exec setpriv --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups '
    '/bin/sh -c "$inner" sh "$@"; fi; '
    'exec /bin/sh -c "$inner" sh "$@"'
)
# argv: PIDFILE DIR BACKSTOP STDIN_LENGTH COMMAND...
RUN = (
    "f=$1; dir=$2; cap=$3; n=$4; shift 4; "
    'if [ -n "$dir" ]; then cd -- "$dir" 2>/dev/null || { echo "'
    + MARK
    + ' no such directory: $dir" >&2; exit 126; }; fi; '
    'exec setsid -w timeout -s KILL "$cap" /bin/sh -c \'{ echo $PPID > "$1"; } 2>/dev/null; f=$1; n=$2; shift 2; '
    'if [ -n "$n" ]; then head -c "$n" | "$@"; else "$@"; fi; rc=$?; rm -f "$f"; exit $rc'
    '\' sh "$f" "$n" "$@"'
)
# argv: PIDFILE. Waits briefly for the file (a short deadline can beat it), kills the group;
# only a group id above 1 (the file is the command's user's to rewrite).
KILL_GROUP = (
    'for i in 1 2 3 4 5 6 7 8 9 10; do [ -s "$1" ] && break; sleep 0.05; done; '
    'p=$(cat "$1" 2>/dev/null); case "$p" in ""|*[!0-9]*|0|1) ;; *) kill -KILL -"$p" 2>/dev/null;; esac; '
    'rm -f "$1"; true'
)


@dataclass(frozen=True)
class PodRef:
    """Where a sandbox's commands run: its pod (and container, when the pod has several)."""

    namespace: str
    pod: str
    container: str | None = None


def check_user(user: str) -> str:
    if user not in HOMES:
        raise RemoteError(ErrorKind.INVALID, f"unknown user {user!r} (use 'user' or 'root')")
    return user


def launched(user: str, script: str, *args: str) -> tuple[str, ...]:
    """The argv that runs `script` (with `args`) as `user` in the pod."""
    return ("/bin/sh", "-c", LAUNCH, "sh", check_user(user), script, *args)


def with_env(user: str, env: Mapping[str, str] | None, command: Sequence[str]) -> tuple[str, ...]:
    pairs = [f"HOME={HOMES[user]}"]
    for name, value in (env or {}).items():
        if not _ENV_NAME.match(name) or "\x00" in value:
            raise RemoteError(ErrorKind.INVALID, f"invalid environment variable {name!r}")
        pairs.append(f"{name}={value}")
    return ("env", *pairs, *command)


def launcher_refusal(result: ExecResult) -> RemoteError | None:
    """The launcher's own refusal (exit 126 with its mark on stderr), as an error."""
    if result.exit_code != 126 or not result.stderr.startswith(MARK.encode()):
        return None
    message = result.stderr.decode(errors="replace").strip().removeprefix(MARK).strip()
    kind = ErrorKind.UNSUPPORTED if message.startswith(ROOT_REFUSED) else ErrorKind.INVALID
    return RemoteError(kind, message)


class PodExec:
    """Commands in pods. `locate` maps a sandbox id to its pod (raising RemoteError, or
    NotStarted when the sandbox has no running pod); `guarded` as `stream.open_stream` takes it."""

    def __init__(
        self, configuration: Any, *, allow_private: bool, locate: Callable[[str], PodRef], guarded: bool = True
    ) -> None:
        self.configuration = configuration
        self.allow_private = allow_private
        self.locate = locate
        self.guarded = guarded

    def open(self, pod: PodRef, command: Sequence[str], *, stdin: bool, tty: bool, what: str) -> ChannelStream:
        try:
            return open_stream(
                self.configuration,
                exec_path(pod.namespace, pod.pod),
                exec_query(command, container=pod.container, stdin=stdin, tty=tty),
                allow_private=self.allow_private,
                what=what,
                guarded=self.guarded,
            )
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                raise NotStarted(exc.kind, exc.message) from None
            if exc.kind == ErrorKind.INVALID and ("not found" in exc.message or "host assigned" in exc.message):
                raise NotStarted(ErrorKind.CONFLICT, exc.message) from None
            raise

    def exec(self, sandbox_id: str, request: ExecRequest) -> ExecResult:
        try:
            pod = self.locate(sandbox_id)
        except NotStarted:
            raise
        except RemoteError as exc:
            if exc.kind in (ErrorKind.NOT_FOUND, ErrorKind.GONE, ErrorKind.CONFLICT):
                # No pod to run in: nothing ran (a sandbox gone, suspended or not ready yet).
                raise NotStarted(exc.kind, exc.message) from None
            raise
        command = list(request.argv) if request.argv is not None else ["/bin/bash", "-c", request.shell or ""]
        result = self.run(
            pod,
            command,
            user=request.user,
            cwd=request.cwd,
            env=request.env,
            stdin=request.stdin,
            timeout_s=request.timeout_s,
            max_output_bytes=request.max_output_bytes,
            what=f"exec in sandbox {sandbox_id}",
        )
        refusal = launcher_refusal(result)
        if refusal is not None:
            raise refusal
        return result

    def run(
        self,
        pod: PodRef,
        command: Sequence[str],
        *,
        user: str = "user",
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float = 60.0,
        max_output_bytes: int = 1024 * 1024,
        what: str = "exec",
    ) -> ExecResult:
        pid_file = f"{PID_DIRS[check_user(user)]}/.console-exec-{secrets.token_hex(8)}.pid"
        backstop = f"{timeout_s + BACKSTOP_GRACE_S:.3f}"

        def launcher(length: str) -> tuple[str, ...]:
            return launched(user, RUN, pid_file, cwd or "", backstop, length, *with_env(user, env, command))

        # Carried on stdin, the command reads its own input as counted bytes (none: zero).
        argv, sent = carried(
            launcher("" if stdin is None else str(len(stdin))), stdin, launcher(str(len(stdin or b"")))
        )
        started = time.monotonic()
        stream = self.open(pod, argv, stdin=sent is not None, tty=False, what=what)
        reader = _OutputReader(stream, max_output_bytes)
        try:
            if sent is not None:
                threading.Thread(target=_feed, args=(stream, sent), daemon=True).start()
            timed_out = not reader.read_until(started + timeout_s)
        finally:
            stream.close()
        if timed_out or reader.status is None:
            self._kill_group(pod, pid_file, user)
        if timed_out:
            exit_code = 137  # killed by SIGKILL, as a shell reports it
        elif reader.status is None:
            raise RemoteError(
                ErrorKind.UNAVAILABLE, f"{what}: the exec stream was cut while the command ran; it was stopped"
            )
        else:
            exit_code = exit_code_of(reader.status, what)
        return ExecResult(
            exit_code=exit_code,
            stdout=bytes(reader.out[STDOUT]),
            stderr=bytes(reader.out[STDERR]),
            duration_s=time.monotonic() - started,
            truncated=reader.truncated,
            timed_out=timed_out,
        )

    def _kill_group(self, pod: PodRef, pid_file: str, user: str) -> None:
        """Kill the process group whose id `pid_file` holds, as `user` (the command's own)."""
        with suppress(RemoteError):
            stream = self.open(pod, launched(user, KILL_GROUP, pid_file), stdin=False, tty=False, what="kill")
            try:
                _OutputReader(stream, 4096).read_until(time.monotonic() + 10)
            finally:
                stream.close()


def carried(
    argv: tuple[str, ...], stdin: bytes | None, counted: tuple[str, ...]
) -> tuple[tuple[str, ...], bytes | None]:
    """The argv to send and the stdin to feed. A command too long for a URL (proxies in front
    of an API server may take a few KiB of request line only) goes on stdin, as `counted` (the
    same command reading its input as counted bytes), ahead of that input: the pod reads
    exactly its length back (`head -c`), then runs it."""
    if len(urlencode([("command", part) for part in argv])) <= MAX_QUERY_BYTES:
        return argv, stdin
    script = ("set -- " + " ".join(shlex.quote(part) for part in counted)).encode()
    reader = ("/bin/sh", "-c", 's=$(head -c "$0") || exit 125; eval "$s"; exec "$@"', str(len(script)))
    return reader, script + (stdin or b"")


def _feed(stream: ChannelStream, data: bytes) -> None:
    # A command that exits without reading its input, and a deadline that closes the stream
    # under us, are not failures of the exec.
    with suppress(RemoteError):
        for start in range(0, len(data), STDIN_CHUNK):
            stream.send(STDIN, data[start : start + STDIN_CHUNK])
        stream.close_channel(STDIN)


class _OutputReader:
    """stdout and stderr, at most `cap` bytes of each (the rest read and dropped), and the status."""

    def __init__(self, stream: ChannelStream, cap: int) -> None:
        self.stream = stream
        self.cap = cap
        self.out = {STDOUT: bytearray(), STDERR: bytearray()}
        self.truncated = False
        self.status: bytes | None = None

    def read_until(self, deadline: float) -> bool:
        """Read until the server closes the stream; False when the deadline passed first."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                message = self.stream.recv(remaining)
            except TimeoutError:
                return False
            if message is None:
                return True
            channel, data = message
            if channel == STATUS:
                self.status = (self.status or b"") + data
            elif channel in self.out:
                target = self.out[channel]
                room = self.cap - len(target)
                if len(data) > room:
                    self.truncated = True
                if room > 0:
                    target += data[:room]
