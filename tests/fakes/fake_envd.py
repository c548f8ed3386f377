"""envd data plane of the fake, per sandbox: /health, /files and Connect-RPC (JSON codec) for
process.Process and filesystem.Filesystem (e2b-dev/E2B spec/envd/envd.yaml,
spec/envd/process/process.proto, spec/envd/filesystem/filesystem.proto).
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import queue
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.fake_http import (
    FLAG_END_STREAM,
    FLAG_MESSAGE,
    ConnectError,
    HttpError,
    Reply,
    Request,
    StreamDropped,
    envelope,
    parse_envelopes,
)
from tests.fakes.fake_lifecycle import Lifecycle
from tests.fakes.fake_runtime import ExecHandle, RuntimeFailure, iter_frames
from tests.fakes.fake_state import Event, FakeProcess, FakeSandbox, Store

DEFAULT_USER = "user"
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM, 9: 9, 15: 15}
SIGNAL_STATUS: dict[int, str] = {
    int(signal.SIGKILL): "signal: killed",
    int(signal.SIGTERM): "signal: terminated",
}

EnvdHandler = Callable[[Request, Reply, FakeSandbox], None]


class Envd:
    def __init__(self, store: Store, lifecycle: Lifecycle) -> None:
        self.store = store
        self.life = lifecycle
        self.runtime = store.runtime
        self.unary: dict[str, Callable[[FakeSandbox, str, dict[str, Any]], dict[str, Any]]] = {
            "/process.Process/List": self.process_list,
            "/process.Process/SendInput": self.process_send_input,
            "/process.Process/Update": self.process_update,
            "/process.Process/SendSignal": self.process_send_signal,
            "/process.Process/CloseStdin": self.process_close_stdin,
            "/filesystem.Filesystem/Stat": self.fs_simple("stat", ("path",)),
            "/filesystem.Filesystem/MakeDir": self.fs_simple("mkdir", ("path",)),
            "/filesystem.Filesystem/Move": self.fs_simple("move", ("source", "destination")),
            "/filesystem.Filesystem/ListDir": self.fs_list_dir,
            "/filesystem.Filesystem/Remove": self.fs_remove,
            "/filesystem.Filesystem/CreateWatcher": self.fs_create_watcher,
            "/filesystem.Filesystem/GetWatcherEvents": self.fs_get_watcher_events,
            "/filesystem.Filesystem/RemoveWatcher": self.fs_remove_watcher,
        }
        self.streams: dict[str, EnvdHandler] = {
            "/process.Process/Start": self.process_start,
            "/process.Process/Connect": self.process_connect,
            "/process.Process/StreamInput": self.process_stream_input,
            "/filesystem.Filesystem/WatchDir": self.fs_watch_dir,
        }

    # -- entry ----------------------------------------------------------------------------------

    def handle(self, req: Request, reply: Reply, sandbox_id: str) -> None:
        sbx = self.life.for_envd(sandbox_id)
        self._check_access_token(req, sbx)
        if req.path == "/health" and req.method == "GET":
            # spec/envd/envd.yaml: GET /health -> 204
            reply.empty(204)
            return
        if req.path == "/files":
            self._files(req, reply, sbx)
            return
        if req.method != "POST":
            raise HttpError(404, f"no envd route {req.method} {req.path}")
        user = basic_auth_user(req) or DEFAULT_USER
        if req.path in self.unary:
            self._unary(req, reply, sbx, user)
        elif req.path in self.streams:
            self.streams[req.path](req, reply, sbx)
        else:
            reply.connect_error(ConnectError("unimplemented", f"{req.path} is not implemented"))

    def _check_access_token(self, req: Request, sbx: FakeSandbox) -> None:
        # spec/envd/envd.yaml securitySchemes AccessTokenAuth: X-Access-Token, when `secure`.
        if sbx.envd_access_token and req.header("x-access-token") != sbx.envd_access_token:
            if req.path == "/health":
                return
            raise HttpError(401, "invalid or missing access token")

    def _unary(self, req: Request, reply: Reply, sbx: FakeSandbox, user: str) -> None:
        try:
            self._home(sbx, user)  # unknown user -> unauthenticated, as envd answers
            body = req.json()
            reply.json(200, self.unary[req.path](sbx, user, body))
        except ConnectError as e:
            reply.connect_error(e)
        except HttpError as e:
            reply.connect_error(ConnectError("invalid_argument", e.message))

    # -- /files -----------------------------------------------------------------------------------

    def _files(self, req: Request, reply: Reply, sbx: FakeSandbox) -> None:
        # spec/envd/envd.yaml: /files. The user comes from `username`, else basic auth.
        user = req.q("username") or basic_auth_user(req) or DEFAULT_USER
        path = req.q("path")
        try:
            self._home(sbx, user)
        except ConnectError as e:
            raise HttpError(401, e.message) from e
        try:
            if req.method == "GET":
                if not path:
                    raise HttpError(400, "path is required")
                data = self.runtime.read_file(sbx.container_id, path, user)
                reply.send(200, data, "application/octet-stream")
            elif req.method == "POST":
                reply.json(200, self._upload(req, sbx, user, path))
            else:
                raise HttpError(405, "method not allowed")
        except RuntimeFailure as e:
            raise HttpError(e.status, str(e)) from e

    def _upload(self, req: Request, sbx: FakeSandbox, user: str, path: str | None) -> list[dict[str, Any]]:
        ctype = req.header("content-type", "") or ""
        if ctype.startswith("multipart/form-data"):
            parts = parse_multipart(req.body, ctype)
            if not parts:
                raise HttpError(400, "no file part in the upload")
            files = [(path if path and len(parts) == 1 else name, data) for name, data in parts]
        elif ctype.startswith("application/octet-stream"):
            # envd >= 0.5.7 accepts a raw body; `path` is then required.
            if not path:
                raise HttpError(400, "path is required for octet-stream uploads")
            data = req.body
            if (req.header("content-encoding") or "").lower() == "gzip":
                data = gzip.decompress(data)
            files = [(path, data)]
        else:
            raise HttpError(400, f"unsupported content type {ctype!r}")
        out = []
        for name, data in files:
            if not name:
                raise HttpError(400, "missing file path")
            written = self.runtime.write_file(sbx.container_id, name, user, data)
            # spec/envd/envd.yaml: EntryInfo {path, name, type}
            out.append({"path": written, "name": written.rsplit("/", 1)[-1], "type": "file"})
        return out

    # -- process.Process unary --------------------------------------------------------------------

    def _find(self, sbx: FakeSandbox, selector: dict[str, Any]) -> FakeProcess:
        pid, tag = selector.get("pid"), selector.get("tag")
        with sbx.lock:
            for proc in sbx.processes.values():
                if (pid is not None and proc.pid == int(pid)) or (tag and proc.tag == tag):
                    return proc
        raise ConnectError("not_found", f"process with pid {pid} not found")

    def process_list(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/process/process.proto: Process.List -> ListResponse {processes[]}
        with sbx.lock:
            # protojson omits an empty repeated field.
            return omit_defaults({"processes": [p.info() for p in sbx.processes.values() if not p.finished]})

    def process_send_input(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/process/process.proto: Process.SendInput {process, input{stdin|pty}}
        proc = self._find(sbx, body.get("process") or {})
        data_in = body.get("input") or {}
        raw = data_in.get("pty") or data_in.get("stdin") or ""
        if not proc.pty and not proc.stdin_open:
            raise ConnectError("failed_precondition", "stdin is not enabled for this process")
        proc.handle.write(base64.b64decode(raw))
        return {}

    def process_update(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/process/process.proto: Process.Update {process, pty{size{cols, rows}}}
        proc = self._find(sbx, body.get("process") or {})
        size = (body.get("pty") or {}).get("size")
        if size:
            if not proc.pty:
                raise ConnectError("failed_precondition", "process has no pty")
            self.runtime.resize(proc.handle, int(size.get("cols", 80)), int(size.get("rows", 24)))
        return {}

    def process_send_signal(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/process/process.proto: Process.SendSignal {process, signal}
        proc = self._find(sbx, body.get("process") or {})
        signum = SIGNALS.get(body.get("signal", "SIGNAL_SIGKILL"))
        if signum is None:
            raise ConnectError("invalid_argument", f"unsupported signal {body.get('signal')}")
        self.runtime.signal(proc.handle, int(signum))
        return {}

    def process_close_stdin(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/process/process.proto: Process.CloseStdin (non-PTY only)
        proc = self._find(sbx, body.get("process") or {})
        if proc.pty:
            raise ConnectError("failed_precondition", "cannot close stdin of a pty; send Ctrl-D")
        proc.handle.close_stdin()
        proc.stdin_open = False
        return {}

    # -- process.Process streams ------------------------------------------------------------------

    def process_start(self, req: Request, reply: Reply, sbx: FakeSandbox) -> None:
        # spec/envd/process/process.proto: Process.Start (server stream of StartResponse)
        messages = parse_envelopes(req.body)
        body = messages[0] if messages else {}
        user = basic_auth_user(req) or DEFAULT_USER
        try:
            proc = self._spawn(sbx, user, body)
        except (RuntimeFailure, ConnectError) as e:
            code = e.code if isinstance(e, ConnectError) else "unavailable"
            reply.start_stream("application/connect+json")
            reply.chunk(envelope(FLAG_END_STREAM, {"error": {"code": code, "message": str(e)}}))
            reply.end_stream()
            return
        assert proc.initial is not None
        self._stream_process(req, reply, proc, proc.initial)

    def process_connect(self, req: Request, reply: Reply, sbx: FakeSandbox) -> None:
        # spec/envd/process/process.proto: Process.Connect (reattach, no replay)
        messages = parse_envelopes(req.body)
        selector = (messages[0] if messages else {}).get("process") or {}
        try:
            proc = self._find(sbx, selector)
        except ConnectError as e:
            reply.start_stream("application/connect+json")
            reply.chunk(envelope(FLAG_END_STREAM, {"error": {"code": e.code, "message": e.message}}))
            reply.end_stream()
            return
        self._stream_process(req, reply, proc, proc.subscribe())

    def process_stream_input(self, req: Request, reply: Reply, sbx: FakeSandbox) -> None:
        # spec/envd/process/process.proto: Process.StreamInput (client stream): start{process},
        # then data{input}; answered once the client closes its side.
        proc: FakeProcess | None = None
        error: dict[str, str] | None = None
        for msg in parse_envelopes(req.body):
            try:
                if "start" in msg:
                    proc = self._find(sbx, msg["start"].get("process") or {})
                elif "data" in msg and proc is not None:
                    raw = (msg["data"].get("input") or {}).get("stdin") or (msg["data"].get("input") or {}).get(
                        "pty", ""
                    )
                    proc.handle.write(base64.b64decode(raw))
            except ConnectError as e:
                error = {"code": e.code, "message": e.message}
                break
        reply.start_stream("application/connect+json")
        if error is None:
            reply.chunk(envelope(FLAG_MESSAGE, {}))
        reply.chunk(envelope(FLAG_END_STREAM, {"error": error} if error else {}))
        reply.end_stream()

    def _spawn(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> FakeProcess:
        config = body.get("process") or {}
        cmd = config.get("cmd")
        if not cmd:
            raise ConnectError("invalid_argument", "process.cmd is required")
        argv = [cmd, *list(config.get("args") or [])]
        pty_size = (body.get("pty") or {}).get("size") if body.get("pty") is not None else None
        is_pty = body.get("pty") is not None
        # envd < 0.3.0 has no stdin flag and keeps stdin open; newer envd closes it unless asked.
        stdin_open = bool(body.get("stdin", True)) and not is_pty
        home = self._home(sbx, user)
        cwd = config.get("cwd") or home
        handle = self.runtime.start_exec(
            sbx.container_id,
            argv,
            user=user,
            envs=dict(config.get("envs") or {}),
            cwd=cwd,
            tty=is_pty,
            stdin=stdin_open,
        )
        if is_pty and pty_size:
            self.runtime.resize(handle, int(pty_size.get("cols", 80)), int(pty_size.get("rows", 24)))
        proc = FakeProcess(
            pid=handle.pid or self.store.allocate_pid(),
            config={
                "cmd": cmd,
                "args": argv[1:],
                "envs": dict(config.get("envs") or {}),
                **({"cwd": config["cwd"]} if config.get("cwd") else {}),
            },
            handle=handle,
            tag=body.get("tag"),
            pty=is_pty,
            stdin_open=stdin_open,
        )
        # The Start stream subscribes before the reader runs, so it sees every byte.
        proc.initial = proc.subscribe()
        with sbx.lock:
            sbx.processes[proc.pid] = proc
        threading.Thread(target=self._pump, args=(sbx, proc), name=f"fake-envd-{proc.pid}", daemon=True).start()
        return proc

    def _home(self, sbx: FakeSandbox, user: str) -> str:
        """The user's home (default cwd, base of relative paths); cached per sandbox.
        An unknown user is `unauthenticated` (envd: 401 "invalid username")."""
        if user not in sbx.homes:
            result = self.runtime.fs_op(sbx.container_id, user, "home", {})
            if "ok" not in result:
                raise ConnectError("unauthenticated", f"invalid username: '{user}'")
            sbx.homes[user] = str(result["ok"])
        return sbx.homes[user]

    def _pump(self, sbx: FakeSandbox, proc: FakeProcess) -> None:
        """Read the exec socket until EOF, fan events out, then publish the end event."""
        try:
            for stream, data in iter_frames(proc.handle.sock, proc.pty):
                proc.publish(Event("data", stream=stream, data=data))
        except OSError:
            pass
        code = self.runtime.wait_exit(proc.handle)
        if proc.handle.signalled:
            end = Event(
                "end",
                exit_code=-1,
                exited=False,
                status=SIGNAL_STATUS.get(proc.handle.signalled, "signal"),
            )
        else:
            end = Event("end", exit_code=code, exited=True, status=f"exit status {code}")
        proc.publish(end)
        with sbx.lock:
            sbx.processes.pop(proc.pid, None)
        with contextlib.suppress(OSError):
            proc.handle.sock.close()

    def _stream_process(self, req: Request, reply: Reply, proc: FakeProcess, events: queue.Queue[Event]) -> None:
        """Write the ProcessEvent stream: start, data..., end, then the end-stream envelope."""
        writer = _StreamWriter(self.store, req, reply)
        try:
            writer.message({"event": {"start": {"pid": proc.pid}}})
            while True:
                event = writer.next_event(events)
                if event is None:
                    return  # deadline: end envelope already written
                if event.kind == "data":
                    b64 = base64.b64encode(event.data).decode()
                    writer.message({"event": {"data": {event.stream: b64}}})
                    continue
                # process.proto ProcessEvent.EndEvent {exit_code sint32, exited bool, status,
                # error?}, printed by connect-go's protojson: fields at their default (exit 0,
                # exited false, "") are omitted, so a signal death has no `exited` at all.
                end = omit_defaults(
                    {
                        "exitCode": event.exit_code,
                        "exited": event.exited,
                        "status": event.status,
                        "error": "" if event.exited else event.status,
                    }
                )
                writer.message({"event": {"end": end}})
                writer.finish()
                return
        except StreamDropped:
            reply.drop()
        except OSError:
            pass  # the client went away; the process keeps running (envd semantics)
        finally:
            proc.unsubscribe(events)

    # -- filesystem.Filesystem ------------------------------------------------------------------

    def _fs(self, sbx: FakeSandbox, user: str, op: str, args: dict[str, Any]) -> Any:
        result = self.runtime.fs_op(sbx.container_id, user, op, args)
        if "error" in result:
            raise ConnectError(str(result["error"]), str(result.get("message", "")))
        return result.get("ok")

    def fs_simple(
        self, op: str, fields: tuple[str, ...]
    ) -> Callable[[FakeSandbox, str, dict[str, Any]], dict[str, Any]]:
        # spec/envd/filesystem/filesystem.proto: Stat/MakeDir/Move -> {entry: EntryInfo}
        def handler(sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
            args = {f: body.get(f, "") for f in fields}
            return {"entry": self._fs(sbx, user, op, args)}

        return handler

    def fs_list_dir(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/filesystem/filesystem.proto: Filesystem.ListDir {path, depth} -> {entries[]}
        args = {"path": body.get("path", ""), "depth": body.get("depth", 1)}
        return omit_defaults({"entries": self._fs(sbx, user, "list", args)})

    def fs_remove(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/filesystem/filesystem.proto: Filesystem.Remove {path} -> {}
        self._fs(sbx, user, "remove", {"path": body.get("path", "")})
        return {}

    # -- directory watchers -------------------------------------------------------------------

    def _start_watcher(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> Watcher:
        args = {
            "path": body.get("path", ""),
            "recursive": bool(body.get("recursive")),
            "includeEntry": bool(body.get("includeEntry") or body.get("include_entry")),
        }
        handle = self.runtime.start_watch(sbx.container_id, user, args)
        lines = _json_lines(handle)
        first = next(lines, None) or {"error": "internal", "message": "watcher did not start"}
        if "error" in first:
            self._stop_watch_exec(handle)
            raise ConnectError(str(first["error"]), str(first.get("message", "")))
        watcher = Watcher(watcher_id=secrets.token_hex(8), handle=handle)
        threading.Thread(target=watcher.pump, args=(lines,), daemon=True).start()
        return watcher

    def _stop_watch_exec(self, handle: ExecHandle) -> None:
        self.runtime.signal(handle, int(signal.SIGKILL))
        handle.sock.close()

    def fs_create_watcher(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/filesystem/filesystem.proto: Filesystem.CreateWatcher -> {watcherId}
        watcher = self._start_watcher(sbx, user, body)
        with sbx.lock:
            sbx.watchers[watcher.watcher_id] = watcher
        return {"watcherId": watcher.watcher_id}

    def _watcher(self, sbx: FakeSandbox, body: dict[str, Any]) -> Watcher:
        wid = body.get("watcherId") or body.get("watcher_id") or ""
        watcher = sbx.watchers.get(wid)
        if watcher is None:
            raise ConnectError("not_found", f"watcher {wid} not found")
        assert isinstance(watcher, Watcher)
        return watcher

    def fs_get_watcher_events(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/filesystem/filesystem.proto: Filesystem.GetWatcherEvents -> {events[]}
        return {"events": self._watcher(sbx, body).drain()}

    def fs_remove_watcher(self, sbx: FakeSandbox, user: str, body: dict[str, Any]) -> dict[str, Any]:
        # spec/envd/filesystem/filesystem.proto: Filesystem.RemoveWatcher -> {}
        watcher = self._watcher(sbx, body)
        with sbx.lock:
            sbx.watchers.pop(watcher.watcher_id, None)
        self._stop_watch_exec(watcher.handle)
        return {}

    def fs_watch_dir(self, req: Request, reply: Reply, sbx: FakeSandbox) -> None:
        # spec/envd/filesystem/filesystem.proto: Filesystem.WatchDir (server stream of
        # WatchDirResponse: start{}, then filesystem{name, type, entry?}, keepalive{}).
        messages = parse_envelopes(req.body)
        user = basic_auth_user(req) or DEFAULT_USER
        try:
            watcher = self._start_watcher(sbx, user, messages[0] if messages else {})
        except ConnectError as e:
            reply.start_stream("application/connect+json")
            reply.chunk(envelope(FLAG_END_STREAM, {"error": {"code": e.code, "message": e.message}}))
            reply.end_stream()
            return
        writer = _StreamWriter(self.store, req, reply, keepalive_message={"keepalive": {}})
        try:
            writer.message({"start": {}})
            while True:
                event = writer.next_event(watcher.queue)
                if event is None:
                    return
                writer.message({"filesystem": event})
        except StreamDropped:
            reply.drop()
        except OSError:
            pass
        finally:
            self._stop_watch_exec(watcher.handle)


@dataclass
class Watcher:
    """A directory watcher: a polling exec in the container, its events buffered here."""

    watcher_id: str
    handle: ExecHandle
    queue: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)

    def pump(self, lines: Iterator[dict[str, Any]]) -> None:
        for event in lines:
            self.queue.put(event)

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                return out


def _json_lines(handle: ExecHandle) -> Iterator[dict[str, Any]]:
    buffer = b""
    try:
        for stream, data in iter_frames(handle.sock, tty=False):
            if stream != "stdout":
                continue
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line)
    except OSError:
        return


class _StreamWriter:
    """Connect server-stream writer honouring Connect-Timeout-Ms, Keepalive-Ping-Interval and
    the drop_stream fault."""

    def __init__(
        self,
        store: Store,
        req: Request,
        reply: Reply,
        keepalive_message: dict[str, Any] | None = None,
    ) -> None:
        self.reply = reply
        self.keepalive_message = keepalive_message or {"event": {"keepalive": {}}}
        self.sent = 0
        timeout_ms = req.header("connect-timeout-ms")
        self.deadline = time.monotonic() + int(timeout_ms) / 1000 if timeout_ms else None
        interval = req.header("keepalive-ping-interval")
        self.keepalive = float(interval) if interval else None
        self.drop_after: int | None = None
        fault = store.take_fault("envd", req.method, req.path, ("drop_stream",))
        if fault is not None:
            self.drop_after = fault.after_events
        reply.start_stream("application/connect+json")

    def message(self, payload: dict[str, Any]) -> None:
        if self.drop_after is not None and self.sent >= self.drop_after:
            raise StreamDropped
        self.reply.chunk(envelope(FLAG_MESSAGE, payload))
        self.sent += 1

    def finish(self, error: dict[str, str] | None = None) -> None:
        self.reply.chunk(envelope(FLAG_END_STREAM, {"error": error} if error else {}))
        self.reply.end_stream()

    def next_event(self, events: queue.Queue[Any]) -> Any:
        last = time.monotonic()
        while True:
            wait = 0.5
            t = time.monotonic()
            if self.deadline is not None:
                if t >= self.deadline:
                    self.finish({"code": "deadline_exceeded", "message": "deadline exceeded"})
                    return None
                wait = min(wait, self.deadline - t)
            if self.keepalive is not None:
                if t - last >= self.keepalive:
                    self.message(self.keepalive_message)
                    last = t
                wait = min(wait, max(0.01, self.keepalive - (t - last)))
            try:
                return events.get(timeout=max(0.01, wait))
            except queue.Empty:
                continue


def omit_defaults(message: dict[str, Any]) -> dict[str, Any]:
    """proto3 JSON as protojson prints it (EmitUnpopulated off): scalar fields at their
    default (0, false, "") and empty repeated/map fields are left out. Only for flat
    messages: an empty sub-message ({}) is a set field and stays."""
    return {k: v for k, v in message.items() if v not in (0, False, "", None, [])}


def basic_auth_user(req: Request) -> str | None:
    auth = req.header("authorization") or ""
    if not auth.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(auth[6:].strip()).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return decoded.split(":", 1)[0] or None


_BOUNDARY = re.compile(r'boundary="?([^";]+)"?')
_DISPOSITION_FILENAME = re.compile(r'filename="((?:[^"\\]|\\.)*)"')


def parse_multipart(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """(filename, data) of each part of a multipart/form-data body (binary safe)."""
    m = _BOUNDARY.search(content_type)
    if not m:
        raise HttpError(400, "multipart body without boundary")
    delimiter = b"--" + m.group(1).encode()
    out: list[tuple[str, bytes]] = []
    for part in body.split(delimiter)[1:]:
        if part.startswith(b"--"):
            break
        head, sep, data = part.partition(b"\r\n\r\n")
        if not sep:
            continue
        if data.endswith(b"\r\n"):
            data = data[:-2]
        fn = _DISPOSITION_FILENAME.search(head.decode("utf-8", "replace"))
        out.append((fn.group(1).replace('\\"', '"') if fn else "", data))
    return out
