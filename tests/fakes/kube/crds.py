"""The four agent-sandbox CRDs: their schemas, defaults, validation and the
CustomResourceDefinition objects a client lists to see they are installed.

Written by us from the upstream manifests of kubernetes-sigs/agent-sandbox at commit
2fd412d55ecae90861a101a5424a75473de97c36 (`k8s/crds/agents.x-k8s.io_sandboxes.yaml`,
`k8s/crds/extensions.agents.x-k8s.io_sandboxclaims.yaml`, `..._sandboxtemplates.yaml`,
`..._sandboxwarmpools.yaml`), version v1beta1 (the storage version; the fake serves only it,
v1alpha1 is not offered). What is kept from the manifests: every field of `spec` and `status`
at the levels a client writes (types, enums, formats, minimums, required fields, defaults),
the scopes, names, short names, subresources and printer columns, and the Sandbox rule that
`volumeClaimTemplates` is immutable. The embedded PodSpec and PersistentVolumeClaimSpec are
not spelt out: a pod template must have `containers` with a `name` each, the rest is kept as
sent. Unknown fields elsewhere are pruned, as the apiserver prunes a structural schema.

Validation failures are 422 Invalid Status bodies with one cause per field, worded as the
apiserver words them (`Required value`, `in body must be of type integer`, `Unsupported value`).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.fakes.kube.resources import Resource

UPSTREAM_COMMIT = "2fd412d55ecae90861a101a5424a75473de97c36"
CORE_GROUP = "agents.x-k8s.io"
EXT_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"

Schema = dict[str, Any]


def _obj(required: tuple[str, ...] = (), **properties: Schema) -> Schema:
    schema: Schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _str(**kw: Any) -> Schema:
    return {"type": "string", **kw}


def _int32(**kw: Any) -> Schema:
    return {"type": "integer", "format": "int32", **kw}


_STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
_FREE: Schema = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
_FREE_LIST: Schema = {"type": "array", "items": _FREE}
_NAME_REF = _obj(("name",), name=_str())
_OBJECT_META = _obj(labels=_STRING_MAP, annotations=_STRING_MAP)
_CONTAINER: Schema = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "required": ["name"],
    "properties": {
        "name": _str(),
        "image": _str(),
        "command": {"type": "array", "items": _str()},
        "args": {"type": "array", "items": _str()},
        "workingDir": _str(),
        "env": _FREE_LIST,
        "volumeMounts": _FREE_LIST,
    },
}
_POD_SPEC: Schema = {
    "type": "object",
    "x-kubernetes-preserve-unknown-fields": True,
    "required": ["containers"],
    "properties": {
        "containers": {"type": "array", "items": _CONTAINER},
        "initContainers": {"type": "array", "items": _CONTAINER},
    },
}
POD_TEMPLATE = _obj(("spec",), metadata=_OBJECT_META, spec=_POD_SPEC)
VOLUME_CLAIM_TEMPLATES: Schema = {
    "type": "array",
    "items": _obj(
        ("spec",),
        metadata=_obj(name=_str(), labels=_STRING_MAP, annotations=_STRING_MAP),
        spec=_FREE,
    ),
}
CONDITIONS: Schema = {
    "type": "array",
    "items": _obj(
        ("lastTransitionTime", "message", "reason", "status", "type"),
        lastTransitionTime=_str(format="date-time"),
        message=_str(maxLength=32768),
        observedGeneration={"type": "integer", "format": "int64", "minimum": 0},
        reason=_str(),
        status=_str(enum=["True", "False", "Unknown"]),
        type=_str(),
    ),
}
SHUTDOWN_POLICY = _str(enum=["Delete", "Retain"], default="Retain")

SANDBOX_SCHEMA = _obj(
    ("spec",),
    spec=_obj(
        ("podTemplate",),
        operatingMode=_str(enum=["Running", "Suspended"], default="Running"),
        podTemplate=POD_TEMPLATE,
        service={"type": "boolean"},
        shutdownPolicy=SHUTDOWN_POLICY,
        shutdownTime=_str(format="date-time"),
        volumeClaimTemplates=VOLUME_CLAIM_TEMPLATES,
    ),
    status=_obj(
        conditions=CONDITIONS,
        nodeName=_str(),
        podIPs={"type": "array", "items": _str()},
        selector=_str(),
        service=_str(),
        serviceFQDN=_str(),
    ),
)
SANDBOX_TEMPLATE_SCHEMA = _obj(
    ("spec",),
    spec=_obj(
        ("podTemplate",),
        envVarsInjectionPolicy=_str(enum=["Allowed", "Overrides", "Disallowed"], default="Disallowed"),
        networkPolicy=_obj(egress=_FREE_LIST, ingress=_FREE_LIST),
        networkPolicyManagement=_str(enum=["Managed", "Unmanaged"], default="Managed"),
        podTemplate=POD_TEMPLATE,
        service={"type": "boolean"},
        volumeClaimTemplates=VOLUME_CLAIM_TEMPLATES,
        volumeClaimTemplatesPolicy=_str(enum=["Disallowed", "Allowed", "Overrides"], default="Disallowed"),
    ),
)
SANDBOX_CLAIM_SCHEMA = _obj(
    ("spec",),
    spec=_obj(
        ("warmPoolRef",),
        additionalPodMetadata=_obj(annotations=_STRING_MAP, labels=_STRING_MAP),
        env={"type": "array", "items": _obj(("name", "value"), containerName=_str(), name=_str(), value=_str())},
        lifecycle=_obj(
            shutdownPolicy=_str(enum=["Delete", "DeleteForeground", "Retain"], default="Retain"),
            shutdownTime=_str(format="date-time"),
            ttlSecondsAfterFinished=_int32(minimum=0),
        ),
        volumeClaimTemplates=VOLUME_CLAIM_TEMPLATES,
        warmPoolRef=_NAME_REF,
    ),
    status=_obj(
        conditions=CONDITIONS,
        sandbox=_obj(name=_str(), podIPs={"type": "array", "items": _str()}),
    ),
)
SANDBOX_WARM_POOL_SCHEMA = _obj(
    ("spec",),
    spec=_obj(
        ("sandboxTemplateRef",),
        replicas=_int32(minimum=0, default=1),
        sandboxTemplateRef=_NAME_REF,
        updateStrategy=_obj(type=_str(enum=["Recreate", "OnReplenish"], default="OnReplenish")),
    ),
    status=_obj(
        observedGeneration={"type": "integer", "format": "int64", "minimum": 0},
        readyReplicas=_int32(),
        replicas=_int32(),
        selector=_str(),
    ),
)

SANDBOXES = Resource(CORE_GROUP, VERSION, "sandboxes", "Sandbox", short_names=("sandbox",), subresources=("status",))
SANDBOX_TEMPLATES = Resource(
    EXT_GROUP, VERSION, "sandboxtemplates", "SandboxTemplate", short_names=("sandboxtemplate",)
)
SANDBOX_CLAIMS = Resource(
    EXT_GROUP, VERSION, "sandboxclaims", "SandboxClaim", short_names=("sandboxclaim",), subresources=("status",)
)
SANDBOX_WARM_POOLS = Resource(
    EXT_GROUP, VERSION, "sandboxwarmpools", "SandboxWarmPool", short_names=("swp",), subresources=("status", "scale")
)

SCHEMAS: dict[Resource, Schema] = {
    SANDBOXES: SANDBOX_SCHEMA,
    SANDBOX_TEMPLATES: SANDBOX_TEMPLATE_SCHEMA,
    SANDBOX_CLAIMS: SANDBOX_CLAIM_SCHEMA,
    SANDBOX_WARM_POOLS: SANDBOX_WARM_POOL_SCHEMA,
}
RESOURCES = tuple(SCHEMAS)
PRINTER_COLUMNS = {
    SANDBOXES: [
        ("Ready", ".status.conditions[?(@.type=='Ready')].status"),
        ("Reason", ".status.conditions[?(@.type=='Ready')].reason"),
    ],
    SANDBOX_CLAIMS: [
        ("Ready", ".status.conditions[?(@.type=='Ready')].status"),
        ("Sandbox", ".status.sandbox.name"),
        ("Reason", ".status.conditions[?(@.type=='Ready')].reason"),
    ],
    SANDBOX_WARM_POOLS: [("Ready", ".status.readyReplicas"), ("Desired", ".spec.replicas")],
}
VOLUME_CLAIMS_IMMUTABLE = (
    "has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) && "
    "(!has(self.volumeClaimTemplates) || self.volumeClaimTemplates == oldSelf.volumeClaimTemplates)"
)

_JSON_TYPES = {"string": str, "boolean": bool, "object": dict, "array": list}
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "object"


def _has_type(value: Any, wanted: str) -> bool:
    if wanted == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if wanted == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[wanted])


def _cause(reason: str, message: str, path: str) -> dict[str, str]:
    return {"reason": reason, "message": message, "field": path}


def check(schema: Schema, value: Any, path: str) -> list[dict[str, str]]:
    """Validate `value` in place (defaults applied, unknown fields pruned); the causes found."""
    wanted = schema.get("type")
    if wanted and not _has_type(value, wanted):
        got = _type_name(value)
        return [
            _cause(
                "FieldValueTypeInvalid",
                f'Invalid value: "{got}": {path} in body must be of type {wanted}: "{got}"',
                path,
            )
        ]
    causes: list[dict[str, str]] = []
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(f'"{v}"' for v in schema["enum"])
        causes.append(
            _cause("FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {supported}', path)
        )
    if schema.get("format") == "date-time" and isinstance(value, str) and not _DATE_TIME.match(value):
        causes.append(
            _cause(
                "FieldValueInvalid",
                f'Invalid value: "{value}": {path} in body must be of type date-time: "{value}"',
                path,
            )
        )
    if "minimum" in schema and isinstance(value, int | float) and value < schema["minimum"]:
        causes.append(
            _cause(
                "FieldValueInvalid",
                f"Invalid value: {value}: {path} in body should be greater than or equal to {schema['minimum']}",
                path,
            )
        )
    if "maxLength" in schema and isinstance(value, str) and len(value) > schema["maxLength"]:
        causes.append(_cause("FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes", path))
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties", {})
        for name in schema.get("required", []):
            if value.get(name) is None:
                causes.append(_cause("FieldValueRequired", "Required value", f"{path}.{name}"))
        for name, sub in props.items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
        extra = schema.get("additionalProperties")
        for name in list(value):
            if name in props:
                if value[name] is not None:
                    causes.extend(check(props[name], value[name], f"{path}.{name}"))
            elif isinstance(extra, dict):
                causes.extend(check(extra, value[name], f"{path}.{name}"))
            elif props and not schema.get("x-kubernetes-preserve-unknown-fields"):
                del value[name]  # pruned, as the apiserver prunes unknown fields
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            causes.extend(check(schema["items"], item, f"{path}[{i}]"))
    return causes


def validate(resource: Resource, obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, str]]:
    """The store's validator for the four kinds (other resources pass untouched)."""
    schema = SCHEMAS.get(resource)
    if schema is None:
        return []
    causes: list[dict[str, str]] = []
    props = schema["properties"]
    for name in schema.get("required", []):
        if obj.get(name) is None:
            causes.append(_cause("FieldValueRequired", "Required value", name))
    for name in list(obj):
        if name in props:
            if obj[name] is not None:
                causes.extend(check(props[name], obj[name], name))
        elif name not in ("apiVersion", "kind", "metadata"):
            del obj[name]
    old_claims = (old or {}).get("spec", {}).get("volumeClaimTemplates")
    if (
        resource is SANDBOXES
        and old is not None
        and not causes
        and obj["spec"].get("volumeClaimTemplates") != old_claims
    ):
        causes.append(
            _cause("FieldValueInvalid", f'Invalid value: "object": failed rule: {VOLUME_CLAIMS_IMMUTABLE}', "spec")
        )
    return causes


def definition(resource: Resource) -> dict[str, Any]:
    """The CustomResourceDefinition object as `kubectl get crd -o json` shows it."""
    name = f"{resource.plural}.{resource.group}"
    names = {
        "kind": resource.kind,
        "listKind": resource.list_kind,
        "plural": resource.plural,
        "shortNames": list(resource.short_names),
        "singular": resource.singular,
    }
    subresources: dict[str, Any] = {}
    if "status" in resource.subresources:
        subresources["status"] = {}
    if "scale" in resource.subresources:
        subresources["scale"] = {
            "labelSelectorPath": ".status.selector",
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
        }
    columns = [{"jsonPath": path, "name": col, "type": "string"} for col, path in PRINTER_COLUMNS.get(resource, [])]
    columns.append({"jsonPath": ".metadata.creationTimestamp", "name": "Age", "type": "date"})
    version: dict[str, Any] = {
        "name": resource.version,
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                **copy.deepcopy(SCHEMAS[resource]),
                "properties": {
                    "apiVersion": _str(),
                    "kind": _str(),
                    "metadata": {"type": "object"},
                    **SCHEMAS[resource]["properties"],
                },
            }
        },
        "additionalPrinterColumns": columns,
    }
    if subresources:
        version["subresources"] = subresources
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "annotations": {"controller-gen.kubebuilder.io/version": "v0.19.0"}},
        "spec": {"group": resource.group, "names": names, "scope": "Namespaced", "versions": [version]},
        "status": {
            "acceptedNames": names,
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                },
            ],
            "storedVersions": [resource.version],
        },
    }
