"""The settings Kubernetes declares (`sandboxes/backends/kubernetes/settings.py`) and the client
built from them (`client.py`): one way to the cluster, names Kubernetes accepts, the
kubeconfig's plugins refused, the API server's address judged by the guard and pinned."""

from __future__ import annotations

import pytest

from sandboxes.backends import describe
from sandboxes.backends.base import BackendConfig, ErrorKind, RemoteError
from sandboxes.backends.kubernetes.client import api_client
from sandboxes.backends.kubernetes.settings import SCHEMA, KubernetesOptions
from sandboxes.backends.settings import Given, SettingType

GOOD = {"endpoint": "https://k8s.example.test:6443", "api_key": "a-token"}

KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://api.cluster.test:6443"}
users:
- name: u
  user: {token: abc}
contexts:
- name: x
  context: {cluster: c, user: u, namespace: team}
current-context: x
"""


def test_kubernetes_declares_the_ways_to_a_cluster_and_where_sandboxes_go() -> None:
    assert describe("kubernetes") is SCHEMA
    declared = {s.name: (s.type, s.secret) for s in SCHEMA.settings}
    assert declared["endpoint"] == (SettingType.ENDPOINT, False)
    assert declared["api_key"] == (SettingType.TEXT, True)
    assert declared["tls_ca"] == (SettingType.PEM, True)
    assert declared["kubeconfig"] == (SettingType.PEM, True)
    assert declared["registry_password"] == (SettingType.TEXT, True)
    assert {"in_cluster", "namespace", "namespace_mode", "storage_class", "runtime_class", "workspace_size"} <= set(
        declared
    )
    assert SCHEMA.problems(Given(GOOD)) == {}
    assert SCHEMA.problems(Given({"kubeconfig": KUBECONFIG})) == {}
    assert SCHEMA.problems(Given({"in_cluster": True})) == {}


@pytest.mark.parametrize(
    ("given", "field", "message"),
    [
        ({}, "endpoint", "need a way to the cluster"),
        ({"endpoint": "https://k8s.example.test"}, "api_key", "needs a bearer token"),
        ({**GOOD, "in_cluster": True}, "in_cluster", "Give one way to the cluster"),
        ({**GOOD, "endpoint": "k8s.example.test:6443"}, "endpoint", "starts with https://"),
        ({**GOOD, "namespace": "Team_A"}, "namespace", "is not a namespace name"),
        ({**GOOD, "namespace": "a" * 30, "namespace_mode": "per_space"}, "namespace", "a prefix of at most 26"),
        ({**GOOD, "storage_class": "fast ssd"}, "storage_class", "is not a class name"),
        ({**GOOD, "runtime_class": "gVisor"}, "runtime_class", "is not a class name"),
        ({**GOOD, "workspace_size": "10 gigs"}, "workspace_size", "is not a size Kubernetes reads"),
        ({**GOOD, "tls_ca": "not pem"}, "tls_ca", "PEM text"),
        ({**GOOD, "api_key": "s3cret\nX-Injected: 1"}, "api_key", "spaces or control characters"),
        ({**GOOD, "api_key": "s3c ret"}, "api_key", "spaces or control characters"),
        ({"kubeconfig": "just: text"}, "kubeconfig", "whole kubeconfig"),
        ({**GOOD, "registry_username": "bot"}, "registry_url", "needs the registry's URL"),
        ({**GOOD, "registry_url": "registry.test"}, "registry_url", "starts with https://"),
    ],
)
def test_bad_settings_are_named_in_words(given: dict[str, object], field: str, message: str) -> None:
    problems = SCHEMA.problems(Given(given))
    assert message in problems.get(field, ""), problems
    assert "s3c" not in problems.get(field, "")  # a secret is never echoed in its problem


def _config(**options: object) -> BackendConfig:
    return BackendConfig(kind="kubernetes", allow_private_endpoints=True, options=options)


def test_the_client_is_pinned_to_the_address_the_guard_judged() -> None:
    resolved = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append((host, port))
        return ["127.0.0.7"]

    client = api_client(
        BackendConfig(
            kind="kubernetes", endpoint="https://k8s.example.test:6443", api_key="tok", allow_private_endpoints=True
        ),
        resolver=resolver,
    )
    configuration = client.configuration
    assert resolved == [("k8s.example.test", 6443)]
    assert configuration.host == "https://127.0.0.7:6443"
    assert configuration.tls_server_name == "k8s.example.test"  # SNI and the certificate's name
    assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer tok"
    assert configuration.proxy is None


def test_a_private_api_server_needs_the_opt_in() -> None:
    config = BackendConfig(kind="kubernetes", endpoint="https://k8s.example.test", api_key="tok")
    with pytest.raises(RemoteError) as caught:
        api_client(config, resolver=lambda host, port: ["10.0.0.5"])
    assert caught.value.kind == ErrorKind.FORBIDDEN
    with pytest.raises(RemoteError) as metadata:  # never, even with the opt-in
        api_client(
            BackendConfig(kind="kubernetes", endpoint="https://k8s.example.test", allow_private_endpoints=True),
            resolver=lambda host, port: ["169.254.169.254"],
        )
    assert metadata.value.kind == ErrorKind.FORBIDDEN


def test_plain_http_reaches_a_private_api_server_only() -> None:
    """The bearer token travels in every request: over http:// only to a private address, as
    the setting's help says (the resolver answers; nothing is dialled)."""
    config = BackendConfig(kind="kubernetes", endpoint="http://k8s.example.test:8080", api_key="tok")
    with pytest.raises(RemoteError) as caught:
        api_client(config, resolver=lambda host, port: ["8.8.8.8"])
    assert caught.value.kind == ErrorKind.INVALID
    assert "https://" in caught.value.message
    assert "tok" not in caught.value.message
    private = BackendConfig(
        kind="kubernetes", endpoint="http://k8s.example.test:8080", api_key="tok", allow_private_endpoints=True
    )
    assert api_client(private, resolver=lambda host, port: ["127.0.0.9"]).configuration.host == "http://127.0.0.9:8080"


def test_a_kubeconfig_gives_server_and_token_and_its_server_is_guarded_too() -> None:
    client = api_client(_config(kubeconfig=KUBECONFIG), resolver=lambda host, port: ["127.0.0.9"])
    assert client.configuration.host == "https://127.0.0.9:6443"
    assert client.configuration.tls_server_name == "api.cluster.test"
    assert client.configuration.auth_settings()["BearerToken"]["value"] == "Bearer abc"


@pytest.mark.parametrize("plugin", ["exec: {command: /bin/evil, apiVersion: client.authentication.k8s.io/v1}",
                                    "auth-provider: {name: gcp}"])  # fmt: skip
def test_a_kubeconfig_that_would_run_a_program_is_refused(plugin: str) -> None:
    text = KUBECONFIG.replace("user: {token: abc}", f"user: {{{plugin}}}")
    with pytest.raises(RemoteError) as caught:
        api_client(_config(kubeconfig=text), resolver=lambda host, port: ["127.0.0.9"])
    assert caught.value.kind == ErrorKind.INVALID
    assert "plugin" in caught.value.message


def test_the_options_read_the_old_string_bag() -> None:
    options = KubernetesOptions.parse({"in_cluster": "1", "namespace": "team", "ready_timeout": "30"})
    assert (options.in_cluster, options.namespace, options.ready_timeout) == (True, "team", 30.0)
    assert "secret-token" not in repr(KubernetesOptions(token="secret-token"))
