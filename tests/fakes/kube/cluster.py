"""`FakeCluster`: one fake Kubernetes cluster (API server, store, controllers, kubelet) and
`running_fake_cluster`, which starts one and tears it down, containers and volumes included.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import yaml
from aiohttp import web

from tests.fakes.kube import core, crds, metrics, rbac
from tests.fakes.kube.certs import generate
from tests.fakes.kube.controller import start_controllers
from tests.fakes.kube.pods import Kubelet, start_kubelet
from tests.fakes.kube.resources import BUILTIN, CRDS, NAMESPACES, SSAR, SSRR, Catalog, Resource
from tests.fakes.kube.server import SUBJECT, ApiServer
from tests.fakes.kube.store import Store

SpecialHandler = Callable[[web.Request, Resource, rbac.Attributes], Awaitable[web.StreamResponse]]
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class FakeCluster:
    """A fake cluster; build it with `running_fake_cluster()`."""

    def __init__(
        self,
        *,
        tls: bool = True,
        with_crds: bool = True,
        run_id: str | None = None,
        history_size: int = 1000,
        docker_pods: bool = True,
    ) -> None:
        self.run_id = run_id or f"kube-{uuid.uuid4().hex[:10]}"
        self.with_crds = with_crds
        self.bookmark_seconds = 1.0
        self.store = Store(history_size=history_size)
        self.catalog = Catalog()
        self.authorizer = rbac.Authorizer()
        self.admin_token = self.authorizer.issue(rbac.ALL, user="kubernetes-admin")
        self.handlers: dict[tuple[str, str], SpecialHandler] = {}
        self.docker_pods = docker_pods
        self.custom_groups = {crds.CORE_GROUP, crds.EXT_GROUP}
        self._certs = generate() if tls else None
        self.ca_pem: str = self._certs.ca_pem if self._certs else ""
        self.server = ApiServer(self, self._certs.server_context() if self._certs else None)
        scheme = "https" if tls else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.port}"
        self._stoppers: list[Callable[[], None]] = []
        self.kubelet: Kubelet | None = None
        self._setup()

    # -- the interface other tests use ------------------------------------------------------------

    def token_with(self, rules: list[dict[str, Any]], *, namespace: str | None = None, user: str | None = None) -> str:
        """A bearer token bound to these PolicyRules (cluster-wide, or in `namespace` as a Role)."""
        return self.authorizer.issue(rules, user=user, namespace=namespace)

    def kubeconfig(self, token: str | None = None, namespace: str = "default") -> str:
        cluster: dict[str, Any] = {"server": self.url}
        if self.ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem.encode()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake-user", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake-user", "namespace": namespace}}],
            "current-context": "fake",
            "preferences": {},
        }
        return yaml.safe_dump(config, sort_keys=False)

    def route(
        self,
        method: str,
        path: str,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        *,
        public: bool = False,
    ) -> None:
        """An extra aiohttp route (before the start: from an extension's `install(cluster)`).
        It passes through bearer authentication and RBAC unless `public`."""
        self.server.add_route(method, path, handler, public)

    def compact(self) -> None:
        """Forget the event history now: every older resourceVersion is 410 from here on."""
        self.store.compact()

    def pod_container(self, namespace: str, pod: str) -> str:
        """The Docker container id backing a pod (KeyError when it has none yet)."""
        if self.kubelet is None:
            raise KeyError(f"{namespace}/{pod}: this cluster runs no pods")
        return self.kubelet.container_of(namespace, pod)

    # -- setup ----------------------------------------------------------------------------------

    def _setup(self) -> None:
        self.catalog.add(BUILTIN)
        for resource in BUILTIN:
            if resource.stored:
                self.store.register(resource)
        self.store.add_validator(crds.validate)
        self.store.add_validator(core.admit)
        for name in INITIAL_NAMESPACES:
            self.store.create(
                NAMESPACES, None, {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}
            )
        if self.with_crds:
            self.install_crds()
        self.handlers[SSAR.key] = self._access_review
        self.handlers[SSRR.key] = self._rules_review
        metrics.install(self)

    def install_crds(self) -> None:
        self.catalog.add(crds.RESOURCES)
        for resource in crds.RESOURCES:
            self.store.register(resource)
            self.store.create(CRDS, None, crds.definition(resource))

    async def _access_review(self, request: web.Request, resource: Resource, a: rbac.Attributes) -> web.StreamResponse:
        body = await request.json()
        return web.json_response(rbac.access_review(self.authorizer, request[SUBJECT], body), status=201)

    async def _rules_review(self, request: web.Request, resource: Resource, a: rbac.Attributes) -> web.StreamResponse:
        body = await request.json()
        return web.json_response(rbac.rules_review(request[SUBJECT], body), status=201)

    def start(self) -> FakeCluster:
        self.server.install_extensions()
        self.server.start()
        try:
            self._stoppers.append(start_controllers(self))
            if self.docker_pods:
                self.kubelet, stop_kubelet = start_kubelet(self)
                self._stoppers.append(stop_kubelet)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for stop in reversed(self._stoppers):
            stop()
        self._stoppers.clear()
        self.server.stop()


@contextmanager
def running_fake_cluster(
    *, tls: bool = True, with_crds: bool = True, run_id: str | None = None, **options: Any
) -> Iterator[FakeCluster]:
    cluster = FakeCluster(tls=tls, with_crds=with_crds, run_id=run_id, **options).start()
    try:
        yield cluster
    finally:
        cluster.stop()
