"""metrics.k8s.io/v1beta1 as metrics-server answers it, from `docker stats` of the pods'
containers: PodMetrics per pod (`GET .../namespaces/{ns}/pods[/{name}]`, `GET .../pods`) with
each container's CPU in nanocores (the rate since the previous sample, or since the container
started) and memory working set in Ki, and one NodeMetrics for the fake node.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web
from docker.errors import DockerException

from tests.fakes.kube import rbac
from tests.fakes.kube.errors import ApiError
from tests.fakes.kube.pods import NODE_NAME
from tests.fakes.kube.resources import NODE_METRICS, POD_METRICS, PODS, Resource
from tests.fakes.kube.selection import label_matcher
from tests.fakes.kube.store import now

if TYPE_CHECKING:
    from tests.fakes.kube.cluster import FakeCluster

WINDOW = "10.5s"


def _parse_started(text: str) -> float:
    with contextlib.suppress(ValueError):
        return dt.datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()
    return time.time()


class Metrics:
    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self._previous: dict[str, tuple[float, int]] = {}  # container id -> (time, total ns)
        self._lock = threading.Lock()

    def usage(self, container_id: str) -> dict[str, str]:
        kubelet = self.cluster.kubelet
        if kubelet is None:
            return {"cpu": "0", "memory": "0"}
        stats = kubelet.docker.api.stats(container_id, stream=False, one_shot=True)
        total = int(((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage") or 0)
        memory = stats.get("memory_stats") or {}
        inactive = int((memory.get("stats") or {}).get("inactive_file") or 0)
        working_set = max(int(memory.get("usage") or 0) - inactive, 0)
        at = time.time()
        with self._lock:
            previous = self._previous.get(container_id)
            self._previous[container_id] = (at, total)
        if previous is None:
            started = kubelet.docker.api.inspect_container(container_id)["State"].get("StartedAt", "")
            since, before = _parse_started(started), 0
        else:
            since, before = previous
        elapsed = max(at - since, 1e-3)
        return {"cpu": f"{max(total - before, 0) * 1.0 / elapsed:.0f}n", "memory": f"{working_set // 1024}Ki"}

    def pod_metrics(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        kubelet = self.cluster.kubelet
        meta = pod["metadata"]
        record = kubelet.pods.get(meta["uid"]) if kubelet else None
        if record is None or not record.containers:
            return None
        containers = []
        for name, cid in record.containers.items():
            try:
                containers.append({"name": name, "usage": self.usage(cid)})
            except DockerException:
                return None
        return {
            "kind": "PodMetrics",
            "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "creationTimestamp": now(),
                "labels": dict(meta.get("labels") or {}),
            },
            "timestamp": now(),
            "window": WINDOW,
            "containers": containers,
        }

    async def handle(self, request: web.Request, resource: Resource, a: rbac.Attributes) -> web.StreamResponse:
        if a.verb not in ("get", "list"):
            raise ApiError(
                405,
                f"the server does not allow this method on the requested resource ({request.method})",
                "MethodNotAllowed",
            )
        loop = asyncio.get_running_loop()
        if resource is NODE_METRICS:
            node = {
                "kind": "NodeMetrics",
                "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": NODE_NAME, "creationTimestamp": now()},
                "timestamp": now(),
                "window": WINDOW,
                "usage": {"cpu": "0", "memory": "0"},
            }
            if a.name and a.name != NODE_NAME:
                raise ApiError(
                    404,
                    f'nodemetrics.metrics.k8s.io "{a.name}" not found',
                    "NotFound",
                    {"name": a.name, "group": "metrics.k8s.io", "kind": "nodes"},
                )
            if a.name:
                return web.json_response(node)
            return web.json_response(
                {"kind": "NodeMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {}, "items": [node]}
            )
        store = self.cluster.store
        if a.name:
            pod = store.find(PODS, a.namespace, a.name)
            found = await loop.run_in_executor(None, self.pod_metrics, pod) if pod else None
            if found is None:
                raise ApiError(
                    404,
                    f'podmetrics.metrics.k8s.io "{a.namespace}/{a.name}" not found',
                    "NotFound",
                    {"name": f"{a.namespace}/{a.name}", "group": "metrics.k8s.io", "kind": "pods"},
                )
            return web.json_response(found)
        pods = store.items(PODS, a.namespace or None, label_matcher(request.query.get("labelSelector")))
        items = []
        for pod in pods:
            found = await loop.run_in_executor(None, self.pod_metrics, pod)
            if found is not None:
                items.append(found)
        return web.json_response(
            {"kind": "PodMetricsList", "apiVersion": "metrics.k8s.io/v1beta1", "metadata": {}, "items": items}
        )


def install(cluster: FakeCluster) -> None:
    metrics = Metrics(cluster)
    cluster.handlers[POD_METRICS.key] = metrics.handle
    cluster.handlers[NODE_METRICS.key] = metrics.handle
