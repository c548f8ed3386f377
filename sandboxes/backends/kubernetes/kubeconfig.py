"""A cluster's address and credentials, from a pasted kubeconfig or from the pod's own service
account: what "Connect a cluster" turns into the backend's settings (`ClusterAccess.settings`).

A kubeconfig (the `kind: Config` file `kubectl` reads) gives one context: its cluster's
`server` and `certificate-authority-data`, its user's bearer `token` or client certificate
and key (`client-certificate-data`, `client-key-data`), and its namespace. What the console
cannot honour is refused with the reason, never dropped:

- `exec` and `auth-provider` users: they run a program on the admin's machine (aws, gcloud,
  kubelogin) to get a short-lived token; the console cannot run a local binary, so it asks
  for a service account's token instead (docs/kubernetes.md says how to make one);
- `insecure-skip-tls-verify`: the token would go to whoever answers;
- paths (`certificate-authority`, `client-certificate`, `client-key`, `tokenFile`): they name
  files on the admin's machine (`kubectl config view --minify --flatten --raw` inlines them);
- `proxy-url`, basic auth (`username`/`password`, removed from Kubernetes in 1.19), a plain
  `http://` server.

The in-cluster service account is read from /var/run/secrets/kubernetes.io/serviceaccount
(`token`, `ca.crt`, `namespace`) and `KUBERNETES_SERVICE_HOST`/`_PORT`, as the pods' own
clients do. Its token is rotated by the kubelet, so it is never stored: the setting
`in_cluster` says to read it afresh (`in_cluster_access` at each use).

Imports nothing of the project and no Django.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ..settings import REDACTED, Filled, Given

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_KUBECONFIG_BYTES = 512 * 1024

EXEC_REFUSED = (
    "The user {user!r} gets its token by running a program on your machine ({how}); the console "
    "cannot run a local binary. Give it a service account's token instead: create the ServiceAccount "
    "of docs/kubernetes.md, then `kubectl create token sandbox-console -n <namespace> --duration=8760h`, "
    "and paste a kubeconfig with that token (or the token itself)."
)
FLATTEN = "`kubectl config view --minify --flatten --raw` inlines it"


class KubeconfigError(ValueError):
    """What is wrong with a kubeconfig or the service account, in words for the admin."""


@dataclass(frozen=True)
class ClusterAccess:
    """One cluster as the console reaches it. Exactly one credential: `token`, or
    `client_cert` with `client_key` (PEM); with `in_cluster` the token is the pod's own."""

    api_url: str
    ca_cert: str = ""  # PEM; "" trusts the system's certificate authorities
    token: str = field(default="", repr=False)
    client_cert: str = ""
    client_key: str = field(default="", repr=False)
    namespace: str = ""
    context: str = ""  # the kubeconfig context it came from
    in_cluster: bool = False

    def settings(self) -> dict[str, Any]:
        """The backend's settings this fills (names of `sandboxes.backends.kubernetes.settings`:
        the API server URL, its CA and the token under every kind's `endpoint`, `tls_ca`,
        `api_key`), one way to the cluster: the URL, CA and token; or, for a client certificate
        (which has no setting of its own), a kubeconfig of this one context
        (`single_context_kubeconfig`); or the in-cluster switch (its token is rotated, so never
        stored)."""
        values: dict[str, Any] = {"endpoint": "", "tls_ca": "", "api_key": "", "in_cluster": self.in_cluster}
        if self.namespace:
            values["namespace"] = self.namespace
        if self.client_cert:
            values["kubeconfig"] = self.single_context_kubeconfig()
        elif not self.in_cluster:
            values.update(endpoint=self.api_url, tls_ca=self.ca_cert, api_key=self.token)
        return values

    def single_context_kubeconfig(self) -> str:
        """A kubeconfig of this context alone, everything inline (nothing else of the pasted one)."""
        user: dict[str, str] = {}
        if self.token:
            user["token"] = self.token
        if self.client_cert:
            user["client-certificate-data"] = _b64(self.client_cert)
            user["client-key-data"] = _b64(self.client_key)
        cluster: dict[str, str] = {"server": self.api_url}
        if self.ca_cert:
            cluster["certificate-authority-data"] = _b64(self.ca_cert)
        context: dict[str, str] = {"cluster": "cluster", "user": "user"}
        if self.namespace:
            context["namespace"] = self.namespace
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "console",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "console", "context": context}],
        }
        return str(yaml.safe_dump(document, sort_keys=False))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def context_names(text: str) -> list[str]:
    """The contexts a kubeconfig offers (to choose one), current first; [] if it cannot be read."""
    try:
        document = _load(text)
    except KubeconfigError:
        return []
    names = [str(entry.get("name")) for entry in _named_list(document, "contexts") if entry.get("name")]
    current = str(document.get("current-context") or "")
    return sorted(names, key=lambda name: name != current)


def parse_kubeconfig(text: str, context: str = "") -> ClusterAccess:
    """The cluster and credentials of `context` (else the current context, else the only one)."""
    document = _load(text)
    contexts = {str(e.get("name")): e.get("context") for e in _named_list(document, "contexts")}
    if not contexts:
        raise KubeconfigError("The kubeconfig has no contexts.")
    chosen = context or str(document.get("current-context") or "")
    if not chosen and len(contexts) == 1:
        chosen = next(iter(contexts))
    if not chosen:
        raise KubeconfigError(f"The kubeconfig names no current context; choose one of {_names(contexts)}.")
    if chosen not in contexts:
        raise KubeconfigError(f"The kubeconfig has no context {chosen!r}; it has {_names(contexts)}.")
    entry = contexts[chosen]
    if not isinstance(entry, Mapping):
        raise KubeconfigError(f"The context {chosen!r} is empty.")
    cluster_name, user_name = str(entry.get("cluster") or ""), str(entry.get("user") or "")
    cluster = _entry(document, "clusters", "cluster", cluster_name, chosen)
    user = _entry(document, "users", "user", user_name, chosen)
    api_url = _server(cluster, cluster_name)
    ca_cert = _cluster_ca(cluster, cluster_name)
    token, client_cert, client_key = _credentials(user, user_name)
    namespace = str(entry.get("namespace") or "")
    return ClusterAccess(
        api_url=api_url,
        ca_cert=ca_cert,
        token=token,
        client_cert=client_cert,
        client_key=client_key,
        namespace=namespace,
        context=chosen,
    )


def fill_settings(given: Given) -> Filled:
    """The kind's `fill` (`SettingsSchema.fill`): a kubeconfig pasted now gives the API URL,
    CA and token (over what the fields hold; the kubeconfig itself is then not stored, and a
    stored one is removed: `clear_kubeconfig`) or, for a client certificate, a kubeconfig of
    the chosen context alone; the in-cluster switch is checked against the pod it runs in
    (and removes a stored kubeconfig too). Either gives the namespace when none was typed."""
    text = str(given.get("kubeconfig") or "").strip()
    if text and text != REDACTED:
        try:
            access = parse_kubeconfig(text, str(given.get("kubeconfig_context") or "").strip())
        except KubeconfigError as exc:
            return Filled(problems={"kubeconfig": str(exc)})
        values = access.settings()
    elif given.get("in_cluster"):
        try:
            access = in_cluster_access()
        except KubeconfigError as exc:
            return Filled(problems={"in_cluster": str(exc)})
        values = {}
    else:
        return Filled()
    if "kubeconfig" not in values:  # a stored one would be a second way in: removed on save
        values.update(kubeconfig="", clear_kubeconfig=True)
    if access.namespace and not given.get("namespace"):
        values["namespace"] = access.namespace
    else:
        values.pop("namespace", None)
    return Filled(values=values)


def in_cluster_access(root: Path | None = None, environ: Mapping[str, str] | None = None) -> ClusterAccess:
    """The pod's own service account: its token, the cluster's CA and namespace, and the API
    server from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`."""
    root = SERVICE_ACCOUNT_DIR if root is None else root
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeconfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: the console does not run "
            "in a Kubernetes pod. Paste a kubeconfig instead."
        )
    token = _read(root / "token", "token").strip()
    ca_cert = _read(root / "ca.crt", "CA certificate")
    if not _is_pem(ca_cert, "CERTIFICATE"):
        raise KubeconfigError(f"{root / 'ca.crt'} holds no PEM certificate.")
    namespace_file = root / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else ""
    if not token:
        raise KubeconfigError(f"{root / 'token'} is empty: the pod's service account token is not mounted.")
    bracketed = f"[{host}]" if ":" in host else host
    return ClusterAccess(
        api_url=f"https://{bracketed}:{port}", ca_cert=ca_cert, token=token, namespace=namespace, in_cluster=True
    )


# --- reading ------------------------------------------------------------------------------


def _load(text: str) -> Mapping[str, Any]:
    if len(text.encode()) > MAX_KUBECONFIG_BYTES:
        raise KubeconfigError(f"The kubeconfig is over {MAX_KUBECONFIG_BYTES // 1024} KiB; paste one context.")
    try:
        document = yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except RecursionError:  # PyYAML composes nested collections recursively
        raise KubeconfigError("The kubeconfig is nested deeper than any kubeconfig is.") from None
    except _AliasRefused:
        raise KubeconfigError(
            "The kubeconfig uses YAML anchors and aliases (&name, *name); kubectl never writes them. "
            "Paste the output of `kubectl config view --minify --flatten --raw`."
        ) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise KubeconfigError(f"The kubeconfig is not valid YAML{at}.") from None
    if not isinstance(document, Mapping) or (document.get("kind") not in (None, "Config")):
        raise KubeconfigError("This is not a kubeconfig (a YAML document of kind Config, as `kubectl` reads).")
    return document


class _AliasRefused(Exception):
    pass


class _NoAliasLoader(yaml.SafeLoader):
    """A safe loader refusing aliases: a few hundred bytes of nested aliases (a "billion laughs")
    would otherwise expand into gigabytes as soon as a value is turned into text."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _AliasRefused
        return super().compose_node(parent, index)


def _named_list(document: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = document.get(key) or []
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise KubeconfigError(f"The kubeconfig's {key} must be a list of named entries.")
    return items


def _names(entries: Mapping[str, Any]) -> str:
    return ", ".join(repr(name) for name in entries)


def _entry(document: Mapping[str, Any], key: str, inner: str, name: str, context: str) -> Mapping[str, Any]:
    if not name:
        raise KubeconfigError(f"The context {context!r} names no {inner}.")
    for item in _named_list(document, key):
        if str(item.get("name")) == name:
            value = item.get(inner)
            if not isinstance(value, Mapping):
                raise KubeconfigError(f"The {inner} {name!r} is empty.")
            return value
    raise KubeconfigError(f"The context {context!r} names the {inner} {name!r}, which the kubeconfig lacks.")


def _server(cluster: Mapping[str, Any], name: str) -> str:
    server = str(cluster.get("server") or "").strip().rstrip("/")
    if not server:
        raise KubeconfigError(f"The cluster {name!r} has no server.")
    parts = urlsplit(server)
    shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()  # never a password in words
    if "@" in parts.netloc:
        raise KubeconfigError(
            f"The cluster {name!r} has credentials in its server's URL ({shown!r}); they do not belong there: "
            "give the user a token or a client certificate."
        )
    if parts.scheme != "https" or not parts.hostname:
        raise KubeconfigError(
            f"The cluster {name!r} has the server {shown!r}; the console sends a token, so only https:// "
            "API servers are accepted."
        )
    if cluster.get("insecure-skip-tls-verify"):
        raise KubeconfigError(
            f"The cluster {name!r} sets insecure-skip-tls-verify: the console would send its token to whoever "
            "answers. Give the cluster's certificate-authority-data instead."
        )
    if cluster.get("proxy-url"):
        raise KubeconfigError(f"The cluster {name!r} sets a proxy-url; the console dials the API server directly.")
    return server


def _cluster_ca(cluster: Mapping[str, Any], name: str) -> str:
    if cluster.get("certificate-authority") and not cluster.get("certificate-authority-data"):
        raise KubeconfigError(
            f"The cluster {name!r} names its CA by a path on your machine "
            f"({cluster['certificate-authority']!r}); {FLATTEN}."
        )
    data = cluster.get("certificate-authority-data")
    if not data:
        return ""
    return _decoded_pem(data, "CERTIFICATE", f"the cluster {name!r}'s certificate-authority-data")


def _credentials(user: Mapping[str, Any], name: str) -> tuple[str, str, str]:
    """(token, client certificate, client key) of a user, refusing what the console cannot use."""
    if user.get("exec"):
        plugin = user["exec"]
        command = plugin.get("command", "a program") if isinstance(plugin, Mapping) else "a program"
        raise KubeconfigError(EXEC_REFUSED.format(user=name, how=f"exec plugin {command!r}"))
    if user.get("auth-provider"):
        provider = user["auth-provider"]
        which = provider.get("name", "?") if isinstance(provider, Mapping) else "?"
        raise KubeconfigError(EXEC_REFUSED.format(user=name, how=f"auth-provider plugin {which!r}"))
    for key in ("tokenFile", "client-certificate", "client-key"):
        if user.get(key) and not user.get(f"{key}-data") and not (key == "tokenFile" and user.get("token")):
            raise KubeconfigError(f"The user {name!r} names its {key} by a path on your machine; {FLATTEN}.")
    if user.get("username") or user.get("password"):
        raise KubeconfigError(
            f"The user {name!r} uses a username and password (basic auth, removed in Kubernetes 1.19); "
            "give a service account's token."
        )
    token = str(user.get("token") or "").strip()
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    if token and (cert_data or key_data):
        raise KubeconfigError(f"The user {name!r} has both a token and a client certificate; keep one.")
    if token:
        if not is_header_safe(token):
            raise KubeconfigError(f"The user {name!r}'s token has spaces or control characters.")
        return token, "", ""
    if cert_data and key_data:
        cert = _decoded_pem(cert_data, "CERTIFICATE", f"the user {name!r}'s client-certificate-data")
        key = _decoded_pem(key_data, "PRIVATE KEY", f"the user {name!r}'s client-key-data")
        return "", cert, key
    if cert_data or key_data:
        raise KubeconfigError(f"The user {name!r} has a client certificate or key without the other.")
    raise KubeconfigError(f"The user {name!r} has no credentials (a token, or a client certificate and key).")


def is_header_safe(token: str) -> bool:
    """A bearer token fit for an Authorization header: no space, no control character (a newline
    would make the HTTP client refuse the header and quote it, token and all, in its error)."""
    return not any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in token)


def _decoded_pem(data: Any, kind: str, what: str) -> str:
    try:
        text = base64.b64decode(str(data), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise KubeconfigError(f"{what[:1].upper()}{what[1:]} is not base64 of PEM text.") from None
    if not _is_pem(text, kind):
        raise KubeconfigError(f"{what[:1].upper()}{what[1:]} holds no PEM {kind.lower()}.")
    return text.strip() + "\n"


def _is_pem(text: str, kind: str) -> bool:
    """PEM of `kind` (a key matches "PRIVATE KEY" as RSA, EC or PKCS#8)."""
    begin = next((line for line in text.splitlines() if line.startswith("-----BEGIN ")), "")
    return begin.endswith(f"{kind}-----") and "-----END " in text


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise KubeconfigError(
            f"No service account {what} at {path}: the pod runs without a mounted service account "
            "(automountServiceAccountToken: false?)."
        ) from None
    except OSError as exc:
        raise KubeconfigError(f"The service account {what} at {path} cannot be read: {exc.strerror}.") from None
