"""The SandboxTemplate (and its pool) each sandbox is claimed from, and the templates listed
(`KubernetesTemplates`).

A spec's template id is either an image reference (it holds `/`, `:` or `@`:
`sandbox-console/base:latest`) or the name of a SandboxTemplate in the backend's namespace
(referenced by id: the platform admin's, or one `images.py` made for a skill image). Either
way the sandbox is claimed from a template the adapter derives, on demand, in the sandbox's
namespace: the source's blueprint (an image's: one container running it; a template's: its
own) with what the console decides made explicit, never left to the source's defaults:

- the first container's CPU and memory (requests = limits) from `Resources`; the pods'
  RuntimeClass (`runtime_class`); no service account token in the pod;
- /workspace: a volume claim template `workspace` (`storage_class`, `workspace_size`,
  ReadWriteOnce) mounted at /workspace unless the source mounts something there, so a
  sandbox's files outlive a suspend (the claim is the Sandbox's, `workspace-<sandbox>`);
- the network policy (`network.policy_spec`), `Managed`;
- `envVarsInjectionPolicy: Overrides`, so a claim's env reaches the pod.

Its name is `sc-` + a digest of that body, so one spec makes one template however many
sandboxes use it (a create of one that exists is a 409, taken as done), and a changed source,
resource or policy makes a new one. Beside it, a SandboxWarmPool of the same name with no
replicas: a v1beta1 claim always names a pool, and from an empty pool the controller makes
the sandbox from the pool's template (the cold path). `pools.py` keeps pools with replicas.

The platform's templates (not the derived ones, nor skill images') are listed by
`KubernetesTemplates` (their names are the ids); building one from Debian packages is not
offered here (skill images: `images.py`).

May import: the contract, `.client`, `.claims`, `.network`, `.settings`.
"""

from __future__ import annotations

import builtins
import copy
import hashlib
import json
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..base import WORKSPACE, ErrorKind, RemoteError, Resources, SandboxSpec, TemplateBuildSpec, TemplateInfo
from ..capabilities import TemplatesCapability
from .claims import MANAGED, PREFIX, TEMPLATES, WARM_POOLS, created_at
from .network import policy_spec
from .settings import DEFAULT_WORKSPACE_SIZE

if TYPE_CHECKING:
    from .backend import KubernetesBackend

SOURCE = PREFIX + "source"
WORKSPACE_CLAIM = "workspace"
CONTAINER = "sandbox"
# The image's container waits for signals: the sandbox's processes are exec'd into it.
IDLE_COMMAND = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
_TEMPLATE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def is_snapshot_template(item: Mapping[str, Any]) -> bool:
    labels = (item.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(PREFIX + "kind") == "snapshot")


def is_derived(item: Mapping[str, Any]) -> bool:
    return SOURCE in ((item.get("metadata") or {}).get("annotations") or {})


def is_image(template_id: str) -> bool:
    return any(mark in template_id for mark in "/:@")


def image_blueprint(image: str) -> dict[str, Any]:
    return {
        "podTemplate": {
            "metadata": {},
            "spec": {
                "containers": [{"name": CONTAINER, "image": image, "command": IDLE_COMMAND}],
                "restartPolicy": "Never",
            },
        }
    }


def _quantity_mib(mb: int) -> str:
    return f"{mb}Mi"


def derived_spec(
    blueprint: Mapping[str, Any],
    *,
    resources: Resources,
    network: Any,
    runtime_class: str,
    storage_class: str,
    workspace_size: str,
) -> dict[str, Any]:
    """The SandboxTemplate spec a sandbox is claimed from (the module's docstring says what)."""
    body = copy.deepcopy(dict(blueprint))
    for runtime_only in ("operatingMode", "shutdownTime", "shutdownPolicy", "networkPolicy"):
        body.pop(runtime_only, None)
    pod = body.setdefault("podTemplate", {}).setdefault("spec", {})
    containers = pod.get("containers") or []
    if not containers:
        raise RemoteError(ErrorKind.INVALID, "the template's pod has no container")
    first = containers[0]
    limits: dict[str, str] = {}
    if resources.cpus:
        limits["cpu"] = f"{int(resources.cpus * 1000)}m"
    if resources.memory_mb:
        limits["memory"] = _quantity_mib(resources.memory_mb)
    if limits:
        first["resources"] = {"requests": dict(limits), "limits": dict(limits)}
    if runtime_class:
        pod["runtimeClassName"] = runtime_class
    pod["automountServiceAccountToken"] = False
    mounts = first.setdefault("volumeMounts", [])
    if not any(m.get("mountPath") == WORKSPACE for m in mounts):
        mounts.append({"name": WORKSPACE_CLAIM, "mountPath": WORKSPACE})
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": workspace_size or DEFAULT_WORKSPACE_SIZE}},
        }
        if storage_class:
            claim_spec["storageClassName"] = storage_class
        claims = [
            c for c in body.get("volumeClaimTemplates") or [] if c.get("metadata", {}).get("name") != WORKSPACE_CLAIM
        ]
        body["volumeClaimTemplates"] = [*claims, {"metadata": {"name": WORKSPACE_CLAIM}, "spec": claim_spec}]
    body["networkPolicyManagement"] = "Managed"
    body["networkPolicy"] = policy_spec(network)
    body["envVarsInjectionPolicy"] = "Overrides"
    return body


def derived_name(spec: Mapping[str, Any]) -> str:
    return "sc-" + hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


class Derived:
    """Derives, and makes on demand, the template and cold pool a spec is claimed from."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend
        self._made: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def source_blueprint(self, template_id: str) -> dict[str, Any]:
        if is_image(template_id):
            return image_blueprint(template_id)
        if not _TEMPLATE_NAME.match(template_id):
            raise RemoteError(ErrorKind.INVALID, f"template {template_id!r} is neither an image nor a template name")
        namespace = self.backend.base_namespace
        try:
            source = self.backend.get_custom(TEMPLATES, namespace, template_id, f"template {template_id}")
        except RemoteError as exc:
            if exc.kind == ErrorKind.NOT_FOUND:
                raise RemoteError(
                    ErrorKind.NOT_FOUND, f"template {template_id} not found in namespace {namespace}", retryable=False
                ) from None
            raise
        return dict(source.get("spec") or {})

    def template_for(self, spec: SandboxSpec, namespace: str) -> str:
        """The derived template's name in `namespace`, made if missing (with its cold pool)."""
        options = self.backend.options
        body = derived_spec(
            self.source_blueprint(spec.template_id),
            resources=spec.resources,
            network=spec.network,
            runtime_class=options.runtime_class,
            storage_class=options.storage_class,
            workspace_size=options.workspace_size,
        )
        name = derived_name(body)
        with self._lock:
            if (namespace, name) in self._made:
                return name
        labels = {MANAGED: "1", SOURCE: hashlib.sha256(spec.template_id.encode()).hexdigest()[:40]}
        annotations = {SOURCE: spec.template_id}
        self.backend.create_custom(
            TEMPLATES,
            namespace,
            {"metadata": {"name": name, "labels": labels, "annotations": annotations}, "spec": body},
            kind="SandboxTemplate",
            exists_ok=True,
        )
        self.ensure_pool(namespace, name, name, replicas=0, labels=labels)
        with self._lock:
            self._made.add((namespace, name))
        return name

    def forget(self, namespace: str, name: str) -> None:
        """After a claim found the template or pool missing: make them again next time."""
        with self._lock:
            self._made.discard((namespace, name))

    def ensure_pool(
        self, namespace: str, name: str, template: str, *, replicas: int, labels: Mapping[str, str]
    ) -> dict[str, Any]:
        body = {
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
        }
        return self.backend.create_custom(WARM_POOLS, namespace, body, kind="SandboxWarmPool", exists_ok=True)


class KubernetesTemplates(TemplatesCapability):
    """The SandboxTemplates of the backend's namespace."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.backend = backend

    def _info(self, item: Mapping[str, Any]) -> TemplateInfo:
        meta = item.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        containers = (((item.get("spec") or {}).get("podTemplate") or {}).get("spec") or {}).get("containers") or []
        image = str(containers[0].get("image") or "") if containers else ""
        derived = annotations.get(SOURCE)
        description = f"derived from {derived}" if derived else (f"image {image}" if image else "")
        return TemplateInfo(
            template_id=str(meta.get("name")),
            name=str(meta.get("name")),
            description=description,
            created_at=created_at(item),
            labels=dict(meta.get("labels") or {}),
        )

    def list(self) -> builtins.list[TemplateInfo]:
        items = self.backend.list_all(TEMPLATES, self.backend.base_namespace, "listing templates")
        # Skill images' templates are snapshots (`images.py` lists them), never templates; the
        # derived ones (`Derived`) are the adapter's own, one per spec, never picked by an admin.
        return [self._info(item) for item in items if not is_snapshot_template(item) and not is_derived(item)]

    def get(self, template_id: str) -> TemplateInfo:
        namespace = self.backend.base_namespace
        return self._info(self.backend.get_custom(TEMPLATES, namespace, template_id, f"template {template_id}"))

    def create(self, spec: TemplateBuildSpec) -> TemplateInfo:
        raise RemoteError(
            ErrorKind.UNSUPPORTED,
            "Kubernetes templates are not built from packages here: make a SandboxTemplate in the cluster, "
            "or install skills (their images become templates)",
        )

    def delete(self, template_id: str) -> None:
        """Idempotent. Sandboxes made from it keep running: each holds a copy of its blueprint
        (a derived template's), so nothing live uses the template object itself."""
        self.backend.delete_custom(TEMPLATES, self.backend.base_namespace, template_id, f"template {template_id}")
