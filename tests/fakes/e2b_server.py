"""A protocol-faithful fake of the E2B control plane + envd, with a Cube personality.

Run it:  python -m tests.fakes.e2b_server --port 8080 --personality e2b|cube [--image TAG]

One HTTP/1.1 listener serves both planes. The unmodified e2b SDK reaches it with
``api_url=sandbox_url=http://127.0.0.1:<port>``: with ``sandbox_url`` set the SDK sends every
envd request to that URL with the header ``E2b-Sandbox-Id: <id>`` (protocol reference §4.1,
§4.2), so a request carrying that header (or a ``Host: 49983-<id>.<domain>``, Cube-style
routing) goes to the sandbox's envd, and everything else to the control plane.
``FakeServer.connection_options()`` returns the SDK options.

Admin endpoints (no auth), for tests:
  GET    /_fake/state                        sandboxes, processes, templates, faults
  GET    /_fake/requests                     [plane, method, path] of the last 500 requests
  DELETE /_fake/requests                     forget them
  POST   /_fake/faults                       add a fault (fake_state.Fault as JSON), or
                                             {"faults": [...]}
  DELETE /_fake/faults                       clear faults
  POST   /_fake/reset                        kill every sandbox, drop snapshots, volumes and
                                             faults
  POST   /_fake/config                       {"cube_pause_seconds": s, "resume_failures": n,
                                              "new_id_on_resume": n (the next n resumes answer a new id),
                                             "cube_pr1800": bool (serve /v2 create/connect),
                                             "missing_route": "validator"|"gin"|"proxy" (E2B),
                                             "cube_version": a release (Cube upgraded in place)}
  POST   /_fake/sandboxes/{id}/state         {"state": "pausing"|"running"} (force a state)
  POST   /_fake/sandboxes/{id}/expire        make the TTL run out now (the reaper acts)
"""

from __future__ import annotations

import argparse
import re
import signal
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes.fake_control import ControlPlane
from tests.fakes.fake_envd import Envd
from tests.fakes.fake_http import HttpError, NoRoute, Reply, Request, read_request
from tests.fakes.fake_lifecycle import Lifecycle
from tests.fakes.fake_runtime import DEFAULT_IMAGE, DockerRuntime
from tests.fakes.fake_state import (
    CUBE_RELEASES,
    CUBE_VERSION_ALIASES,
    CUBE_VERSIONS,
    E2B_API_ALIASES,
    E2B_APIS,
    LATEST_CUBE,
    MISSING_ROUTE_STYLES,
    Fault,
    Personality,
    Reaper,
    Store,
    now,
)

DEFAULT_API_KEY = "e2b_" + "0" * 40
_HOST_ROUTE = re.compile(r"^(\d+)-([a-z0-9-]+)\.")


class FakeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    app: FakeApp
    # A listener standing for an operator's reverse proxy in front of CubeProxy, which maps
    # the SDK's `E2b-Sandbox-Id` header onto `Host: 49983-<id>.<domain>` (CubeSandbox
    # examples/e2b-dev-sidecar). CubeProxy itself routes on Host only.
    sidecar: bool = False


class FakeApp:
    """Routes a parsed request to the admin API, envd or the control plane."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.life = Lifecycle(store)
        self.control = ControlPlane(store, self.life)
        self.envd = Envd(store, self.life)

    def dispatch(self, req: Request, reply: Reply, *, sidecar: bool = False) -> None:
        if req.path.startswith("/_fake/"):
            self.admin(req, reply)
            return
        sandbox_id = self._envd_target(req, sidecar=sidecar)
        plane = "envd" if sandbox_id else "api"
        with self.store.lock:
            self.store.requests = [*self.store.requests[-499:], (plane, req.method, req.path)]
        self._apply_faults(plane, req)
        if sandbox_id:
            self.envd.handle(req, reply, sandbox_id)
        else:
            self.control.handle(req, reply)

    def _envd_target(self, req: Request, *, sidecar: bool = False) -> str | None:
        # E2B's client proxy routes on the SDK's E2b-Sandbox-Id header (SDK 2.63
        # connection_config.py / sandbox_url); CubeProxy ignores that header and routes on
        # Host `<port>-<sandboxID>.<domain>` only (CubeSandbox CubeProxy, protocol ref §1).
        sandbox_id = req.header("e2b-sandbox-id")
        if sandbox_id and (sidecar or not self.store.is_cube):
            return sandbox_id
        m = _HOST_ROUTE.match(req.header("host", "") or "")
        if m and m.group(1) == "49983":
            return m.group(2)
        return None

    def _apply_faults(self, plane: str, req: Request) -> None:
        latency = self.store.take_fault(plane, req.method, req.path, ("latency",))
        if latency is not None:
            time.sleep(latency.delay)
        fault = self.store.take_fault(plane, req.method, req.path, ("status",))
        if fault is not None:
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else {}
            raise HttpError(fault.status, fault.message, headers)

    # -- admin ----------------------------------------------------------------------------------

    def admin(self, req: Request, reply: Reply) -> None:
        path, method = req.path, req.method
        if path == "/_fake/state" and method == "GET":
            reply.json(200, self.store.snapshot_state())
        elif path == "/_fake/requests" and method == "GET":
            with self.store.lock:
                reply.json(200, [list(r) for r in self.store.requests])
        elif path == "/_fake/requests" and method == "DELETE":
            with self.store.lock:
                self.store.requests = []
            reply.empty(204)
        elif path == "/_fake/faults" and method == "POST":
            body = req.json()
            specs = body.get("faults", [body]) if isinstance(body, dict) else body
            with self.store.lock:
                for spec in specs:
                    self.store.faults.append(Fault(**spec))
            reply.json(200, [f.as_dict() for f in self.store.faults])
        elif path == "/_fake/faults" and method == "DELETE":
            with self.store.lock:
                self.store.faults.clear()
            reply.empty(204)
        elif path == "/_fake/reset" and method == "POST":
            self.reset()
            reply.empty(204)
        elif path == "/_fake/config" and method == "POST":
            body = req.json()
            with self.store.lock:
                if "cube_pause_seconds" in body:
                    self.store.cube_pause_seconds = float(body["cube_pause_seconds"])
                if "resume_failures" in body:
                    self.store.resume_failures = int(body["resume_failures"])
                if "new_id_on_resume" in body:
                    self.store.new_id_on_resume = int(body["new_id_on_resume"])
                if "cube_pr1800" in body:
                    self.store.cube_pr1800 = bool(body["cube_pr1800"])
                if body.get("missing_route") in MISSING_ROUTE_STYLES:
                    self.store.missing_route = body["missing_route"]
                if self.store.is_cube and body.get("cube_version") in CUBE_VERSIONS:
                    # The cluster upgraded or rolled back in place: same address, same sandboxes.
                    self.store.cube_version = body["cube_version"]
                    self.store.release = CUBE_RELEASES[body["cube_version"]]
            reply.empty(204)
        else:
            self._admin_sandbox(req, reply)

    def _admin_sandbox(self, req: Request, reply: Reply) -> None:
        m = re.match(r"^/_fake/sandboxes/([^/]+)/(state|expire)$", req.path)
        if not m or req.method != "POST":
            raise HttpError(404, f"no admin route {req.method} {req.path}")
        sbx = self.store.get(m.group(1))
        if sbx is None:
            raise HttpError(404, "no such sandbox")
        if m.group(2) == "expire":
            # End the current TTL only: the configured length stays, so a resume re-arms it in
            # full (as E2B does) instead of a 0 s TTL that would pause the sandbox again at once.
            sbx.end_at = now()
        else:
            state = req.json().get("state")
            if state not in ("running", "pausing"):
                raise HttpError(400, "state must be running or pausing")
            sbx.state = state
        reply.empty(204)

    def reset(self) -> None:
        with self.store.lock:
            sandboxes = list(self.store.sandboxes.values())
            self.store.faults.clear()
            self.store.resume_failures = 0
            self.store.cube_pause_seconds = 0.0
        for sbx in sandboxes:
            self.life.kill(sbx)
        with self.store.lock:
            snapshot_ids = [t for t, v in self.store.templates.items() if v.kind == "snapshot"]
        for tid in snapshot_ids:
            self.life.delete_template(tid)
        self.life.volumes.drop_all()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (ConnectionError, TimeoutError):
            self.close_connection = True

    def _serve(self) -> None:
        reply = Reply(self)
        try:
            req = read_request(self)
            self.server.app.dispatch(req, reply, sidecar=self.server.sidecar)
        except HttpError as e:
            if reply.started:
                self.close_connection = True
            else:
                reply.api_error(e)
        except NoRoute as e:
            store = self.server.app.store
            reply.no_route(e, store.personality, store.missing_route)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:
            traceback.print_exc()
            if reply.started:
                self.close_connection = True
            else:
                reply.api_error(HttpError(500, f"fake server error: {e}"))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _serve


class FakeServer:
    """The fake server on a loopback port, in background threads of this process."""

    def __init__(
        self,
        personality: Personality = "e2b",
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        image: str = DEFAULT_IMAGE,
        api_key: str = DEFAULT_API_KEY,
        run_id: str | None = None,
        cube_version: str = LATEST_CUBE,
        e2b_api: str = "cloud",
    ) -> None:
        cube_version = CUBE_VERSION_ALIASES.get(cube_version, cube_version)
        e2b_api = E2B_API_ALIASES.get(e2b_api, e2b_api)
        if cube_version not in CUBE_VERSIONS or e2b_api not in E2B_APIS:
            raise ValueError(f"cube_version in {CUBE_VERSIONS}, e2b_api in {E2B_APIS}")
        self.personality = personality
        self.cube_version = cube_version
        self.e2b_api = e2b_api
        self.api_key = api_key
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.runtime = DockerRuntime(self.run_id, image)
        self.store = Store(personality, self.runtime, api_key, cube_version=cube_version, e2b_api=e2b_api)
        self.app = FakeApp(self.store)
        self.httpd = FakeHTTPServer((host, port), Handler)
        self.httpd.app = self.app
        self.sidecar: FakeHTTPServer | None = None
        if personality == "cube":
            self.sidecar = FakeHTTPServer((host, 0), Handler)
            self.sidecar.app = self.app
            self.sidecar.sidecar = True
        self.reaper = Reaper(self.app.life)
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def sandbox_url(self) -> str:
        """Where the SDK's `sandbox_url` points. E2B: the same listener (envd requests carry
        E2b-Sandbox-Id). Cube: the sidecar listener (CubeProxy routes on Host only)."""
        if self.sidecar is not None:
            return f"http://127.0.0.1:{self.sidecar.server_address[1]}"
        return self.api_url

    @property
    def proxy_url(self) -> str:
        """The data-plane address as a Cube node's CubeProxy serves it (Host-routed); for E2B
        the header-routed client proxy."""
        return self.api_url

    @property
    def domain(self) -> str:
        return "cube.app" if self.personality == "cube" else "e2b.local"

    def connection_options(self) -> dict[str, Any]:
        """Keyword arguments for e2b.Sandbox.create/connect/list/... or e2b.E2B(...)."""
        return {
            "api_key": self.api_key,
            "api_url": self.api_url,
            "sandbox_url": self.sandbox_url,
            "domain": self.domain,
        }

    def start(self) -> FakeServer:
        for httpd in (self.httpd, self.sidecar):
            if httpd is not None:
                thread = threading.Thread(target=httpd.serve_forever, name=f"fake-{self.personality}", daemon=True)
                thread.start()
                self._threads.append(thread)
        self.reaper.start()
        return self

    def stop(self) -> None:
        self.reaper.stopped.set()
        for httpd in (self.httpd, self.sidecar):
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
        try:
            self.app.reset()
        finally:
            self.runtime.cleanup_run()


def _interrupt(signum: int, frame: object) -> None:
    # Ignore repeated signals so that the cleanup in main() runs to its end.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--personality", choices=["e2b", "cube"], default="e2b")
    parser.add_argument("--cube-version", choices=list(CUBE_VERSIONS), default=LATEST_CUBE)
    parser.add_argument("--e2b-api", choices=list(E2B_APIS), default="cloud")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--api-key", default=DEFAULT_API_KEY)
    parser.add_argument("--run-id", default=None)
    args = parser.parse_args(argv)
    server = FakeServer(
        args.personality,
        host=args.host,
        port=args.port,
        image=args.image,
        api_key=args.api_key,
        run_id=args.run_id,
        cube_version=args.cube_version,
        e2b_api=args.e2b_api,
    )
    server.start()
    # `kill <pid>` (how a test or a shell stops a subprocess) cleans up like Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"fake {args.personality} listening on {server.api_url} (run {server.run_id})", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
