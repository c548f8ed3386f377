"""A protocol-faithful fake Kubernetes API server with the agent-sandbox CRDs.

`running_fake_cluster()` starts one on a loopback port (HTTPS with a CA made at start, bearer
tokens, RBAC), with the four agent-sandbox kinds, their controllers, and pods backed by Docker
containers. Checked against the unmodified official `kubernetes` client in this package's tests.

Modules: `cluster` (FakeCluster, running_fake_cluster), `server` (HTTP routing, watch
streams), `store` (objects, resourceVersion, pages, watch history), `resources` (served kinds,
discovery), `crds` (agent-sandbox schemas and validation), `core` (pod and PVC admission),
`selection` (label and field selectors), `patching`, `errors` (metav1.Status), `rbac`
(tokens, 403s, self reviews), `certs` (the CA), `controller` (the Sandbox controller and the
loop), `extensions` (the claim and warm pool controllers), `pods` (the kubelet on Docker),
`metrics` (metrics.k8s.io), `fixtures` (pytest).
"""

from tests.fakes.kube.cluster import FakeCluster, running_fake_cluster

__all__ = ["FakeCluster", "running_fake_cluster"]
