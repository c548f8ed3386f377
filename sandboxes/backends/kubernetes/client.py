"""The official client's `ApiClient` built from a backend's settings (`api_client`), guarded, and
its errors translated (`translated`, `remote_error`).

Three ways to the cluster (`settings.check` makes an admin give exactly one):
- the API server URL + token (+ CA): a `Configuration` with the bearer token and the CA's PEM
  (`ca_cert_data`, no temporary file); the URL is `BackendConfig.endpoint` (or the option
  `api_url`), the token `BackendConfig.api_key` (or `token`), the CA `tls_ca` (or `ca_cert`);
- `kubeconfig`: its current context, read by the client's own `KubeConfigLoader`; what
  `kubeconfig.parse_kubeconfig` refuses (exec and auth-provider plugins, which would run a
  program on the console's host; paths; insecure TLS) is refused before it runs;
- `in_cluster`: the pod's service account (`InClusterConfigLoader`).

The endpoint guard: a URL an admin gave (or a kubeconfig's server) is resolved and checked
once here (`guard.check_endpoint`, private addresses only with the config's opt-in; plain
`http://` only to private ones, since every request carries the credentials), and the
client is pinned to the checked address for its whole life: `host` becomes the address, the
name stays the TLS server name (`tls_server_name`: SNI and certificate check), so a name that
re-resolves later is never followed; no proxy is used (neither the environment's nor a
kubeconfig's `proxy-url`). Clients of their own (kexec's websocket) dial `configuration.host`
and keep `tls_server_name` too. The in-cluster address comes from the pod's
environment, not from an admin, and is not judged.

May import: the contract, `guard`, `.settings` and the `kubernetes` client.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import KubeConfigLoader

from ..base import BackendConfig, ErrorKind, RemoteError
from ..guard import Resolver, address_problem, check_endpoint, system_resolver
from . import kubeconfig
from .settings import KubernetesOptions

REQUEST_TIMEOUT_S = 30.0


def options_of(config: BackendConfig) -> KubernetesOptions:
    return KubernetesOptions.parse(config.options)


def api_client(config: BackendConfig, *, resolver: Resolver = system_resolver) -> k8s.ApiClient:
    """An `ApiClient` for the cluster `config` names (kexec, kops and kimage build theirs here).

    Raises RemoteError: `invalid` for settings that name no cluster or a kubeconfig it will not
    load, `forbidden` for an address the guard refuses."""
    options = options_of(config)
    configuration = k8s.Configuration()
    if options.in_cluster:
        _load_in_cluster(configuration)
    elif options.kubeconfig:
        _load_kubeconfig(configuration, options.kubeconfig)
        _pin(configuration, allow_private=config.allow_private_endpoints, resolver=resolver)
    else:
        url = (options.api_url or config.endpoint).rstrip("/")
        if not url:
            raise RemoteError(
                ErrorKind.INVALID, "no way to the cluster: give an API server URL, a kubeconfig or in-cluster"
            )
        configuration.host = url
        token = options.token or config.api_key
        if token:
            configuration.api_key = {"authorization": token}
            configuration.api_key_prefix = {"authorization": "Bearer"}
        ca = options.ca_cert or options.tls_ca
        if ca:
            configuration.ca_cert_data = ca
        _pin(configuration, allow_private=config.allow_private_endpoints, resolver=resolver)
    configuration.retries = False  # the contract's callers retry; a hidden retry doubles a create
    # Never through a proxy from the environment or a kubeconfig's proxy-url: the guard judged
    # the API server's address, and that is the only one dialled.
    configuration.proxy = None
    return k8s.ApiClient(configuration)


def _load_in_cluster(configuration: k8s.Configuration) -> None:
    """The pod's service account, from the folder `kubeconfig` reads it from (the form checks the
    same one); the client's loader re-reads the rotated token as it expires."""
    folder = kubeconfig.SERVICE_ACCOUNT_DIR
    try:
        InClusterConfigLoader(token_filename=str(folder / "token"), cert_filename=str(folder / "ca.crt")).load_and_set(
            configuration
        )
    except ConfigException as exc:
        raise RemoteError(ErrorKind.INVALID, f"in-cluster service account: {exc}", retryable=False) from None


def _load_kubeconfig(configuration: k8s.Configuration, text: str) -> None:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RemoteError(ErrorKind.INVALID, f"the kubeconfig is not YAML: {exc}", retryable=False) from None
    if not isinstance(document, dict):
        raise RemoteError(ErrorKind.INVALID, "the kubeconfig is not a YAML mapping", retryable=False)
    try:  # what the console will not use, refused as the form refuses it (exec plugins, paths, ...)
        kubeconfig.parse_kubeconfig(text)
    except kubeconfig.KubeconfigError as exc:
        raise RemoteError(ErrorKind.INVALID, f"the kubeconfig cannot be used: {exc}", retryable=False) from None
    try:
        KubeConfigLoader(config_dict=document).load_and_set(configuration)
    except (ConfigException, KeyError, TypeError, ValueError) as exc:
        raise RemoteError(ErrorKind.INVALID, f"the kubeconfig cannot be used: {exc}", retryable=False) from None


def _pin(configuration: k8s.Configuration, *, allow_private: bool, resolver: Resolver) -> None:
    """Check the API server's address and pin the client to it (the name stays its TLS name)."""
    parts = urlsplit(configuration.host)
    host = parts.hostname or ""
    addresses = check_endpoint(configuration.host, allow_private=allow_private, resolver=resolver)
    if parts.scheme == "http" and any(address_problem(a, allow_private=False) is None for a in addresses):
        raise RemoteError(
            ErrorKind.INVALID,
            f"{host} is a public address: plain http:// would send the cluster's credentials in the clear; "
            "use https://",
            retryable=False,
        )
    pinned = addresses[0]
    if pinned == host:
        return
    netloc = f"[{pinned}]" if ":" in pinned else pinned
    if parts.port is not None:
        netloc += f":{parts.port}"
    configuration.host = urlunsplit(parts._replace(netloc=netloc))
    if not configuration.tls_server_name:
        configuration.tls_server_name = host


# ---------------------------------------------------------------------------------------
# Errors

_BY_STATUS = {
    400: ErrorKind.INVALID,
    401: ErrorKind.UNAUTHORIZED,
    403: ErrorKind.FORBIDDEN,
    404: ErrorKind.NOT_FOUND,
    409: ErrorKind.CONFLICT,
    410: ErrorKind.GONE,
    422: ErrorKind.INVALID,
    429: ErrorKind.RATE_LIMITED,
    500: ErrorKind.INTERNAL,
    503: ErrorKind.UNAVAILABLE,
    504: ErrorKind.TIMEOUT,
}


def status_of(exc: k8s.ApiException) -> dict[str, Any]:
    """The metav1.Status an API error carries (kind Status, reason, message, details), or {}."""
    try:
        body = json.loads(exc.body or b"")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


def remote_error(exc: k8s.ApiException, what: str) -> RemoteError:
    """An API error as the contract's, in words: what was being done, the API's reason and message."""
    status = status_of(exc)
    code = int(exc.status or 0)
    kind = _BY_STATUS.get(code, ErrorKind.INTERNAL if code >= 500 else ErrorKind.INVALID)
    message = str(status.get("message") or exc.reason or f"HTTP {code}")
    reason = status.get("reason") or ""
    if code == 403:
        message = f"the cluster refused it (the console's account lacks a permission): {message}"
    elif code == 401:
        message = f"the cluster did not accept the console's credentials: {message}"
    detail = f"{what}: {message}" + (f" ({reason})" if reason and reason not in message else "")
    retry_after = _retry_after(exc)
    return RemoteError(kind, detail, retry_after=retry_after)


def _retry_after(exc: k8s.ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value else None
    except ValueError:
        return None


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Every failure of a call to the cluster as a RemoteError saying `what` was being done."""
    try:
        yield
    except RemoteError:
        raise
    except k8s.ApiException as exc:
        raise remote_error(exc, what) from None
    except urllib3.exceptions.SSLError as exc:
        raise RemoteError(
            ErrorKind.UNAVAILABLE, f"{what}: TLS with the API server failed ({exc}); check its CA", retryable=False
        ) from None
    except (
        urllib3.exceptions.NewConnectionError,
        urllib3.exceptions.MaxRetryError,
        urllib3.exceptions.ProtocolError,
        ConnectionError,
    ) as exc:
        raise RemoteError(ErrorKind.UNAVAILABLE, f"{what}: the API server did not answer ({exc})") from None
    except (urllib3.exceptions.TimeoutError, TimeoutError) as exc:
        raise RemoteError(ErrorKind.TIMEOUT, f"{what}: the API server did not answer in time ({exc})") from None


def call(what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`function(*args, **kwargs)` with its failures translated."""
    with translated(what):
        return function(*args, **kwargs)


def call_unless(
    kinds: tuple[ErrorKind, ...], what: str, function: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """`call`, answering None for a failure of one of `kinds` (a delete of what is gone, a
    create of what is there)."""
    try:
        return call(what, function, *args, **kwargs)
    except RemoteError as exc:
        if exc.kind in kinds:
            return None
        raise
