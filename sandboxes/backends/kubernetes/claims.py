"""SandboxClaims: the ids, labels and annotations the console puts on them, their bodies, their
state, and the wait for one to be Ready.

Read from kubernetes-sigs/agent-sandbox at commit 2fd412d55ecae90861a101a5424a75473de97c36
(`extensions/api/v1beta1/sandboxclaim_types.go`, `extensions/controllers/sandboxclaim_controller.go`):
a v1beta1 claim names a `SandboxWarmPool` (`spec.warmPoolRef`, required); the controller
adopts a ready sandbox of the pool, else creates one named as the claim from the pool's
template (cold path). It writes `status.sandbox.name` and forwards the Sandbox's `Ready`
condition to the claim (reason `SandboxSuspended` while suspended); `Ready=False` with a
reason it never recovers from (`TERMINAL_REASONS`) ends a wait at once. `spec.env` forces a
cold start and needs the template's `envVarsInjectionPolicy` to allow it.

The mapping (every label under `console.sandbox-console/`):
- sandbox id = `<namespace>.<claim name>` (a namespace has no dot; an id without one, or
  whose parts are not a namespace's and an object's name, names nothing: `not_found`);
- claim name = `sc-` + 20 random hex digits;
- labels: `managed=1`, and per metadata key `<key>=<value>` where both are label syntax;
  a key or value that is not (too long, other characters) becomes `k-`/`h-` + a SHA-256
  prefix of it, so a selector on the same metadata still finds it;
- annotations: `metadata` (the metadata exactly, as JSON: what `SandboxInfo.metadata` is
  read from, and what a listing checks after a hashed label matched), `template` (the
  spec's template id) and `sandbox-template` (the SandboxTemplate its pool makes sandboxes
  from: the derived one, `templates.py`).

May import: the contract and the `kubernetes` client (through `.client`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import watch
from kubernetes.client import ApiException

from ..base import ErrorKind, RemoteError, SandboxInfo, SandboxState
from .client import translated

CLAIMS = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims")
SANDBOXES = ("agents.x-k8s.io", "v1beta1", "sandboxes")
TEMPLATES = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxtemplates")
WARM_POOLS = ("extensions.agents.x-k8s.io", "v1beta1", "sandboxwarmpools")

PREFIX = "console.sandbox-console/"
MANAGED = PREFIX + "managed"
METADATA = PREFIX + "metadata"
TEMPLATE = PREFIX + "template"
SANDBOX_TEMPLATE = PREFIX + "sandbox-template"
# The upstream annotation naming the sandbox a claim adopted (`AssignedSandboxNameAnnotation`).
ASSIGNED = "agents.x-k8s.io/sandbox-name"

READY_TIMEOUT_S = 300.0

# Ready=False reasons the claim controller never recovers from (computeReadyCondition), with
# the contract's kind for each.
TERMINAL_REASONS = {
    "TemplateNotFound": ErrorKind.NOT_FOUND,
    "WarmPoolNotFound": ErrorKind.NOT_FOUND,
    "InvalidMetadata": ErrorKind.INVALID,
    "EnvVarsInjectionRejected": ErrorKind.INVALID,
    "VolumeClaimTemplatesError": ErrorKind.INVALID,
    "InvalidConfiguration": ErrorKind.INVALID,
    "ClaimExpired": ErrorKind.GONE,
    "SandboxExpired": ErrorKind.GONE,
    "PodFailed": ErrorKind.GONE,
    "PodSucceeded": ErrorKind.GONE,
}
SUSPENDED = "SandboxSuspended"

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_OBJECT = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class SandboxRef:
    """Where a sandbox's claim is."""

    namespace: str
    claim: str

    @property
    def sandbox_id(self) -> str:
        return f"{self.namespace}.{self.claim}"

    @classmethod
    def parse(cls, sandbox_id: str) -> SandboxRef:
        namespace, dot, claim = sandbox_id.partition(".")
        # Both parts go into the API's paths: only object names (no "/", no "..") are ids.
        if not dot or not _NAMESPACE.match(namespace) or len(claim) > 253 or not _OBJECT.match(claim):
            raise RemoteError(ErrorKind.NOT_FOUND, f"sandbox {sandbox_id} not found (not a Kubernetes sandbox id)")
        return cls(namespace, claim)


def new_claim_name() -> str:
    return f"sc-{uuid.uuid4().hex[:20]}"


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def label_key(key: str) -> str:
    return PREFIX + (key if _NAME_PART.match(key) else f"k-{_digest(key, 40)}")


def label_value(value: str) -> str:
    return value if value == "" or _NAME_PART.match(value) else f"h-{_digest(value, 40)}"


def labels_for(metadata: Mapping[str, str]) -> dict[str, str]:
    """The claim's labels: managed, and each metadata pair in label syntax."""
    labels = {MANAGED: "1"}
    labels.update({label_key(k): label_value(v) for k, v in metadata.items()})
    return labels


def selector_for(metadata: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels_for(metadata).items()))


def claim_body(
    name: str, *, pool: str, template: str, metadata: Mapping[str, str], template_id: str, env: Mapping[str, str]
) -> dict[str, Any]:
    spec: dict[str, Any] = {"warmPoolRef": {"name": pool}}
    if env:
        spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
    group, version, _ = CLAIMS
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "SandboxClaim",
        "metadata": {
            "name": name,
            "labels": labels_for(metadata),
            "annotations": {
                METADATA: json.dumps(dict(metadata), sort_keys=True),
                TEMPLATE: template_id,
                SANDBOX_TEMPLATE: template,
            },
        },
        "spec": spec,
    }


# ---------------------------------------------------------------------------------------
# Reading a claim


def metadata_of(claim: Mapping[str, Any]) -> dict[str, str]:
    raw = ((claim.get("metadata") or {}).get("annotations") or {}).get(METADATA) or "{}"
    try:
        found = json.loads(raw)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def template_of(claim: Mapping[str, Any]) -> str:
    return str(((claim.get("metadata") or {}).get("annotations") or {}).get(TEMPLATE) or "")


def sandbox_name(claim: Mapping[str, Any]) -> str:
    """The Sandbox a claim is bound to ("" while none): status, else the adoption annotation."""
    status = (claim.get("status") or {}).get("sandbox") or {}
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    return str(status.get("name") or status.get("Name") or annotations.get(ASSIGNED) or "")


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for found in (obj.get("status") or {}).get("conditions") or []:
        if found.get("type") == kind:
            return dict(found)
    return None


def created_at(obj: Mapping[str, Any]) -> datetime | None:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None


def info_of(claim: Mapping[str, Any], state: SandboxState) -> SandboxInfo:
    """The contract's view of a claim (its namespace from its metadata) in `state`."""
    meta = claim.get("metadata") or {}
    return SandboxInfo(
        sandbox_id=SandboxRef(str(meta.get("namespace") or ""), str(meta.get("name"))).sandbox_id,
        state=state,
        template_id=template_of(claim),
        metadata=metadata_of(claim),
        started_at=created_at(claim),
    )


def claim_state(claim: Mapping[str, Any]) -> SandboxState:
    """A claim's state from its forwarded Ready condition (what a listing has)."""
    if (claim.get("metadata") or {}).get("deletionTimestamp"):
        return SandboxState.GONE
    ready = condition(claim, "Ready")
    if ready is None:
        return SandboxState.STARTING
    if ready.get("status") == "True":
        return SandboxState.RUNNING
    reason = str(ready.get("reason") or "")
    if reason == SUSPENDED:
        return SandboxState.STOPPED
    if TERMINAL_REASONS.get(reason) == ErrorKind.GONE:
        return SandboxState.GONE
    return SandboxState.STARTING


def sandbox_state(claim: Mapping[str, Any], sandbox: Mapping[str, Any] | None) -> SandboxState:
    """A claim's state read with its Sandbox: suspended while its pod still terminates is
    `pausing`, a suspended one whose pod is gone `stopped` (memory is not kept), a suspended
    one asked to run again `starting` until Ready."""
    if sandbox is None:
        return SandboxState.GONE if sandbox_name(claim) else claim_state(claim)
    if (sandbox.get("metadata") or {}).get("deletionTimestamp"):
        return SandboxState.GONE
    mode = (sandbox.get("spec") or {}).get("operatingMode") or "Running"
    ready = condition(sandbox, "Ready") or {}
    if mode == "Suspended":
        suspended = condition(sandbox, "Suspended") or {}
        return SandboxState.STOPPED if suspended.get("status") == "True" else SandboxState.PAUSING
    if ready.get("status") == "True":
        return SandboxState.RUNNING
    if TERMINAL_REASONS.get(str(ready.get("reason") or "")) == ErrorKind.GONE:
        return SandboxState.GONE
    return claim_state(claim) if claim_state(claim) == SandboxState.GONE else SandboxState.STARTING


def refusal(claim: Mapping[str, Any]) -> RemoteError | None:
    """The error a claim's terminal Ready=False reason means, or None while it may still come up."""
    ready = condition(claim, "Ready") or {}
    reason = str(ready.get("reason") or "")
    if ready.get("status") != "False" or reason not in TERMINAL_REASONS:
        return None
    name = (claim.get("metadata") or {}).get("name", "?")
    message = str(ready.get("message") or "")
    return RemoteError(
        TERMINAL_REASONS[reason], f"sandbox claim {name} failed: {reason}: {message}".rstrip(": "), retryable=False
    )


# ---------------------------------------------------------------------------------------
# Waiting


class Watcher:
    """Watches one object of a custom resource until a test says it is done."""

    def __init__(self, custom: Any, resource: tuple[str, str, str], namespace: str, name: str) -> None:
        self.custom = custom
        self.group, self.version, self.plural = resource
        self.namespace = namespace
        self.name = name

    def get(self) -> dict[str, Any]:
        with translated(f"reading {self.plural} {self.namespace}/{self.name}"):
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                self.group, self.version, self.namespace, self.plural, self.name
            )
            return found

    def until(
        self, done: Any, *, timeout_s: float, initial: dict[str, Any] | None = None, what: str = "to be ready"
    ) -> dict[str, Any]:
        """The object once `done(obj)` is true (`done` may raise to end the wait). A watch
        from the object's resourceVersion, restarted from a fresh read when the API answers
        410 (too old) or closes the stream; `timeout` past `timeout_s`, `gone` if deleted."""
        deadline = time.monotonic() + timeout_s
        current = initial if initial is not None else self.get()
        while True:
            if done(current):
                return current
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ready = condition(current, "Ready") or {}
                last = (
                    f": Ready is {ready.get('status')} ({ready.get('reason')}: {ready.get('message')})" if ready else ""
                )
                raise RemoteError(
                    ErrorKind.TIMEOUT,
                    f"{self.plural} {self.namespace}/{self.name} did not come {what} in {timeout_s:g} s{last}",
                )
            version = str((current.get("metadata") or {}).get("resourceVersion") or "0")
            stream = watch.Watch()
            what_now = f"watching {self.plural} {self.namespace}/{self.name}"
            try:
                with translated(what_now):
                    try:
                        for event in stream.stream(
                            self.custom.list_namespaced_custom_object,
                            self.group,
                            self.version,
                            self.namespace,
                            self.plural,
                            field_selector=f"metadata.name={self.name}",
                            resource_version=version,
                            timeout_seconds=max(1, math.ceil(remaining)),
                            _request_timeout=(10, remaining + 10),
                        ):
                            kind, obj = event.get("type"), event.get("raw_object") or event.get("object")
                            if kind == "DELETED":
                                raise RemoteError(
                                    ErrorKind.GONE, f"{self.plural} {self.namespace}/{self.name} was deleted"
                                )
                            if kind in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                                current = obj
                                if done(current):
                                    return current
                    except ApiException as exc:
                        if exc.status != 410:
                            raise
                        current = self.get()  # the version is too old: on from what is there now
            finally:
                stream.stop()


def wait_ready(watcher: Watcher, *, timeout_s: float, initial: dict[str, Any] | None = None) -> dict[str, Any]:
    """The claim once Ready and bound; its terminal reason as an error at once."""

    def done(claim: dict[str, Any]) -> bool:
        failed = refusal(claim)
        if failed is not None:
            raise failed
        ready = condition(claim, "Ready") or {}
        return ready.get("status") == "True" and bool(sandbox_name(claim))

    return watcher.until(done, timeout_s=timeout_s, initial=initial)
