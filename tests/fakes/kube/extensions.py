"""agent-sandbox's extension controllers: SandboxClaim and SandboxWarmPool.

Read from kubernetes-sigs/agent-sandbox at commit 2fd412d55ecae90861a101a5424a75473de97c36,
`extensions/controllers/sandboxclaim_controller.go` and `sandboxwarmpool_controller.go`.

A claim (v1beta1 names a warm pool, the pool names the template) first finds its sandbox: the
one named in `status.sandbox.name`, in the claim's `agents.x-k8s.io/sandbox-name` annotation,
or named after the claim, controlled by the claim. Without one, and when the claim asks no
`env` and no `volumeClaimTemplates`, it adopts a warm pool sandbox (ready ones first): the
claim is annotated, the sandbox loses the pool's labels, gets `launch-type: warm`, the claim's
uid label and the claim as its controller. Otherwise a sandbox named after the claim is made
from the template (cold): the template's blueprint, the claim's volume claim templates as the
template's policy allows, env injected as `envVarsInjectionPolicy` allows, additional pod
metadata merged, the secure defaults (no service account token; with the default managed
network policy, DNS set to public resolvers — only ever written into the spec here, the fake
kubelet gives every container 127.0.0.1). The claim's Ready condition forwards the sandbox's.
Deleting a claim deletes its sandbox by owner reference, and with it the pod and PVCs.

A warm pool keeps `spec.replicas` (default 1) sandboxes named `<pool>-xxxxx`, labelled
`agents.x-k8s.io/warm-pool-sandbox=<hash of the pool name>`, controlled by the pool, and
reports `replicas`, `readyReplicas`, `selector`, `observedGeneration`. Not kept: rate limits,
readiness grace periods, the `Recreate` update strategy's rolling of stale sandboxes,
expiry by `lifecycle`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from tests.fakes.kube.controller import (
    CREATED_BY,
    LAUNCH_TYPE,
    POD_NAME_ANNOTATION,
    POD_TEMPLATE_HASH,
    TEMPLATE_HASH,
    TEMPLATE_REF_ANNOTATION,
    TEMPLATE_REF_HASH,
    WARM_POOL_LABEL,
    condition,
    controlled_by,
    controller_ref,
    find_condition,
    is_ready,
    name_hash,
    set_condition,
    write_status,
)
from tests.fakes.kube.crds import SANDBOX_CLAIMS, SANDBOX_TEMPLATES, SANDBOX_WARM_POOLS, SANDBOXES
from tests.fakes.kube.errors import ApiError
from tests.fakes.kube.store import Obj, Store

CLAIM_UID = "agents.x-k8s.io/claim-uid"
ASSIGNED_SANDBOX = "agents.x-k8s.io/sandbox-name"
SECURE_DNS = {"nameservers": ["8.8.8.8", "1.1.1.1"]}


class ClaimError(Exception):
    """A reason for the claim's Ready=False condition (upstream's error kinds)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _blueprint_hash(spec: dict[str, Any], keys: tuple[str, ...]) -> str:
    blueprint = {k: spec[k] for k in keys if k in spec}
    return hashlib.sha256(json.dumps(blueprint, sort_keys=True).encode()).hexdigest()[:10]


def _blueprint(template: Obj) -> dict[str, Any]:
    spec = template["spec"]
    return {k: copy.deepcopy(spec[k]) for k in ("podTemplate", "volumeClaimTemplates", "service") if k in spec}


def secure_defaults(template: Obj, pod_spec: dict[str, Any]) -> None:
    """ApplySandboxSecureDefaults."""
    pod_spec.setdefault("automountServiceAccountToken", False)
    managed = template["spec"].get("networkPolicyManagement", "Managed") in ("", "Managed")
    if managed and template["spec"].get("networkPolicy") is None and not pod_spec.get("dnsPolicy"):
        pod_spec["dnsPolicy"] = "None"
        pod_spec["dnsConfig"] = copy.deepcopy(SECURE_DNS)


def merge_pod_metadata(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for field, what in (("labels", "label"), ("annotations", "annotation")):
        for key, value in (extra.get(field) or {}).items():
            current = (base.get(field) or {}).get(key)
            if current is not None and current != value:
                raise ClaimError(
                    "ReconcilerError",
                    f'Error seen: metadata override conflict: {what} "{key}" is defined in template with value '
                    f'"{current}", but claim requests "{value}"',
                )
        if extra.get(field):
            base.setdefault(field, {}).update(extra[field])


class ClaimReconciler:
    resource = SANDBOX_CLAIMS

    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, claim: Obj) -> None:
        if claim["metadata"].get("deletionTimestamp"):
            return
        sandbox: Obj | None = None
        try:
            sandbox = self._sandbox(claim)
        except ClaimError as exc:
            ready = condition("Ready", "False", exc.reason, exc.message, claim["metadata"].get("generation", 1))
            self._status(claim, None, ready)
            return
        if sandbox is None:
            ready = condition(
                "Ready", "False", "SandboxNotReady", "Sandbox is not ready", claim["metadata"].get("generation", 1)
            )
        else:
            forwarded = find_condition(sandbox, "Ready")
            if forwarded is None:
                ready = condition(
                    "Ready", "False", "SandboxNotReady", "Sandbox is not ready", claim["metadata"].get("generation", 1)
                )
            else:
                ready = {**forwarded, "observedGeneration": claim["metadata"].get("generation", 1)}
        self._status(claim, sandbox, ready)

    def _status(self, claim: Obj, sandbox: Obj | None, ready: dict[str, Any]) -> None:
        status = copy.deepcopy(claim.get("status") or {})
        status["conditions"] = set_condition(status.get("conditions") or [], ready)
        if sandbox is not None:
            entry: dict[str, Any] = {"name": sandbox["metadata"]["name"]}
            ips = (sandbox.get("status") or {}).get("podIPs")
            if ips:
                entry["podIPs"] = list(ips)
            status["sandbox"] = entry
        write_status(self.store, SANDBOX_CLAIMS, claim, status)

    # -- finding, adopting or making the sandbox ------------------------------------------------------

    def _pool_and_template(self, claim: Obj) -> tuple[Obj, Obj]:
        namespace = claim["metadata"]["namespace"]
        pool_name = claim["spec"]["warmPoolRef"]["name"]
        pool = self.store.find(SANDBOX_WARM_POOLS, namespace, pool_name)
        if pool is None:
            raise ClaimError("WarmPoolNotFound", f'SandboxWarmPool "{pool_name}" not found')
        template_name = pool["spec"]["sandboxTemplateRef"]["name"]
        template = self.store.find(SANDBOX_TEMPLATES, namespace, template_name)
        if template is None:
            raise ClaimError("TemplateNotFound", f'SandboxTemplate "{template_name}" not found')
        return pool, template

    def _sandbox(self, claim: Obj) -> Obj | None:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        candidates = [
            (claim.get("status") or {}).get("sandbox", {}).get("name"),
            (claim["metadata"].get("annotations") or {}).get(ASSIGNED_SANDBOX),
            name,
        ]
        for candidate in candidates:
            if not candidate:
                continue
            sandbox = self.store.find(SANDBOXES, namespace, candidate)
            if sandbox is not None and controlled_by(sandbox, claim):
                return sandbox
        existing = self.store.find(SANDBOXES, namespace, name)
        if existing is not None:
            raise ClaimError(
                "ReconcilerError",
                f'Error seen: sandbox "{name}" is not controlled by claim "{name}". Please use a different claim '
                "name or delete the sandbox manually",
            )
        pool, template = self._pool_and_template(claim)
        if not claim["spec"].get("env") and not claim["spec"].get("volumeClaimTemplates"):
            adopted = self._adopt(claim, pool, template)
            if adopted is not None:
                return adopted
        return self._create(claim, template)

    def _adopt(self, claim: Obj, pool: Obj, template: Obj) -> Obj | None:
        namespace = claim["metadata"]["namespace"]
        members = [
            s
            for s in self.store.items(SANDBOXES, namespace)
            if controlled_by(s, pool)
            and WARM_POOL_LABEL in (s["metadata"].get("labels") or {})
            and TEMPLATE_REF_HASH in (s["metadata"].get("labels") or {})
            and not s["metadata"].get("deletionTimestamp")
            and (s.get("status") or {}).get("podIPs")
        ]
        if not members:
            return None
        members.sort(key=lambda s: (not is_ready(s), s["metadata"]["creationTimestamp"], s["metadata"]["name"]))
        chosen = members[0]

        def annotate(obj: Obj) -> Obj:
            obj["metadata"].setdefault("annotations", {})[ASSIGNED_SANDBOX] = chosen["metadata"]["name"]
            return obj

        self.store.mutate(SANDBOX_CLAIMS, namespace, claim["metadata"]["name"], annotate)
        template_hash = name_hash(template["metadata"]["name"])

        def adopt(obj: Obj) -> Obj:
            labels = obj["metadata"].setdefault("labels", {})
            for key in (WARM_POOL_LABEL, POD_TEMPLATE_HASH, TEMPLATE_HASH):
                labels.pop(key, None)
            labels[LAUNCH_TYPE] = "warm"
            labels[CLAIM_UID] = claim["metadata"]["uid"]
            labels[TEMPLATE_REF_HASH] = template_hash
            created_by = (claim["metadata"].get("labels") or {}).get(CREATED_BY)
            if created_by:
                labels[CREATED_BY] = created_by
            else:
                labels.pop(CREATED_BY, None)
            obj["metadata"]["ownerReferences"] = [controller_ref(claim)]
            obj["metadata"].setdefault("annotations", {})[POD_NAME_ANNOTATION] = obj["metadata"]["name"]
            pod_meta = copy.deepcopy((template["spec"]["podTemplate"].get("metadata")) or {})
            pod_labels = pod_meta.setdefault("labels", {})
            pod_labels[CLAIM_UID] = claim["metadata"]["uid"]
            pod_labels[TEMPLATE_REF_HASH] = template_hash
            if created_by:
                pod_labels[CREATED_BY] = created_by
            merge_pod_metadata(pod_meta, claim["spec"].get("additionalPodMetadata") or {})
            obj["spec"]["podTemplate"]["metadata"] = pod_meta
            return obj

        try:
            return self.store.mutate(SANDBOXES, namespace, chosen["metadata"]["name"], adopt)
        except ApiError as exc:
            if exc.code in (404, 409):
                return None
            raise

    def _create(self, claim: Obj, template: Obj) -> Obj:
        namespace, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        spec = _blueprint(template)
        spec["volumeClaimTemplates"] = self._volume_claims(template, claim)
        if not spec["volumeClaimTemplates"]:
            del spec["volumeClaimTemplates"]
        template_hash = name_hash(template["metadata"]["name"])
        labels = {CLAIM_UID: claim["metadata"]["uid"], LAUNCH_TYPE: "cold", TEMPLATE_REF_HASH: template_hash}
        created_by = (claim["metadata"].get("labels") or {}).get(CREATED_BY)
        if created_by:
            labels[CREATED_BY] = created_by
        pod_meta = spec["podTemplate"].setdefault("metadata", {})
        pod_labels = pod_meta.setdefault("labels", {})
        pod_labels[CLAIM_UID] = claim["metadata"]["uid"]
        pod_labels[TEMPLATE_REF_HASH] = template_hash
        merge_pod_metadata(pod_meta, claim["spec"].get("additionalPodMetadata") or {})
        self._inject_env(template, spec["podTemplate"]["spec"], claim)
        secure_defaults(template, spec["podTemplate"]["spec"])
        body = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {TEMPLATE_REF_ANNOTATION: template["metadata"]["name"]},
                "ownerReferences": [controller_ref(claim)],
            },
            "spec": spec,
        }
        try:
            return self.store.create(SANDBOXES, namespace, body)
        except ApiError as exc:
            raise ClaimError("ReconcilerError", f"Error seen: sandbox create error: {exc}") from None

    @staticmethod
    def _volume_claims(template: Obj, claim: Obj) -> list[dict[str, Any]]:
        """mergeVolumeClaimTemplates."""
        base = copy.deepcopy(template["spec"].get("volumeClaimTemplates") or [])
        extra = copy.deepcopy(claim["spec"].get("volumeClaimTemplates") or [])
        for source, items in (("template", base), ("claim", extra)):
            seen: set[str] = set()
            for i, item in enumerate(items):
                item_name = (item.get("metadata") or {}).get("name", "")
                if not item_name:
                    raise ClaimError(
                        "VolumeClaimTemplatesError",
                        f"{source}: invalid volume claim templates: name at index {i} is empty",
                    )
                if item_name in seen:
                    raise ClaimError(
                        "VolumeClaimTemplatesError",
                        f'{source}: invalid volume claim templates: duplicate name "{item_name}"',
                    )
                seen.add(item_name)
        if not extra:
            return base
        policy = template["spec"].get("volumeClaimTemplatesPolicy", "Disallowed")
        if policy in ("Disallowed", ""):
            raise ClaimError(
                "VolumeClaimTemplatesError",
                "failed to merge volume claim templates: volume claim templates are disallowed by the template",
            )
        names = {t["metadata"]["name"] for t in base}
        if policy == "Allowed":
            for item in extra:
                if item["metadata"]["name"] in names:
                    raise ClaimError(
                        "VolumeClaimTemplatesError",
                        "failed to merge volume claim templates: overriding volume claim templates is forbidden by "
                        f'the template: cannot override template volume "{item["metadata"]["name"]}"',
                    )
            return base + extra
        overrides = {t["metadata"]["name"]: t for t in extra}
        merged = [overrides.pop(t["metadata"]["name"], t) for t in base]
        return merged + [t for t in extra if t["metadata"]["name"] in overrides]

    @staticmethod
    def _inject_env(template: Obj, pod_spec: dict[str, Any], claim: Obj) -> None:
        envs = claim["spec"].get("env") or []
        if not envs:
            return
        policy = template["spec"].get("envVarsInjectionPolicy", "Disallowed")
        if policy not in ("Allowed", "Overrides"):
            raise ClaimError(
                "EnvVarsInjectionRejected",
                "environment variable injection rejected: environment variable injection is not allowed by the "
                "template policy",
            )
        containers = pod_spec.get("containers") or []
        known = {c["name"] for c in containers + (pod_spec.get("initContainers") or [])}
        for env in envs:
            target = env.get("containerName")
            if target and target not in known:
                raise ClaimError(
                    "ReconcilerError",
                    f'Error seen: target container "{target}" not found in template for environment variable '
                    f'"{env["name"]}"',
                )
        for i, container in enumerate(containers):
            wanted = [
                e
                for e in envs
                if e.get("containerName") == container["name"] or (i == 0 and not e.get("containerName"))
            ]
            current = container.setdefault("env", [])
            for env in wanted:
                index = next((j for j, e in enumerate(current) if e.get("name") == env["name"]), None)
                if index is None:
                    current.append({"name": env["name"], "value": env["value"]})
                elif policy == "Overrides":
                    current[index] = {"name": env["name"], "value": env["value"]}
                else:
                    raise ClaimError(
                        "ReconcilerError",
                        "Error seen: environment variable override is not allowed by the template policy for "
                        f'variable "{env["name"]}"',
                    )


class WarmPoolReconciler:
    resource = SANDBOX_WARM_POOLS

    def __init__(self, store: Store) -> None:
        self.store = store

    def reconcile(self, pool: Obj) -> None:
        if pool["metadata"].get("deletionTimestamp"):
            return
        namespace, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
        hashed = name_hash(name)
        members = [
            s
            for s in self.store.items(SANDBOXES, namespace)
            if (s["metadata"].get("labels") or {}).get(WARM_POOL_LABEL) == hashed
            and controlled_by(s, pool)
            and not s["metadata"].get("deletionTimestamp")
        ]
        desired = pool["spec"].get("replicas", 1)
        template = self.store.find(SANDBOX_TEMPLATES, namespace, pool["spec"]["sandboxTemplateRef"]["name"])
        if len(members) < desired and template is not None:
            for _ in range(desired - len(members)):
                members.append(self.store.create(SANDBOXES, namespace, self._sandbox(pool, template, hashed)))
        elif len(members) > desired:
            members.sort(key=lambda s: (is_ready(s), s["metadata"]["creationTimestamp"]), reverse=False)
            for extra in members[: len(members) - desired]:
                try:
                    self.store.delete(SANDBOXES, namespace, extra["metadata"]["name"])
                except ApiError as exc:
                    if exc.code != 404:
                        raise
            members = members[len(members) - desired :]
        status = {
            **copy.deepcopy(pool.get("status") or {}),
            "replicas": len(members),
            "readyReplicas": sum(1 for s in members if is_ready(s)),
            "selector": f"{WARM_POOL_LABEL}={hashed}",
            "observedGeneration": pool["metadata"].get("generation", 1),
        }
        write_status(self.store, SANDBOX_WARM_POOLS, pool, status)

    @staticmethod
    def _sandbox(pool: Obj, template: Obj, hashed: str) -> Obj:
        """buildSandboxCR."""
        spec = _blueprint(template)
        template_ref_hash = name_hash(template["metadata"]["name"])
        pod_hash = _blueprint_hash(template["spec"], ("podTemplate",))
        blueprint_hash = _blueprint_hash(template["spec"], ("podTemplate", "volumeClaimTemplates", "service"))
        pod_labels = spec["podTemplate"].setdefault("metadata", {}).setdefault("labels", {})
        pod_labels.update(
            {
                WARM_POOL_LABEL: hashed,
                TEMPLATE_REF_HASH: template_ref_hash,
                POD_TEMPLATE_HASH: pod_hash,
                TEMPLATE_HASH: blueprint_hash,
            }
        )
        secure_defaults(template, spec["podTemplate"]["spec"])
        return {
            "metadata": {
                "generateName": f"{pool['metadata']['name']}-",
                "labels": {
                    WARM_POOL_LABEL: hashed,
                    TEMPLATE_REF_HASH: template_ref_hash,
                    LAUNCH_TYPE: "warm",
                    POD_TEMPLATE_HASH: pod_hash,
                    TEMPLATE_HASH: blueprint_hash,
                    CREATED_BY: "controller",
                },
                "annotations": {TEMPLATE_REF_ANNOTATION: template["metadata"]["name"]},
                "ownerReferences": [controller_ref(pool)],
            },
            "spec": spec,
        }
