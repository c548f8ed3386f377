"""The data plane of E2B sandboxes: envd's URL, headers and tokens, its RPCs and streams,
exec and uploads.
"""

from __future__ import annotations

import json
import posixpath
import secrets
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import httpx

from ..base import (
    ErrorKind,
    ExecRequest,
    ExecResult,
    PtySize,
    RemoteError,
    SandboxInfo,
    SandboxState,
)
from .common import (
    _EXEC_LAUNCHER,
    _EXEC_WRAPPER,
    _FLAG_END_STREAM,
    _KILL_GROUP,
    ENVD_PORT,
    ENVD_STDIN_FLAG,
    EXEC_PID_DIRS,
    HEADER_ROUTED_DOMAINS,
    KEEPALIVE_INTERVAL_S,
    _basic_auth,
    _Envd,
    envelope,
    iter_envelopes,
    status_error,
    translating,
    transport_error,
)
from .control import E2BControlPlane
from .exec import _ExecReader


class E2BEnvd(E2BControlPlane):
    """The data plane: envd requests, RPCs, streams and exec (a part of `E2BBackend`), sent
    through the control-plane part's guarded client and retrying `_send`."""

    if TYPE_CHECKING:  # provided by E2BBackend
        domain: str
        sandbox_url: str
        _envd: dict[str, _Envd]

        def get(self, sandbox_id: str) -> SandboxInfo: ...

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
            if response.status_code < 300:
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
        pid_dir = EXEC_PID_DIRS[request.user]
        pid_file = f"{pid_dir}/.console-exec-{tag}.pid"
        in_file = ""
        if request.stdin:
            in_file = f"{pid_dir}/.console-stdin-{tag}"
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
                self._kill_group(sandbox_id, pid_file, request.user)
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

    def _kill_group(self, sandbox_id: str, pid_file: str, user: str) -> None:
        # As the command's own user: a session user's pid file (theirs to rewrite) then names
        # nothing of root's to kill.
        body = self._start_body(sandbox_id, ("/bin/sh", "-c", _KILL_GROUP, pid_file), cwd=None, env={})
        response = self.open_stream(sandbox_id, "process.Process/Start", body, "stopping a command", user=user)
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


# exec is a method of this part: `translating` wraps what a class itself defines.
translating(E2BEnvd, "exec")
