"""The sandbox router and the python runtime behind it, as the k8s-agent-sandbox client meets them.

What the fake answers is taken from kubernetes-sigs/agent-sandbox at commit
2fd412d55ecae90861a101a5424a75473de97c36:

- ``sandbox-router/proxy/headers.go``, ``proxy.go``, ``errors.go``, ``target.go`` and the
  router's README: the ``X-Sandbox-*`` header contract (ID required and a DNS-1123 label,
  namespace defaulting to ``default``, port defaulting to 8888 and within 1..65535, a pod IP
  that is a routable literal), errors as ``{"detail": ...}`` with 400 or 502, the pod IP header
  winning over the sandbox's Service, everything else proxied as is;
- ``sandbox-router/deploy/service.yaml``: the router is the Service ``sandbox-router-svc``,
  port 8080 named ``proxy``; the fake places it in ``agent-sandbox-system``, the namespace the
  client's own default (``SandboxLocalTunnelConnectionConfig.router_namespace``) names;
- ``examples/python-runtime-sandbox/main.py``: the runtime the client's HTTP calls are written
  for (``GET /``, ``POST /execute``, ``POST /upload``, ``GET /download/<path>``,
  ``GET /list/<path>``, ``GET /exists/<path>``), FastAPI's answers for unknown paths (404),
  wrong methods (405) and bodies that fail validation (422).

A client outside the cluster reaches the router through the API server's service proxy,
``/api/v1/namespaces/agent-sandbox-system/services/sandbox-router-svc:8080/proxy/<path>``, the
path ``kubectl proxy`` users take: given to the client as ``SandboxDirectConnectionConfig``
with the API server's URL, its CA and a bearer token. (The client's default, a
``kubectl port-forward`` to the router, needs a kubectl this machine's packages do not offer
at a current release.)

The runtime itself runs in the pod's Docker container: the router finds the pod (by the
``X-Sandbox-Pod-IP`` the client read from the Sandbox's ``status.podIPs``, else by the
Service named like the sandbox, which the controller makes only when the Sandbox asks for
one), checks that a container of it declares the port (the runtime listens there), and each
request runs a small Python helper in that container that does what main.py does: the same
``SANDBOX_BASE_DIR`` (default ``/app``), the same path confinement, ``shlex.split`` and no
shell, the same messages. A pod without python3 has no runtime: the router answers 502, as it
does when nothing listens on the port. The router runs as with ``--allow-loopback-pod-ip``: the
fake's pods have addresses of 127.0.0.0/8 (never dialled: the fake looks the pod up).
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import ipaddress
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web

from tests.fakes.fake_runtime import DockerRuntime
from tests.fakes.kube.errors import ApiError, not_found
from tests.fakes.kube.resources import NAMESPACES, PODS, SERVICES

ROUTER_NAMESPACE = "agent-sandbox-system"
ROUTER_SERVICE = "sandbox-router-svc"
ROUTER_PORT = 8080
ROUTER_PORT_NAME = "proxy"
ROUTER_SELECTOR = {"app.kubernetes.io/name": "sandbox-router", "app.kubernetes.io/component": "sandbox-router"}
ROUTER_SERVICE_BODY = {
    "metadata": {"name": ROUTER_SERVICE, "labels": ROUTER_SELECTOR},
    "spec": {
        "type": "ClusterIP",
        "selector": ROUTER_SELECTOR,
        "ports": [{"name": ROUTER_PORT_NAME, "port": ROUTER_PORT, "targetPort": ROUTER_PORT_NAME, "protocol": "TCP"}],
    },
}
DEFAULT_SANDBOX_NAMESPACE = "default"
DEFAULT_SANDBOX_PORT = 8888

PROXY_PATH = "/api/v1/namespaces/{namespace}/services/{service}/proxy{tail:.*}"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# Runs inside the pod's container as the container's user, with the container's environment:
# what examples/python-runtime-sandbox/main.py does for each endpoint, answered as JSON.
_RUNTIME_HELPER = r"""
import base64, json, math, os, shlex, signal, subprocess, sys

def base_dir():
    return os.environ.get("SANDBOX_BASE_DIR", "").strip() or "/app"

def safe_path(path):
    base = os.path.realpath(base_dir())
    full = os.path.realpath(os.path.join(base, path.lstrip("/")))
    if os.path.commonpath([base, full]) != base:
        raise ValueError("Access denied: Path must be within the sandbox base directory")
    return full

def exec_timeout():
    raw = os.environ.get("SANDBOX_EXEC_TIMEOUT_SECONDS", "300")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    return value if math.isfinite(value) and value > 0 else 300.0

def execute(arg):
    try:
        args = shlex.split(arg["command"])
        with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=base_dir(), start_new_session=True) as proc:
            try:
                out, err = proc.communicate(timeout=exec_timeout())
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
                except OSError:
                    pass
                proc.communicate()
                raise
        result = {"stdout": out, "stderr": err, "exit_code": proc.returncode}
    except Exception as e:
        result = {"stdout": "", "stderr": f"Failed to execute command: {e}", "exit_code": 1}
    return {"status": 200, "json": result}

def upload(name, full):
    try:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(sys.stdin.buffer.read())
        return {"status": 200, "json": {"message": f"File '{name}' uploaded successfully."}}
    except Exception as e:
        return {"status": 500, "json": {"message": f"File upload failed: {e}"}}

def download(path, full):
    if not os.path.isfile(full):
        return {"status": 404, "json": {"message": "File not found"}}
    st = os.stat(full)
    with open(full, "rb") as f:
        data = f.read()
    return {"status": 200, "file": base64.b64encode(data).decode(), "mtime": st.st_mtime, "size": st.st_size}

def listing(path, full):
    if not os.path.isdir(full):
        return {"status": 404, "json": {"message": "Path is not a directory"}}
    try:
        entries = []
        with os.scandir(full) as it:
            for entry in it:
                st = entry.stat()
                entries.append({"name": entry.name, "size": st.st_size,
                                "type": "directory" if entry.is_dir() else "file", "mod_time": st.st_mtime})
        return {"status": 200, "json": entries}
    except Exception as e:
        return {"status": 500, "json": {"message": f"List files failed: {e}"}}

def exists(path, full):
    return {"status": 200, "json": {"path": path, "exists": os.path.exists(full)}}

def confined(op, arg):
    try:
        full = safe_path(arg["path"])
    except ValueError:
        return {"status": 403, "json": {"message": "Access denied"}}
    return op(arg["path"], full)

op, arg = sys.argv[1], json.loads(sys.argv[2])
paths = {"upload": upload, "download": download, "list": listing, "exists": exists}
try:
    answer = execute(arg) if op == "execute" else confined(paths[op], arg)
except Exception:
    answer = {"status": 500, "text": "Internal Server Error"}
sys.stdout.write(json.dumps(answer))
"""


class _Unreachable(Exception):
    """Nothing answers at the resolved address: the router's 502."""


def install(cluster: Any) -> None:
    """Serve the router behind the API server's service proxy, for every method; with the
    agent-sandbox install (the CRDs), the router's namespace and Service are there too."""
    if cluster.with_crds:
        store = cluster.store
        if store.find(NAMESPACES, None, ROUTER_NAMESPACE) is None:
            labels = {"kubernetes.io/metadata.name": ROUTER_NAMESPACE}
            store.create(NAMESPACES, None, {"metadata": {"name": ROUTER_NAMESPACE, "labels": labels}})
        store.create(SERVICES, ROUTER_NAMESPACE, ROUTER_SERVICE_BODY)
    runtime = _Runtime(cluster)
    cluster.route("*", PROXY_PATH, runtime.service_proxy)


# -- the API server's service proxy ---------------------------------------------------------------


def _split_service(ref: str) -> tuple[str, str]:
    """``[scheme:]name[:port]`` as the API server reads a service proxy's name."""
    parts = ref.split(":")
    if len(parts) == 3:
        return parts[1], parts[2]
    if len(parts) == 2:
        return parts[0], parts[1]
    return ref, ""


def _service_port(service: dict[str, Any], port: str) -> dict[str, Any] | None:
    ports = (service.get("spec") or {}).get("ports") or []
    if not port:
        return ports[0] if len(ports) == 1 else None
    return next((p for p in ports if port in (p.get("name"), str(p.get("port")))), None)


def _raw_tail(request: web.Request) -> str:
    """The path after ``/proxy``, decoded once as Go's net/http does before the router sees it."""
    raw = request.rel_url.raw_path
    marker = "/proxy"
    tail = raw[raw.index(marker, raw.index("/services/")) + len(marker) :]
    return urllib.parse.unquote(tail) or "/"


# -- the router --------------------------------------------------------------------------------------


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer as FastAPI's JSONResponse renders it: compact, UTF-8, no charset."""
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json", **(headers or {})})


def _router_error(status: int, detail: str) -> web.Response:
    """proxy/errors.go WriteJSONError: Go's json.Encoder, so the body ends with a newline."""
    body = json.dumps({"detail": detail}, separators=(",", ":")).encode() + b"\n"
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json"})


def _valid_pod_ip(value: str) -> bool:
    """headers.go validPodIP with ``--allow-loopback-pod-ip``: the fake's kubelet gives pods
    addresses of 127.0.0.0/8, the case that flag exists for; the other classes stay refused."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return False
    return not (ip.is_unspecified or ip.is_link_local or ip.is_multicast)


def parse_target(headers: Any) -> tuple[dict[str, Any] | None, web.Response | None]:
    """sandbox-router/proxy/headers.go ParseSandboxHeaders: the target, or the 400 it answers."""
    sandbox_id = headers.get("X-Sandbox-ID", "")
    if not sandbox_id:
        return None, _router_error(400, "X-Sandbox-ID header is required.")
    if len(sandbox_id) > 63 or not _DNS_LABEL.match(sandbox_id):
        return None, _router_error(400, "Invalid sandbox ID format.")
    namespace = headers.get("X-Sandbox-Namespace", "") or DEFAULT_SANDBOX_NAMESPACE
    if len(namespace) > 63 or not _DNS_LABEL.match(namespace):
        return None, _router_error(400, "Invalid namespace format.")
    port = DEFAULT_SANDBOX_PORT
    raw_port = headers.get("X-Sandbox-Port", "")
    if raw_port:
        if not re.fullmatch(r"[+-]?\d+", raw_port) or not 1 <= int(raw_port) <= 65535:
            return None, _router_error(400, "Invalid port format.")
        port = int(raw_port)
    pod_ip = headers.get("X-Sandbox-Pod-IP", "")
    if pod_ip and not _valid_pod_ip(pod_ip):
        return None, _router_error(400, "Invalid target IP address.")
    return {"id": sandbox_id, "namespace": namespace, "port": port, "pod_ip": pod_ip}, None


def _declares_port(pod: dict[str, Any], port: int) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for declared in container.get("ports") or []:
            if declared.get("containerPort") == port and declared.get("protocol", "TCP") == "TCP":
                return True
    return False


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# -- the runtime -------------------------------------------------------------------------------------

Handler = Callable[[web.Request, str, str], Awaitable[web.StreamResponse]]


def _validation_error(errors: list[dict[str, Any]]) -> web.Response:
    return _json({"detail": errors}, 422)


def _execute_body(raw: bytes) -> tuple[str | None, web.Response | None]:
    """FastAPI's validation of ``ExecuteRequest`` (pydantic v2 error shapes)."""
    if not raw:
        return None, _validation_error([{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}])
    try:
        body = json.loads(raw)
    except ValueError as e:
        return None, _validation_error(
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", getattr(e, "pos", 0)],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": getattr(e, "msg", str(e))},
                }
            ]
        )
    if not isinstance(body, dict):
        return None, _validation_error(
            [
                {
                    "type": "model_attributes_type",
                    "loc": ["body"],
                    "msg": "Input should be a valid dictionary or object to extract fields from",
                    "input": body,
                }
            ]
        )
    if "command" not in body:
        return None, _validation_error(
            [{"type": "missing", "loc": ["body", "command"], "msg": "Field required", "input": body}]
        )
    if not isinstance(body["command"], str):
        return None, _validation_error(
            [
                {
                    "type": "string_type",
                    "loc": ["body", "command"],
                    "msg": "Input should be a valid string",
                    "input": body["command"],
                }
            ]
        )
    return body["command"], None


def _file_response(path: str, answer: dict[str, Any]) -> web.Response:
    """Starlette's FileResponse headers for ``filename=<the decoded path>``."""
    data = base64.b64decode(answer["file"])
    quoted = urllib.parse.quote(path)
    disposition = f"attachment; filename*=utf-8''{quoted}" if quoted != path else f'attachment; filename="{path}"'
    etag = hashlib.md5(f"{answer['mtime']}-{answer['size']}".encode(), usedforsecurity=False).hexdigest()
    headers = {
        "Content-Type": "application/octet-stream",
        "Content-Disposition": disposition,
        "Last-Modified": email.utils.formatdate(answer["mtime"], usegmt=True),
        "ETag": f'"{etag}"',
        "Accept-Ranges": "bytes",
    }
    return web.Response(body=data, headers=headers)


def _answer(path: str, answer: dict[str, Any]) -> web.Response:
    if "file" in answer:
        return _file_response(path, answer)
    if "text" in answer:
        return web.Response(status=answer["status"], text=answer["text"])
    return _json(answer["json"], answer["status"])


class _Runtime:
    """The router and, behind it, the python runtime of each pod."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self._docker: DockerRuntime | None = None

    @property
    def docker(self) -> DockerRuntime:
        if self._docker is None:
            self._docker = DockerRuntime(getattr(self.cluster, "run_id", "kube"))
        return self._docker

    # -- API server side -------------------------------------------------------------------

    async def service_proxy(self, request: web.Request) -> web.StreamResponse:
        """pkg/registry/core/service/storage: the Service, its port, then its endpoints; the only
        endpoints the fake has are the router's."""
        namespace = request.match_info["namespace"]
        name, port = _split_service(request.match_info["service"])
        service = self.cluster.store.find(SERVICES, namespace, name)
        if service is None:
            raise not_found("services", "", name)
        if _service_port(service, port) is None:
            raise ApiError(503, f'no service port "{port}" found for service "{name}"', "ServiceUnavailable")
        if (service.get("spec") or {}).get("selector") != ROUTER_SELECTOR:
            raise ApiError(503, f'no endpoints available for service "{name}"', "ServiceUnavailable")
        return await self.route(request, _raw_tail(request))

    # -- router --------------------------------------------------------------------------------

    async def route(self, request: web.Request, path: str) -> web.StreamResponse:
        target, refusal = parse_target(request.headers)
        if refusal is not None:
            return refusal
        assert target is not None
        container = self._resolve(target)
        if container is None:
            return _router_error(502, f"Could not connect to the backend sandbox: {target['id']}")
        try:
            return await self.serve(request, path, container)
        except _Unreachable:
            return _router_error(502, f"Could not connect to the backend sandbox: {target['id']}")

    def _resolve(self, target: dict[str, Any]) -> str | None:
        """The Docker container answering at the target, or None when a dial would fail."""
        store = self.cluster.store
        pods = store.items(PODS)
        pod: dict[str, Any] | None = None
        if target["pod_ip"]:
            pod = next((p for p in pods if target["pod_ip"] in _pod_ips(p)), None)
        else:
            service = store.find(SERVICES, target["namespace"], target["id"])
            selector = ((service or {}).get("spec") or {}).get("selector") or {}
            pod = next(
                (
                    p
                    for p in pods
                    if p["metadata"].get("namespace") == target["namespace"]
                    and _selects(selector, p["metadata"].get("labels") or {})
                    and _pod_ips(p)
                ),
                None,
            )
        if pod is None or (pod.get("status") or {}).get("phase") != "Running":
            return None
        if not _declares_port(pod, target["port"]):
            return None
        try:
            return str(self.cluster.pod_container(pod["metadata"]["namespace"], pod["metadata"]["name"]))
        except Exception:
            return None

    # -- runtime -------------------------------------------------------------------------------

    async def serve(self, request: web.Request, path: str, container: str) -> web.StreamResponse:
        """examples/python-runtime-sandbox/main.py's routes, as FastAPI dispatches them."""
        method = request.method
        if method == "HEAD":
            method = "GET"  # Starlette answers HEAD on every GET route
        for prefix, allowed in (("/download/", "GET"), ("/list/", "GET"), ("/exists/", "GET")):
            if path.startswith(prefix):
                if method != allowed:
                    return _json({"detail": "Method Not Allowed"}, 405, {"Allow": "GET, HEAD"})
                decoded = urllib.parse.unquote(path[len(prefix) :])
                op = {"/download/": "download", "/list/": "list", "/exists/": "exists"}[prefix]
                return _answer(decoded, await self._helper(container, op, {"path": decoded}))
        fixed = {"/": "GET", "/execute": "POST", "/upload": "POST"}
        if path not in fixed:
            return _json({"detail": "Not Found"}, 404)
        if method != fixed[path]:
            allow = "GET, HEAD" if fixed[path] == "GET" else fixed[path]
            return _json({"detail": "Method Not Allowed"}, 405, {"Allow": allow})
        if path == "/":
            return _json({"status": "ok", "message": "Sandbox Runtime is active."})
        if path == "/execute":
            command, refusal = _execute_body(await request.read())
            if refusal is not None:
                return refusal
            return _answer(path, await self._helper(container, "execute", {"command": command}))
        return await self._upload(request, container)

    async def _upload(self, request: web.Request, container: str) -> web.Response:
        missing = _validation_error(
            [{"type": "missing", "loc": ["body", "file"], "msg": "Field required", "input": None}]
        )
        if not request.content_type.startswith("multipart/form-data"):
            return missing
        reader = await request.multipart()
        while True:
            part = await reader.next()
            if part is None:
                return missing
            if isinstance(part, BodyPartReader) and part.name == "file" and part.filename is not None:
                data = await part.read()
                answer = await self._helper(container, "upload", {"path": part.filename}, stdin=bytes(data))
                return _answer("/upload", answer)

    async def _helper(self, container: str, op: str, arg: dict[str, Any], stdin: bytes = b"") -> dict[str, Any]:
        argv = ["python3", "-c", _RUNTIME_HELPER, op, json.dumps(arg)]
        code, out, _err = await asyncio.to_thread(self.docker.run_capture, container, argv, user="", stdin=stdin)
        try:
            answer = json.loads(out.decode() or "null")
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            # python3 missing (exit 126/127) or the container gone: no runtime listens.
            raise _Unreachable(f"runtime helper exited {code}")
        return answer


def _pod_ips(pod: dict[str, Any]) -> list[str]:
    status = pod.get("status") or {}
    ips = [entry.get("ip", "") for entry in status.get("podIPs") or []]
    if status.get("podIP"):
        ips.append(status["podIP"])
    return [ip for ip in ips if ip]
