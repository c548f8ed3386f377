"""The Kubernetes adapter: sandboxes as kubernetes-sigs/agent-sandbox `SandboxClaim`s on a
cluster, through the official `kubernetes` client (`backend.py` maps the contract).

The official client over kr8s: it is synchronous like our contract (kr8s is async-first, its
sync API a wrapper over an event loop in a thread), and it carries what the adapter needs built
in and maintained by the Kubernetes project itself (watch with resourceVersion, kubeconfig and
in-cluster loading, the pods/exec channel protocol), which `k8s-agent-sandbox` also builds on.

`settings` declares what it takes from the admins (`SCHEMA`) and its typed options.

Imports nothing of the project but `sandboxes.backends` (the contract and the guard).
"""

from .settings import SCHEMA as SCHEMA
from .settings import KubernetesOptions as KubernetesOptions
