"""Execution backend of the fake E2B/Cube server: one Docker container per fake sandbox.

The fake talks to the local engine with docker-py directly. It deliberately does not reuse the
project's own Docker adapter (sandboxes.backends.docker): the fake must stay independent of the
contract it is used to test.

Isolation rules every container gets: ``network_mode="none"`` and ``dns=["127.0.0.1"]``, so no
command run by a test can reach beyond this machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import docker
from docker.errors import APIError, NotFound
from docker.types import Mount

DEFAULT_IMAGE = "sandbox-console/base:latest"
LABEL_FAKE = "sandbox-console.fake-e2b"
LABEL_RUN = "sandbox-console.fake-e2b.run"
LABEL_SANDBOX = "sandbox-console.fake-e2b.sandbox"
LABEL_VOLUME = "sandbox-console.fake-e2b.volume"
VOLUME_PREFIX = "fake-e2b-vol-"
# The base image carries the console's own markers (console.managed=1, console.kind=template)
# and containers and committed images inherit them, which would put the fake's containers
# and snapshot images into the Docker adapter's template list. The fake sets its own.
CONSOLE_MARKERS = {"console.managed": "0", "console.kind": "fake-e2b"}
SNAPSHOT_REPO = "sandbox-console-fake/snapshot"

# Output callback: (stream, data) where stream is "stdout", "stderr" or "pty".
OutputSink = Callable[[str, bytes], None]


class RuntimeFailure(Exception):
    """A container operation failed; ``status`` is the HTTP status the fake should answer."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class MountSpec:
    """A mount of a fake sandbox: an E2B volume (a Docker named volume) or a Cube host
    directory (a bind mount of a path on the Docker host)."""

    kind: Literal["volume", "bind"]
    source: str
    target: str
    read_only: bool = False

    def docker(self) -> Mount:
        # A fresh E2B volume is empty: `no_copy` stops Docker from seeding a named volume
        # with the image's files at the mount point. A bind mount of a missing source fails,
        # as Cubelet's bind mount does.
        return Mount(
            target=self.target,
            source=self.source,
            type=self.kind,
            read_only=self.read_only,
            no_copy=self.kind == "volume",
        )


@dataclass
class ExecHandle:
    """One running ``docker exec``: its hijacked socket and what we know about it."""

    exec_id: str
    sock: socket.socket
    tty: bool
    host_pid: int = 0
    pid: int = 0
    exit_code: int | None = None
    signalled: int | None = None
    write_lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, data: bytes) -> None:
        with self.write_lock:
            self.sock.sendall(data)

    def close_stdin(self) -> None:
        # The daemon forwards a half-close of the hijacked connection as EOF on the
        # process's stdin, the same thing `docker exec -i` does when its input ends.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)


def _raw_socket(obj: Any) -> socket.socket:
    """docker-py returns a SocketIO wrapper (or the socket) for a hijacked exec."""
    raw = getattr(obj, "_sock", obj)
    assert isinstance(raw, socket.socket)
    return raw


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return buf
        buf += chunk
    return buf


def iter_frames(sock: socket.socket, tty: bool) -> Iterator[tuple[str, bytes]]:
    """Yield (stream, data) from an exec socket until EOF.

    Without a TTY the engine multiplexes: an 8-byte header [stream, 0, 0, 0, size u32 BE]
    precedes each chunk. With a TTY the stream is raw.
    """
    while True:
        if tty:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            yield "pty", data
            continue
        header = _recv_exact(sock, 8)
        if len(header) < 8:
            return
        size = int.from_bytes(header[4:8], "big")
        data = _recv_exact(sock, size)
        yield ("stderr" if header[0] == 2 else "stdout"), data
        if len(data) < size:
            return


# Helper run inside the container (as the requesting user) for the filesystem RPCs. It prints
# one JSON object: {"ok": ...} or {"error": <connect code>, "message": ...}.
_FS_COMMON = r"""
import datetime, grp, json, os, pwd, shutil, stat, sys

def entry(path):
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        kind, target = "FILE_TYPE_SYMLINK", os.path.realpath(path)
        try:
            st = os.stat(path)
            kind = "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(st.st_mode) else "FILE_TYPE_FILE"
        except OSError:
            pass
    else:
        target = None
        kind = "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(st.st_mode) else "FILE_TYPE_FILE"
    mode = st.st_mode & 0o777
    if stat.S_ISDIR(st.st_mode):
        mode |= 1 << 31  # Go's os.ModeDir, as envd reports it
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    mtime = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
    out = {"name": os.path.basename(path.rstrip("/")) or "/", "type": kind,
           "path": path, "size": str(st.st_size), "mode": mode,
           "permissions": stat.filemode(st.st_mode), "owner": owner, "group": group,
           "modifiedTime": mtime.isoformat().replace("+00:00", "Z")}
    if target is not None:
        out["symlinkTarget"] = target
    if not st.st_size:
        del out["size"]  # protojson omits a zero int64
    return out

def absolute(p):
    return os.path.abspath(os.path.join(os.path.expanduser("~"), os.path.expanduser(p)))

"""

_FS_HELPER = (
    _FS_COMMON
    + r"""
def listdir(path, depth):
    out = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        out.append(entry(full))
        if depth > 1 and os.path.isdir(full) and not os.path.islink(full):
            out.extend(listdir(full, depth - 1))
    return out

def main():
    op, args = sys.argv[1], json.loads(sys.argv[2])
    try:
        if op == "stat":
            return {"ok": entry(absolute(args["path"]))}
        if op == "home":
            return {"ok": os.path.expanduser("~")}
        if op == "list":
            path = absolute(args["path"])
            if not os.path.isdir(path):
                if not os.path.exists(path):
                    raise FileNotFoundError(path)
                msg = "path is not a directory: " + path
                return {"error": "invalid_argument", "message": msg}
            return {"ok": listdir(path, max(1, int(args.get("depth") or 1)))}
        if op == "mkdir":
            path = absolute(args["path"])
            if os.path.exists(path):
                if os.path.isdir(path):
                    msg = "directory already exists: " + path
                    return {"error": "already_exists", "message": msg}
                return {"error": "invalid_argument", "message": "path is a file: " + path}
            os.makedirs(path)
            return {"ok": entry(path)}
        if op == "move":
            src, dst = absolute(args["source"]), absolute(args["destination"])
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.rename(src, dst)
            return {"ok": entry(dst)}
        if op == "remove":
            path = absolute(args["path"])
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            return {"ok": {}}
        return {"error": "unimplemented", "message": op}
    except FileNotFoundError as e:
        msg = "no such file or directory: " + str(e.filename or e)
        return {"error": "not_found", "message": msg}
    except PermissionError as e:
        return {"error": "permission_denied", "message": str(e)}
    except OSError as e:
        return {"error": "internal", "message": str(e)}

print(json.dumps(main()))
"""
)

# Directory watcher run inside the container: polls every 50 ms and prints one JSON line per
# change (envd uses inotify; polling reports a rename as REMOVE + CREATE).
_WATCH_HELPER = (
    _FS_COMMON
    + r"""
import time

def scan(root, recursive):
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            out[full] = (st.st_mtime_ns, st.st_size, st.st_mode)
        if not recursive:
            break
    return out

def emit(root, path, kind, include_entry):
    event = {"name": os.path.relpath(path, root), "type": kind}
    if include_entry and kind != "EVENT_TYPE_REMOVE":
        try:
            event["entry"] = entry(path)
        except OSError:
            pass
    print(json.dumps(event), flush=True)

def watch():
    args = json.loads(sys.argv[1])
    root = absolute(args["path"])
    if not os.path.isdir(root):
        code = "not_found" if not os.path.exists(root) else "invalid_argument"
        print(json.dumps({"error": code, "message": "cannot watch " + root}), flush=True)
        return
    recursive, include_entry = bool(args.get("recursive")), bool(args.get("includeEntry"))
    before = scan(root, recursive)
    print(json.dumps({"ready": root}), flush=True)
    while True:
        time.sleep(0.05)
        now = scan(root, recursive)
        for path in sorted(now.keys() - before.keys()):
            emit(root, path, "EVENT_TYPE_CREATE", include_entry)
        for path in sorted(before.keys() - now.keys()):
            emit(root, path, "EVENT_TYPE_REMOVE", include_entry)
        for path in sorted(now.keys() & before.keys()):
            if now[path][:2] != before[path][:2]:
                emit(root, path, "EVENT_TYPE_WRITE", include_entry)
            elif now[path][2] != before[path][2]:
                emit(root, path, "EVENT_TYPE_CHMOD", include_entry)
        before = now

watch()
"""
)

# Reading and writing files goes through small shell scripts run as the user, so ownership,
# permissions and the home directory behave as they do under envd.
_READ_SCRIPT = (
    'p="$1"; case "$p" in /*) ;; *) p="$HOME/$p";; esac; '
    '[ -d "$p" ] && exit 21; [ -e "$p" ] || exit 2; exec cat -- "$p"'
)
_WRITE_SCRIPT = (
    'p="$1"; case "$p" in /*) ;; *) p="$HOME/$p";; esac; mkdir -p -- "$(dirname -- "$p")" && cat > "$p" && echo "$p"'
)


class DockerRuntime:
    """Creates, freezes, snapshots and removes the containers behind the fake sandboxes."""

    def __init__(self, run_id: str, default_image: str = DEFAULT_IMAGE) -> None:
        self.run_id = run_id
        self.default_image = default_image
        self.client = docker.from_env(timeout=120)
        self.api = self.client.api

    # -- containers -------------------------------------------------------------------------

    def labels(self, sandbox_id: str = "") -> dict[str, str]:
        out = {**CONSOLE_MARKERS, LABEL_FAKE: "1", LABEL_RUN: self.run_id}
        if sandbox_id:
            out[LABEL_SANDBOX] = sandbox_id
        return out

    def image_exists(self, image: str) -> bool:
        try:
            self.client.images.get(image)
        except NotFound:
            return False
        return True

    def create(self, sandbox_id: str, image: str, envs: dict[str, str], mounts: Sequence[MountSpec] = ()) -> str:
        try:
            container = self.client.containers.run(
                image,
                command=["sleep", "infinity"],
                detach=True,
                name=f"fake-e2b-{sandbox_id}",
                labels=self.labels(sandbox_id),
                environment=envs,
                # No container may reach anything outside this machine.
                network_mode="none",
                dns=["127.0.0.1"],
                hostname=sandbox_id[:12],
                init=False,
                mounts=[m.docker() for m in mounts],
            )
        except APIError as e:
            raise RuntimeFailure(f"cannot start sandbox container: {e}") from e
        return str(container.id)

    def remove(self, container_id: str) -> None:
        try:
            self.api.remove_container(container_id, force=True)
        except NotFound:
            pass
        except APIError as e:
            # A paused container cannot always be force-removed on old engines; thaw first.
            if "paused" in str(e).lower():
                self.unpause(container_id)
                self.api.remove_container(container_id, force=True)
            else:
                raise

    def pause(self, container_id: str) -> None:
        self.api.pause(container_id)

    def unpause(self, container_id: str) -> None:
        try:
            self.api.unpause(container_id)
        except APIError as e:
            if "not paused" not in str(e).lower():
                raise

    def restart(self, container_id: str) -> None:
        """Cold boot: every process is gone, the filesystem stays (filesystem-only resume)."""
        self.unpause(container_id)
        self.api.restart(container_id, timeout=0)

    def commit(self, container_id: str, tag: str, env: dict[str, str] | None = None) -> str:
        """Commit the container's filesystem as an image; returns the image id. The engine
        merges ``conf`` into the container's config, so ``env`` adds to the image's Env."""
        conf: dict[str, Any] = {"Labels": self.labels()}
        if env:
            conf["Env"] = [f"{k}={v}" for k, v in env.items()]
        result = self.api.commit(container_id, repository=SNAPSHOT_REPO, tag=tag, conf=conf, pause=True)
        return str(result["Id"])

    def remove_image(self, image_id: str) -> None:
        try:
            self.api.remove_image(image_id, force=True)
        except NotFound:
            pass
        except APIError as e:
            # Still used by a sandbox started from it (or rolled back to it): the run's
            # cleanup removes it after the containers.
            if e.status_code != 409:
                raise

    # -- volumes ------------------------------------------------------------------------------

    def create_volume(self, volume_id: str) -> str:
        """A Docker named volume behind an E2B volume; returns its Docker name."""
        name = VOLUME_PREFIX + volume_id
        self.api.create_volume(name, labels={**self.labels(), LABEL_VOLUME: volume_id})
        return name

    def remove_volume(self, name: str) -> bool:
        """Remove a volume; False while a container still mounts it (try again later)."""
        try:
            self.api.remove_volume(name)
        except NotFound:
            return True
        except APIError as e:
            if e.status_code == 409:
                return False
            raise
        return True

    def cleanup_run(self) -> None:
        """Remove every container, snapshot image and volume this run created."""
        selector = {"label": [f"{LABEL_RUN}={self.run_id}"]}
        for c in self.api.containers(all=True, filters=selector):
            self.remove(c["Id"])
        for img in self.api.images(filters=selector):
            self.remove_image(img["Id"])
        for volume in self.api.volumes(filters={"label": f"{LABEL_RUN}={self.run_id}"}).get("Volumes") or []:
            with contextlib.suppress(NotFound):
                self.api.remove_volume(volume["Name"], force=True)

    # -- exec ---------------------------------------------------------------------------------

    def start_exec(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        envs: dict[str, str],
        cwd: str | None,
        tty: bool,
        stdin: bool,
    ) -> ExecHandle:
        try:
            exec_id = self.api.exec_create(
                container_id,
                argv,
                stdout=True,
                stderr=True,
                stdin=stdin or tty,
                tty=tty,
                environment=envs,
                workdir=cwd,
                user=user,
            )["Id"]
            raw = _raw_socket(self.api.exec_start(exec_id, socket=True, tty=tty))
        except APIError as e:
            raise RuntimeFailure(f"exec failed: {e.explanation or e}", _status_of(e)) from e
        handle = ExecHandle(exec_id=exec_id, sock=raw, tty=tty)
        handle.host_pid, handle.pid = self._pids(exec_id)
        return handle

    def _pids(self, exec_id: str) -> tuple[int, int]:
        """Host pid (to deliver signals) and in-container pid (what envd reports)."""
        host_pid = 0
        for _ in range(50):
            host_pid = int(self.api.exec_inspect(exec_id).get("Pid") or 0)
            if host_pid:
                break
            time.sleep(0.01)
        return host_pid, _namespaced_pid(host_pid)

    def wait_exit(self, handle: ExecHandle) -> int:
        """The exec's exit code; -1 when it cannot be known (still running after 4 s, or gone
        with its container: a kill removes the container while a process's pump still reads)."""
        for _ in range(200):
            try:
                info = self.api.exec_inspect(handle.exec_id)
            except NotFound:
                return -1
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        return -1

    def signal(self, handle: ExecHandle, signum: int) -> None:
        if handle.host_pid:
            handle.signalled = signum
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.host_pid, signum)

    def resize(self, handle: ExecHandle, cols: int, rows: int) -> None:
        self.api.exec_resize(handle.exec_id, height=rows, width=cols)

    def run_capture(
        self,
        container_id: str,
        argv: list[str],
        *,
        user: str,
        stdin: bytes | None = None,
        envs: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run to completion and collect (exit code, stdout, stderr)."""
        handle = self.start_exec(
            container_id, argv, user=user, envs=envs or {}, cwd=cwd, tty=False, stdin=stdin is not None
        )
        if stdin is not None:
            writer = threading.Thread(target=_feed, args=(handle, stdin), daemon=True)
            writer.start()
        out, err = bytearray(), bytearray()
        for stream, data in iter_frames(handle.sock, tty=False):
            (err if stream == "stderr" else out).extend(data)
        handle.sock.close()
        return self.wait_exit(handle), bytes(out), bytes(err)

    # -- files ----------------------------------------------------------------------------------

    def read_file(self, container_id: str, path: str, user: str) -> bytes:
        code, out, err = self.run_capture(container_id, ["sh", "-c", _READ_SCRIPT, "_", path], user=user)
        if code == 0:
            return out
        if code == 21:
            raise RuntimeFailure(f"path is a directory: {path}", 400)
        if code == 2:
            raise RuntimeFailure(f"file not found: {path}", 404)
        # spec/envd/envd.yaml GET /files lists 400/401/404/406/500: anything else is a 500.
        raise RuntimeFailure(_message(err, f"cannot read {path}"), 500)

    def write_file(self, container_id: str, path: str, user: str, data: bytes) -> str:
        code, out, err = self.run_capture(container_id, ["sh", "-c", _WRITE_SCRIPT, "_", path], user=user, stdin=data)
        if code != 0:
            raise RuntimeFailure(_message(err, f"cannot write {path}"), 500)
        return out.decode().strip()

    def start_watch(self, container_id: str, user: str, args: dict[str, Any]) -> ExecHandle:
        """A long-running watcher exec; its stdout is one JSON line per event."""
        return self.start_exec(
            container_id,
            ["python3", "-c", _WATCH_HELPER, json.dumps(args)],
            user=user,
            envs={},
            cwd=None,
            tty=False,
            stdin=False,
        )

    def fs_op(self, container_id: str, user: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
        code, out, err = self.run_capture(container_id, ["python3", "-c", _FS_HELPER, op, json.dumps(args)], user=user)
        try:
            result = json.loads(out.decode() or "{}")
        except ValueError:
            result = {}
        if code != 0 or not isinstance(result, dict) or not result:
            return {"error": "internal", "message": _message(err, f"{op} failed")}
        return result


def _feed(handle: ExecHandle, data: bytes) -> None:
    with contextlib.suppress(OSError):
        handle.write(data)
    handle.close_stdin()


def _message(err: bytes, fallback: str) -> str:
    text = err.decode("utf-8", "replace").strip()
    return text or fallback


def _status_of(e: APIError) -> int:
    code = e.status_code or 500
    # 409: container paused or not running; envd would be unreachable: 502.
    return 502 if code == 409 else code


def _namespaced_pid(host_pid: int) -> int:
    """The pid as seen inside the container (last NSpid entry), host pid as a fallback."""
    if not host_pid:
        return 0
    try:
        with open(f"/proc/{host_pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except OSError:
        pass
    return host_pid
