"""What a Kubernetes backend takes from the admins (`SCHEMA`) and the typed options its adapter
reads (`KubernetesOptions`); no Django, no Kubernetes client (the console reads it to build
its forms).

How the console reaches the cluster, one of three ways (`check` refuses none or two):
- the API server URL with a bearer token (a service account's) and, for a private CA, the
  CA's PEM. They are declared under the names every kind's endpoint, credential and CA have
  (`endpoint`, `api_key`, `tls_ca`: the platform backend's columns, `BackendConfig.endpoint`
  and `.api_key`, the endpoint guard and the identity check of a platform backend read
  them); `KubernetesOptions.api_url`, `.token` and `.ca_cert` are the same values under the
  names the adapter's callers may also hand in;
- `kubeconfig` (its current context; exec and auth-provider plugins are refused by `client`);
- `in_cluster`: the console runs in a pod and uses its own service account.

Where sandboxes go: `namespace` holds them all (`namespace_mode` `shared`, told apart by
labels), or is the prefix of one namespace per space (`per_space`). `storage_class` and
`workspace_size` make each sandbox's /workspace claim, `runtime_class` its pods' RuntimeClass
(gVisor, Kata). The registry fields are declared here for the skill images
(`kubernetes/images.py`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..settings import Given, Options, Setting, SettingsSchema, SettingType, secret_field
from .kubeconfig import fill_settings, is_header_safe

SHARED = "shared"
PER_SPACE = "per_space"
NAMESPACE_MODES = ((SHARED, "One namespace, sandboxes told apart by labels"), (PER_SPACE, "One namespace per space"))
DEFAULT_NAMESPACE = "sandboxes"
DEFAULT_WORKSPACE_SIZE = "10Gi"

# RFC 1123 label (namespaces), subdomain (storage and runtime classes), a quantity (sizes).
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
# The longest namespace prefix that still leaves room for "-" and a space's 36-character id.
PER_SPACE_PREFIX_MAX = 63 - 37


@dataclass(frozen=True, kw_only=True)
class KubernetesOptions(Options):
    """What the Kubernetes adapter reads (docs/kubernetes.md). Empty: the adapter's default."""

    api_url: str = ""  # else BackendConfig.endpoint
    ca_cert: str = ""  # else `tls_ca`
    tls_ca: str = secret_field()  # the console offers every kind's CA under this name
    token: str = secret_field()  # else BackendConfig.api_key
    kubeconfig: str = secret_field()
    in_cluster: bool = False
    namespace: str = ""
    namespace_mode: str = SHARED
    storage_class: str = ""
    runtime_class: str = ""
    workspace_size: str = ""
    registry_url: str = ""
    registry_username: str = ""
    registry_password: str = secret_field()
    # Seconds a create or resume waits for the claim's Ready (None: `claims.READY_TIMEOUT_S`).
    ready_timeout: float | None = None
    # Seconds per API request (None: `client.REQUEST_TIMEOUT_S`).
    request_timeout: float | None = None


def _api_url_problem(url: str) -> str | None:
    if url.startswith(("https://", "http://")):
        return None
    return "The API server URL starts with https:// (or http:// on a private network)."


def _token_problem(token: str) -> str | None:
    return None if is_header_safe(str(token).strip()) else "A bearer token has no spaces or control characters."


def _namespace_problem(name: str) -> str | None:
    if len(name) <= 63 and _DNS_LABEL.match(name):
        return None
    return f"{name!r} is not a namespace name: lowercase letters, digits and '-', at most 63 characters."


def _class_problem(name: str) -> str | None:
    if len(name) <= 253 and _DNS_SUBDOMAIN.match(name):
        return None
    return f"{name!r} is not a class name: lowercase letters, digits, '-' and '.'."


def _size_problem(size: str) -> str | None:
    if _QUANTITY.match(size):
        return None
    return f"{size!r} is not a size Kubernetes reads: a number and a unit such as 10Gi or 512Mi."


def _registry_problem(url: str) -> str | None:
    if url.startswith(("https://", "http://")):
        return None
    return "The registry URL starts with https:// (or http:// on a private network)."


def _pem_problem(value: str) -> str | None:
    if "-----BEGIN CERTIFICATE" in value:
        return None
    return "Paste the CA's PEM text (-----BEGIN CERTIFICATE…)."


def _kubeconfig_problem(value: str) -> str | None:
    if "clusters" in value and "contexts" in value:
        return None
    return "Paste the whole kubeconfig file (YAML with clusters, users and contexts)."


def check(given: Given, schema: SettingsSchema) -> dict[str, str]:
    """Exactly one way to the cluster; a per-space prefix short enough for a space's id."""
    problems: dict[str, str] = {}
    ways = [
        name
        for name, given_now in (
            ("endpoint", bool(given.get("endpoint"))),
            ("kubeconfig", given.has_secret("kubeconfig") and not given.get("clear_kubeconfig")),
            ("in_cluster", bool(given.get("in_cluster"))),
        )
        if given_now
    ]
    if not ways:
        problems["endpoint"] = (
            "Kubernetes backends need a way to the cluster: an API server URL with a token, a kubeconfig, "
            "or the in-cluster service account."
        )
    elif len(ways) > 1:
        problems[ways[1]] = "Give one way to the cluster: an API server URL, a kubeconfig or in-cluster, not several."
    elif ways == ["endpoint"] and not given.has_secret("api_key"):
        problems["api_key"] = "An API server URL needs a bearer token (a service account's)."
    namespace = str(given.get("namespace") or DEFAULT_NAMESPACE)
    if given.get("namespace_mode") == PER_SPACE and len(namespace) > PER_SPACE_PREFIX_MAX:
        problems["namespace"] = (
            f"With one namespace per space the namespace is a prefix of at most {PER_SPACE_PREFIX_MAX} characters."
        )
    if (given.get("registry_username") or given.has_secret("registry_password")) and not given.get("registry_url"):
        problems["registry_url"] = "A registry user or password needs the registry's URL."
    return problems


API_URL = Setting(
    "endpoint",
    "API server URL",
    SettingType.ENDPOINT,
    help="The cluster API server, e.g. https://kubernetes.example.test:6443. Empty with a kubeconfig or in-cluster.",
    validate=_api_url_problem,
    dials=lambda url: url,
)

SCHEMA = SettingsSchema(
    label="Kubernetes",
    options=KubernetesOptions,
    check=check,
    fill=fill_settings,  # a pasted kubeconfig becomes the URL, CA and token (`kubeconfig`)
    settings=(
        API_URL,
        Setting(
            "tls_ca",
            "API server CA (PEM)",
            SettingType.PEM,
            secret=True,
            validate=_pem_problem,
            help="The CA that signed the API server's certificate. Empty: the system's CAs. Stored encrypted; "
            "leave *** (or empty) to keep it.",
        ),
        Setting(
            "api_key",
            "Bearer token",
            secret=True,
            max_length=8192,
            validate=_token_problem,
            help="A service account's token (docs/kubernetes.md has the RBAC it needs). Stored encrypted; "
            "leave *** to keep it.",
        ),
        Setting(
            "kubeconfig",
            "Kubeconfig",
            SettingType.PEM,
            secret=True,
            validate=_kubeconfig_problem,
            max_length=65536,
            help="Instead of the URL, CA and token: paste a kubeconfig (`kubectl config view --minify --flatten "
            "--raw`). Its context's server, CA and token fill the fields above and the file is not kept; a client "
            "certificate is kept as a kubeconfig of that context alone, encrypted. No exec or auth-provider "
            "plugins: the console cannot run a program on your machine.",
        ),
        Setting(
            "clear_kubeconfig",
            "Remove the stored kubeconfig",
            SettingType.BOOL,
            clears=("kubeconfig",),
            help="Ticked: the stored kubeconfig is removed on save (a kubeconfig pasted with a token, or "
            "in-cluster, removes it too).",
        ),
        Setting(
            "kubeconfig_context",
            "Kubeconfig context",
            max_length=253,
            help="The pasted kubeconfig's context to use. Empty: its current context. Not stored.",
        ),
        Setting(
            "in_cluster",
            "Use the in-cluster service account",
            SettingType.BOOL,
            help="The console runs in the cluster: use its pod's service account and the API server it is given.",
        ),
        Setting(
            "namespace",
            "Namespace",
            validate=_namespace_problem,
            max_length=63,
            help=f"Where sandboxes go (empty: {DEFAULT_NAMESPACE}); with one namespace per space, the prefix of "
            "each space's namespace.",
        ),
        Setting(
            "namespace_mode",
            "Namespaces",
            SettingType.CHOICE,
            choices=NAMESPACE_MODES,
            help="One shared namespace (sandboxes carry their space as a label), or one namespace per space "
            "(the console creates it, and needs the right to).",
        ),
        Setting(
            "storage_class",
            "Storage class",
            validate=_class_problem,
            help="The StorageClass of each sandbox's /workspace volume. Empty: the cluster's default.",
        ),
        Setting(
            "runtime_class",
            "RuntimeClass",
            validate=_class_problem,
            help="The RuntimeClass sandbox pods run under, e.g. gvisor or kata. Empty: the nodes' default runtime.",
        ),
        Setting(
            "workspace_size",
            "Workspace size",
            validate=_size_problem,
            help=f"Each sandbox's /workspace volume, e.g. 10Gi (empty: {DEFAULT_WORKSPACE_SIZE}).",
        ),
        Setting(
            "registry_url",
            "Image registry URL",
            SettingType.URL,
            validate=_registry_problem,
            help="Where skill images are pushed and pulled from (OCI distribution API), e.g. "
            "https://registry.example.test. Empty: no skill images.",
        ),
        Setting("registry_username", "Registry user", help="The registry's user name (empty: anonymous)."),
        Setting(
            "registry_password",
            "Registry password",
            secret=True,
            max_length=4096,
            help="The registry user's password or token. Stored encrypted; leave *** to keep it.",
        ),
    ),
)
