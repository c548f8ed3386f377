"""A running sandbox's resource use from the metrics API (`metrics.k8s.io/v1beta1` PodMetrics,
served by metrics-server), where the cluster has it.

`GET /apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods/{pod}`: each container's `usage`
(`cpu` in cores as a quantity, `1500m`, `250000n`; `memory` the working set, `12Mi`, `3456Ki`),
already a rate over the API's window. CPU as the contract counts it: 100.0 = one core busy.
A cluster without the metrics API answers 404 for its group: `unsupported`, saying so. The
network counters are not in PodMetrics (None).

May import: the contract, `.client`.
"""

from __future__ import annotations

import re
import time
from decimal import Decimal
from typing import TYPE_CHECKING

from ..base import ErrorKind, RemoteError
from ..capabilities import SandboxStats, StatsCapability
from .client import call

if TYPE_CHECKING:
    from .backend import KubernetesBackend

METRICS = ("metrics.k8s.io", "v1beta1", "pods")
# apimachinery's resource.Quantity: a signed decimal number, then a binary-SI, decimal-SI or
# decimal-exponent suffix (`e3`, `E-2`; a bare `E` is exa).
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([eE][+-]?[0-9]+)|([a-zA-Z]*))$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(1000),
    "M": Decimal(1000**2),
    "G": Decimal(1000**3),
    "T": Decimal(1000**4),
    "P": Decimal(1000**5),
    "E": Decimal(1000**6),
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
}


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity (`250m`, `12Mi`, `3`, `1e3`) as a number."""
    found = _QUANTITY.match(str(text).strip())
    if not found or (found.group(3) or "") not in _SUFFIX:
        raise RemoteError(ErrorKind.INTERNAL, f"the metrics API sent {text!r}, which is no quantity")
    number = Decimal(found.group(1))
    if found.group(2):
        return number * Decimal(10) ** int(found.group(2)[1:])
    return number * _SUFFIX[found.group(3) or ""]


class KubernetesStats(StatsCapability):
    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend

    def read(self, sandbox_id: str) -> SandboxStats:
        pod = self.backend.pod_of(sandbox_id)
        group, version, plural = METRICS
        try:
            metrics = call(
                f"reading the metrics of sandbox {sandbox_id}",
                self.backend.custom.get_namespaced_custom_object,
                group,
                version,
                pod.namespace,
                plural,
                pod.pod,
                _request_timeout=self.backend.request_timeout,
            )
        except RemoteError as exc:
            if exc.kind != ErrorKind.NOT_FOUND:
                raise
            raise self._missing(sandbox_id) from None
        cpu = Decimal(0)
        memory = Decimal(0)
        for container in metrics.get("containers") or []:
            usage = container.get("usage") or {}
            cpu += quantity(usage.get("cpu", "0"))
            memory += quantity(usage.get("memory", "0"))
        return SandboxStats(cpu_percent=float(cpu * 100), memory_bytes=int(memory), read_at=time.time())

    def _missing(self, sandbox_id: str) -> RemoteError:
        """A 404: no metrics API at all (`unsupported`), or none yet for this pod (`conflict`)."""
        group, version, _ = METRICS
        try:
            call("reading the metrics API", self.backend.custom.get_api_resources, group, version)
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                return RemoteError(
                    ErrorKind.UNSUPPORTED,
                    "this cluster serves no metrics.k8s.io (install metrics-server for resource use)",
                    retryable=False,
                )
            return exc
        return RemoteError(ErrorKind.CONFLICT, f"no metrics for sandbox {sandbox_id} yet (its pod just started)")
