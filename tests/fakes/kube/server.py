"""The fake's HTTP side: an aiohttp app on a loopback port in a thread of its own.

Routes every `/api` and `/apis` request as the apiserver does: bearer authentication (401),
the request's attributes from its path (k8s.io/apiserver RequestInfoFactory), RBAC (403), then
discovery, the reviews, metrics, or the generic object handlers (create / get / list / watch /
update / patch / delete on the store, `status` and `scale` subresources). Every refusal is a
metav1.Status. Extension modules (`EXTENSIONS`: exec, the sandbox runtime) add their routes
with `install(cluster)` before the app starts; their routes pass through the same
authentication and RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.fakes.kube import rbac
from tests.fakes.kube.errors import ApiError, bad_request, method_not_allowed, no_such_path, status_body
from tests.fakes.kube.patching import apply_patch
from tests.fakes.kube.resources import VERSION, Resource
from tests.fakes.kube.selection import field_matcher, label_matcher
from tests.fakes.kube.store import Event

if TYPE_CHECKING:
    from tests.fakes.kube.cluster import FakeCluster

log = logging.getLogger(__name__)

# Modules whose `install(cluster)` adds routes (imported only if present).
EXTENSIONS = ["tests.fakes.kube.exec", "tests.fakes.kube.runtime"]
MAX_HEADER_BYTES = 1 << 20  # Go net/http DefaultMaxHeaderBytes

# What handlers find on the app and on each request (extensions too).
CLUSTER: web.AppKey[Any] = web.AppKey("cluster", object)
SUBJECT = web.RequestKey("subject", rbac.Subject)
ATTRIBUTES = web.RequestKey("attributes", rbac.Attributes)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC_PATHS = ("/version", "/version/", "/healthz", "/livez", "/readyz")
NAMESPACE_SUBRESOURCES = ("status", "finalize")
VERB_BY_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def parse_attributes(method: str, path: str, query: dict[str, str]) -> rbac.Attributes:
    """The authorizer attributes of a request (k8s.io/apiserver/pkg/endpoints/request)."""
    parts = [p for p in path.split("/") if p]
    lowered = method.upper()
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        verb = lowered.lower() if lowered != "GET" else "get"
        return rbac.Attributes(verb=verb, path=path)
    if not rest:
        return rbac.Attributes(verb="get", path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if lowered == "GET":
        verb = "get" if name else ("watch" if _truthy(query.get("watch")) else "list")
    elif lowered == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = VERB_BY_METHOD.get(lowered, lowered.lower())
    if subresource in ("exec", "attach", "portforward"):
        verb = "create"  # a websocket GET needs `create` on pods/exec since 1.31
    return rbac.Attributes(
        verb=verb,
        path=path,
        resource_request=True,
        group=group,
        version=version,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


def status_response(error: ApiError) -> web.Response:
    return web.json_response(error.body, status=error.code)


@dataclass
class ExtraRoute:
    method: str
    path: str
    handler: Handler
    public: bool


class ApiServer:
    """The aiohttp app of one FakeCluster, served from a background thread."""

    def __init__(self, cluster: FakeCluster, ssl_context: ssl.SSLContext | None) -> None:
        self.cluster = cluster
        self.ssl_context = ssl_context
        self.extra: list[ExtraRoute] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._watch_tasks: set[asyncio.Task[Any]] = set()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._public: set[tuple[str, str]] = set()
        # Requests answered, by "METHOD /path" (a test counts what a page asks of the cluster).
        self.served: Counter[str] = Counter()

    # -- lifecycle ------------------------------------------------------------------------------

    def add_route(self, method: str, path: str, handler: Handler, public: bool = False) -> None:
        if self._runner is not None:
            raise RuntimeError("routes are added before the fake cluster starts (in an extension's install)")
        self.extra.append(ExtraRoute(method.upper(), path, handler, public))

    def install_extensions(self) -> None:
        for module_name in EXTENSIONS:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name != module_name:
                    raise
                continue
            module.install(self.cluster)

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors, self._authorize], client_max_size=64 * 1024 * 1024)
        app[CLUSTER] = self.cluster
        for route in self.extra:
            resource_route = app.router.add_route(route.method, route.path, route.handler)
            if route.public:
                self._public.add(
                    (route.method, resource_route.resource.canonical if resource_route.resource else route.path)
                )
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)
        for probe in ("/healthz", "/livez", "/readyz"):
            app.router.add_get(probe, self._ok)
        app.router.add_route("*", "/api", self._api)
        app.router.add_route("*", "/api/{tail:.*}", self._api)
        app.router.add_route("*", "/apis", self._api)
        app.router.add_route("*", "/apis/{tail:.*}", self._api)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        return app

    def start(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            asyncio.set_event_loop(loop)
            try:
                self._runner = web.AppRunner(
                    self._app(),
                    access_log=None,
                    handle_signals=False,
                    shutdown_timeout=0.5,
                    # The API server is Go's net/http: request line and headers share its 1 MiB
                    # (DefaultMaxHeaderBytes), so a pods/exec URL carrying a long script passes
                    # there; aiohttp's own default (8190 bytes a line) would refuse it with 400.
                    max_line_size=MAX_HEADER_BYTES,
                    max_field_size=MAX_HEADER_BYTES,
                )
                loop.run_until_complete(self._runner.setup())
                site = web.SockSite(self._runner, self._sock, ssl_context=self.ssl_context)
                loop.run_until_complete(site.start())
            except BaseException as exc:  # surfaced to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name=f"fake-kube-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]

    def stop(self) -> None:
        loop = self.loop
        if loop is None or self._thread is None:
            return

        def shutdown() -> None:
            for task in list(self._watch_tasks):
                task.cancel()
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        self._thread.join(10)

    # -- middlewares ----------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.served[f"{request.method} {request.path}"] += 1
        try:
            return await handler(request)
        except ApiError as exc:
            return status_response(exc)
        except web.HTTPException:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the fake: still a Status, never a bare 500 page
            log.exception("fake kube-apiserver: %s %s failed", request.method, request.path)
            return web.json_response(status_body(500, f"Internal error occurred: {exc}", "InternalError"), status=500)

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS or self._is_public(request):
            return await handler(request)
        subject = self.cluster.authorizer.authenticate(request.headers.get("Authorization"))
        attributes = parse_attributes(request.method, request.path, dict(request.query))
        self.cluster.authorizer.check(subject, attributes)
        request[SUBJECT] = subject
        request[ATTRIBUTES] = attributes
        return await handler(request)

    def _is_public(self, request: web.Request) -> bool:
        info = request.match_info.route.resource
        canonical = info.canonical if info is not None else ""
        return (request.method, canonical) in self._public

    # -- handlers -------------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response(VERSION)

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _not_found(self, request: web.Request) -> web.Response:
        raise no_such_path()

    async def _api(self, request: web.Request) -> web.StreamResponse:
        a = request[ATTRIBUTES]
        catalog = self.cluster.catalog
        if not a.resource_request:
            document = self._discovery(request.path)
            if document is None:
                raise no_such_path()
            return web.json_response(document)
        resource = catalog.find(a.group, a.version, a.resource)
        if resource is None:
            raise no_such_path()
        special = self.cluster.handlers.get(resource.key)
        if special is not None:
            return await special(request, resource, a)
        if not resource.stored:
            raise no_such_path()
        return await self._objects(request, resource, a)

    def _discovery(self, path: str) -> dict[str, Any] | None:
        catalog = self.cluster.catalog
        parts = [p for p in path.split("/") if p]
        if parts == ["api"]:
            return catalog.api_versions()
        if parts == ["apis"]:
            return catalog.api_group_list()
        if len(parts) == 2 and parts[0] == "api":
            return catalog.resource_list("", parts[1])
        if len(parts) == 2 and parts[0] == "apis":
            return catalog.api_group(parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            return catalog.resource_list(parts[1], parts[2])
        return None

    async def _objects(self, request: web.Request, resource: Resource, a: rbac.Attributes) -> web.StreamResponse:
        store = self.cluster.store
        namespace = a.namespace or None
        if resource.plural == "namespaces" and not resource.group:
            namespace = None
        if a.subresource and a.subresource not in resource.subresources:
            raise no_such_path()
        if not resource.namespaced and a.namespace and resource.plural != "namespaces":
            raise no_such_path()
        if a.verb not in resource.verbs and a.verb not in ("get",):
            raise method_not_allowed(request.method)
        query = request.query
        if a.verb in ("list", "watch"):
            matches_labels = label_matcher(query.get("labelSelector"))
            matches_fields = field_matcher(query.get("fieldSelector"), resource.plural, resource.kind)

            def matches(obj: dict[str, Any]) -> bool:
                return matches_labels(obj) and matches_fields(obj)

            if a.verb == "watch":
                return await self._watch(request, resource, namespace, matches)
            return web.json_response(self._list(resource, namespace, matches, query))
        if a.verb == "get":
            obj = store.get(resource, namespace, a.name)
            return web.json_response(self._shaped(resource, obj, a.subresource))
        if a.verb == "create":
            body = await self._object_body(request)
            dry_run = query.get("dryRun") == "All"
            created = store.create(resource, namespace, body, dry_run=dry_run)
            return web.json_response(created, status=201)
        if a.verb == "update":
            body = await self._object_body(request)
            if a.subresource == "scale":
                replicas = (body.get("spec") or {}).get("replicas", 0)
                obj = store.mutate(resource, namespace, a.name, lambda o: _set_replicas(o, replicas))
                return web.json_response(self._shaped(resource, obj, "scale"))
            obj = store.update(resource, namespace, a.name, body, subresource=a.subresource or None)
            return web.json_response(obj)
        if a.verb == "patch":
            body = await self._body(request)
            content_type = request.headers.get("Content-Type", "")
            custom = resource.group in self.cluster.custom_groups
            if a.subresource == "scale":
                current = self._shaped(resource, store.get(resource, namespace, a.name), "scale")
                replicas = apply_patch(content_type, current, body, custom=custom).get("spec", {}).get("replicas", 0)
                obj = store.mutate(resource, namespace, a.name, lambda o: _set_replicas(o, replicas))
                return web.json_response(self._shaped(resource, obj, "scale"))
            obj = store.mutate(
                resource,
                namespace,
                a.name,
                lambda current: apply_patch(content_type, current, body, custom=custom),
                subresource=a.subresource or None,
            )
            return web.json_response(obj)
        if a.verb == "delete":
            options = await self._body(request, optional=True)
            propagation = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
            preconditions = options.get("preconditions") or {}
            gone = store.delete(
                resource,
                namespace,
                a.name,
                propagation=propagation,
                precondition_rv=preconditions.get("resourceVersion"),
                precondition_uid=preconditions.get("uid"),
            )
            if resource.plural == "pods" or gone["metadata"].get("deletionTimestamp"):
                return web.json_response(gone)
            return web.json_response(_success(resource, gone))
        if a.verb == "deletecollection":
            matches_labels = label_matcher(query.get("labelSelector"))
            for obj in store.items(resource, namespace, matches_labels):
                with contextlib.suppress(ApiError):
                    store.delete(resource, obj["metadata"].get("namespace"), obj["metadata"]["name"])
            return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        raise method_not_allowed(request.method)

    def _shaped(self, resource: Resource, obj: dict[str, Any], subresource: str) -> dict[str, Any]:
        if subresource != "scale":
            return obj
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: obj["metadata"][k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in obj["metadata"]
            },
            "spec": {"replicas": obj.get("spec", {}).get("replicas", 0)},
            "status": {
                "replicas": (obj.get("status") or {}).get("replicas", 0),
                "selector": (obj.get("status") or {}).get("selector", ""),
            },
        }

    def _list(self, resource: Resource, namespace: str | None, matches: Any, query: Any) -> dict[str, Any]:
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise bad_request(f"invalid limit: {query.get('limit')!r}") from None
        page = self.cluster.store.list(
            resource,
            namespace,
            matches,
            limit=max(limit, 0),
            continue_token=query.get("continue") or None,
            selective=bool(query.get("labelSelector") or query.get("fieldSelector")),
        )
        meta: dict[str, Any] = {"resourceVersion": page.resource_version}
        if page.continue_token:
            meta["continue"] = page.continue_token
        if page.remaining is not None:
            meta["remainingItemCount"] = page.remaining
        return {"kind": resource.list_kind, "apiVersion": resource.api_version, "metadata": meta, "items": page.items}

    async def _object_body(self, request: web.Request) -> dict[str, Any]:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise bad_request("the server rejected our request due to an error in our request: body is not an object")
        return body

    async def _body(self, request: web.Request, optional: bool = False) -> dict[str, Any]:
        raw = await request.read()
        if not raw.strip():
            if optional:
                return {}
            raise bad_request("the server rejected our request due to an error in our request: empty body")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            if request.headers.get("Content-Type", "").startswith("application/apply-patch+yaml"):
                import yaml

                body = yaml.safe_load(raw)
            else:
                raise bad_request(f"the server rejected our request due to an error in our request: {exc}") from None
        if not isinstance(body, dict | list):
            raise bad_request("the server rejected our request due to an error in our request: body is not an object")
        return body  # type: ignore[return-value]

    async def _watch(
        self, request: web.Request, resource: Resource, namespace: str | None, matches: Any
    ) -> web.StreamResponse:
        query = request.query
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        try:
            timeout = float(query.get("timeoutSeconds") or 1800)
        except ValueError:
            raise bad_request(f"invalid timeoutSeconds: {query.get('timeoutSeconds')!r}") from None
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()

        def deliver(event: Event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, event)

        try:
            stop = self.cluster.store.watch(resource, namespace, query.get("resourceVersion"), matches, deliver)
        except ApiError as exc:
            if exc.code != 410:
                raise
            await response.prepare(request)
            await response.write(json.dumps({"type": "ERROR", "object": exc.body}).encode() + b"\n")
            await response.write_eof()
            return response
        await response.prepare(request)
        task = asyncio.current_task()
        if task is not None:
            self._watch_tasks.add(task)
        deadline = loop.time() + timeout
        last_rv = self.cluster.store.resource_version
        try:
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                wait = min(remaining, self.cluster.bookmark_seconds) if bookmarks else remaining
                try:
                    event = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    if bookmarks:
                        last_rv = max(last_rv, self.cluster.store.resource_version)
                        await response.write(_bookmark(resource, last_rv))
                    continue
                if event is None:
                    break
                last_rv = max(last_rv, event.rv)
                line = json.dumps({"type": event.type, "object": event.obj})
                await response.write(line.encode() + b"\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            stop()
            if task is not None:
                self._watch_tasks.discard(task)
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()
        return response


def _bookmark(resource: Resource, rv: int) -> bytes:
    obj = {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": {"resourceVersion": str(rv)}}
    return json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n"


def _set_replicas(obj: dict[str, Any], replicas: Any) -> dict[str, Any]:
    obj.setdefault("spec", {})["replicas"] = replicas
    return obj


def _success(resource: Resource, gone: dict[str, Any]) -> dict[str, Any]:
    details: dict[str, Any] = {
        "name": gone["metadata"]["name"],
        "kind": resource.plural,
        "uid": gone["metadata"]["uid"],
    }
    if resource.group:
        details["group"] = resource.group
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
