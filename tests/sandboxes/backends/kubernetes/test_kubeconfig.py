"""Reading a pasted kubeconfig and the pod's own service account into a Kubernetes backend's
settings: what is taken, and each thing refused with its reason."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandboxes.backends.kubernetes import kubeconfig
from sandboxes.backends.kubernetes.kubeconfig import (
    KubeconfigError,
    context_names,
    fill_settings,
    in_cluster_access,
    parse_kubeconfig,
)
from sandboxes.backends.settings import Given
from tests.support.pem import self_signed

CA, _ = self_signed("cluster-ca.test")
CLIENT_CERT, CLIENT_KEY = self_signed("admin.test")


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def kubeconfig_text(
    *, user: dict[str, Any] | None = None, cluster: dict[str, Any] | None = None, current: str = "prod"
) -> str:
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [
            {
                "name": "prod-cluster",
                "cluster": cluster or {"server": "https://k8s.prod.test:6443", "certificate-authority-data": b64(CA)},
            },
            {"name": "dev-cluster", "cluster": {"server": "https://127.0.0.1:7443"}},
        ],
        "users": [
            {"name": "console", "user": user if user is not None else {"token": "prod-token"}},
            {"name": "dev", "user": {"token": "dev-token"}},
        ],
        "contexts": [
            {"name": "prod", "context": {"cluster": "prod-cluster", "user": "console", "namespace": "agents"}},
            {"name": "dev", "context": {"cluster": "dev-cluster", "user": "dev"}},
        ],
    }
    return yaml.safe_dump(document)


def test_the_current_context_gives_the_server_its_ca_the_token_and_the_namespace() -> None:
    access = parse_kubeconfig(kubeconfig_text())
    assert (access.api_url, access.ca_cert, access.token, access.namespace) == (
        "https://k8s.prod.test:6443",
        CA.strip() + "\n",
        "prod-token",
        "agents",
    )
    assert access.settings() == {
        "endpoint": "https://k8s.prod.test:6443",
        "tls_ca": CA.strip() + "\n",
        "api_key": "prod-token",
        "in_cluster": False,
        "namespace": "agents",
    }
    assert "prod-token" not in repr(access)


def test_a_chosen_context_wins_over_the_current_one_and_an_unknown_one_is_named() -> None:
    access = parse_kubeconfig(kubeconfig_text(), "dev")
    assert (access.api_url, access.ca_cert, access.token) == ("https://127.0.0.1:7443", "", "dev-token")
    with pytest.raises(KubeconfigError, match=r"no context 'staging'; it has 'prod', 'dev'"):
        parse_kubeconfig(kubeconfig_text(), "staging")
    assert context_names(kubeconfig_text(current="dev")) == ["dev", "prod"]


@pytest.mark.parametrize(
    ("user", "named"),
    [
        ({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}, "exec plugin 'aws'"),
        ({"auth-provider": {"name": "gcp", "config": {}}}, "auth-provider plugin 'gcp'"),
    ],
)
def test_plugins_that_run_a_program_are_refused_saying_why(user: dict[str, Any], named: str) -> None:
    with pytest.raises(KubeconfigError) as caught:
        parse_kubeconfig(kubeconfig_text(user=user))
    message = str(caught.value)
    assert named in message
    assert "cannot run a local binary" in message
    assert "service account's token" in message


@pytest.mark.parametrize(
    ("cluster", "user", "says"),
    [
        ({"server": "https://k8s.prod.test", "insecure-skip-tls-verify": True}, None, "insecure-skip-tls-verify"),
        ({"server": "http://k8s.prod.test:8080"}, None, "only https://"),
        ({"server": "https://k8s.prod.test", "certificate-authority": "/home/me/ca.crt"}, None, "path on your machine"),
        ({"server": "https://k8s.prod.test", "proxy-url": "http://proxy.test:3128"}, None, "proxy-url"),
        ({"certificate-authority-data": b64(CA)}, None, "has no server"),
        ({"server": "https://k8s.prod.test", "certificate-authority-data": "not base64!"}, None, "not base64"),
        ({"server": "https://k8s.prod.test", "certificate-authority-data": b64("hello")}, None, "no PEM certificate"),
        (None, {"tokenFile": "/home/me/token"}, "path on your machine"),
        (None, {"client-certificate": "/a.crt", "client-key": "/a.key"}, "path on your machine"),
        (None, {"username": "admin", "password": "pw"}, "basic auth"),
        (None, {}, "no credentials"),
        (None, {"client-certificate-data": b64(CLIENT_CERT)}, "without the other"),
        (
            None,
            {"token": "t", "client-certificate-data": b64(CLIENT_CERT), "client-key-data": b64(CLIENT_KEY)},
            "keep one",
        ),
    ],
)
def test_what_the_console_cannot_honour_is_refused(
    cluster: dict[str, Any] | None, user: dict[str, Any] | None, says: str
) -> None:
    with pytest.raises(KubeconfigError, match=says):
        parse_kubeconfig(kubeconfig_text(cluster=cluster, user=user))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("clusters: [\n  - oops: [", "not valid YAML"),
        ("just a string", "not a kubeconfig"),
        (yaml.safe_dump({"kind": "Pod"}), "not a kubeconfig"),
        (yaml.safe_dump({"kind": "Config", "contexts": []}), "no contexts"),
        (
            yaml.safe_dump(
                {"kind": "Config", "contexts": [{"name": "a", "context": {}}, {"name": "b", "context": {}}]}
            ),
            "choose one of 'a', 'b'",
        ),
        (
            yaml.safe_dump({"kind": "Config", "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u"}}]}),
            "names the cluster 'c', which the kubeconfig lacks",
        ),
    ],
)
def test_a_broken_kubeconfig_is_named_as_such(text: str, says: str) -> None:
    with pytest.raises(KubeconfigError, match=says):
        parse_kubeconfig(text)


def test_a_client_certificate_is_kept_as_a_kubeconfig_of_its_context_alone() -> None:
    text = kubeconfig_text(user={"client-certificate-data": b64(CLIENT_CERT), "client-key-data": b64(CLIENT_KEY)})
    settings = parse_kubeconfig(text).settings()
    assert (settings["endpoint"], settings["api_key"]) == ("", "")
    kept = settings["kubeconfig"]
    assert "dev-token" not in kept  # the other context stays behind
    assert "127.0.0.1:7443" not in kept
    again = parse_kubeconfig(kept)
    assert (again.api_url, again.ca_cert, again.client_cert, again.client_key, again.namespace) == (
        "https://k8s.prod.test:6443",
        CA.strip() + "\n",
        CLIENT_CERT.strip() + "\n",
        CLIENT_KEY.strip() + "\n",
        "agents",
    )


def _service_account(root: Path, *, token: str = "sa-token\n") -> Path:  # noqa: S107 - a test file's content
    root.mkdir(parents=True, exist_ok=True)
    (root / "token").write_text(token)
    (root / "ca.crt").write_text(CA)
    (root / "namespace").write_text("sandbox-console\n")
    return root


def test_the_in_cluster_service_account_is_read_from_its_files_and_the_environment(tmp_path: Path) -> None:
    root = _service_account(tmp_path / "sa")
    access = in_cluster_access(root, {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert (access.api_url, access.token, access.namespace, access.in_cluster) == (
        "https://127.0.0.1:6443",
        "sa-token",
        "sandbox-console",
        True,
    )
    assert access.settings() == {
        "endpoint": "",
        "tls_ca": "",
        "api_key": "",
        "in_cluster": True,
        "namespace": "sandbox-console",
    }
    v6 = in_cluster_access(root, {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"})
    assert v6.api_url == "https://[fd00::1]:443"


def test_the_in_cluster_service_account_says_what_is_missing(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    with pytest.raises(KubeconfigError, match="does not run in a Kubernetes pod"):
        in_cluster_access(_service_account(tmp_path / "a"), {})
    with pytest.raises(KubeconfigError, match="automountServiceAccountToken"):
        in_cluster_access(tmp_path / "absent", env)
    with pytest.raises(KubeconfigError, match="is empty"):
        in_cluster_access(_service_account(tmp_path / "b", token=""), env)


def test_fill_turns_a_pasted_kubeconfig_into_the_settings_or_the_field_problem() -> None:
    filled = fill_settings(Given(values={"kubeconfig": kubeconfig_text(), "kubeconfig_context": "", "namespace": ""}))
    assert not filled.problems
    assert filled.values["endpoint"] == "https://k8s.prod.test:6443"
    assert filled.values["api_key"] == "prod-token"
    assert filled.values["kubeconfig"] == ""  # its parts are stored, not the file
    assert filled.values["clear_kubeconfig"] is True  # nor a stored one kept beside them
    assert filled.values["namespace"] == "agents"
    typed = fill_settings(Given(values={"kubeconfig": kubeconfig_text(), "namespace": "mine"}))
    assert "namespace" not in typed.values  # what the admin typed stays
    refused = fill_settings(
        Given(values={"kubeconfig": kubeconfig_text(user={"exec": {"command": "gke-gcloud-auth-plugin"}})})
    )
    assert "cannot run a local binary" in refused.problems["kubeconfig"]
    assert fill_settings(Given(values={"kubeconfig": "***"})) == fill_settings(Given(values={}))


def test_fill_checks_the_in_cluster_switch_against_the_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    refused = fill_settings(Given(values={"in_cluster": True}))
    assert "does not run in a Kubernetes pod" in refused.problems["in_cluster"]
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT_DIR", _service_account(tmp_path / "sa"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    filled = fill_settings(Given(values={"in_cluster": True, "namespace": ""}))
    assert filled == type(filled)(values={"kubeconfig": "", "clear_kubeconfig": True, "namespace": "sandbox-console"})


def test_a_kubeconfig_with_yaml_aliases_is_refused_before_anything_expands_them() -> None:
    # Nine levels of nine aliases each: a 600-byte paste that str() would turn into gigabytes.
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    lines += ["kind: Config", "current-context: *a9", "contexts:", "- name: *a9", "  context: {cluster: c, user: u}"]
    text = "\n".join(lines)
    with pytest.raises(KubeconfigError, match="anchors"):
        parse_kubeconfig(text)
    assert context_names(text) == []


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_server_with_credentials_in_its_url_is_refused_without_showing_them(scheme: str) -> None:
    text = kubeconfig_text(cluster={"server": f"{scheme}://admin:s3cret@k8s.prod.test:6443"})
    with pytest.raises(KubeconfigError) as caught:
        parse_kubeconfig(text)
    assert "s3cret" not in str(caught.value)
    assert "admin" not in str(caught.value)
    assert "k8s.prod.test:6443" in str(caught.value)


def test_a_kubeconfig_nested_deeper_than_any_is_refused_in_words() -> None:
    text = "kind: Config\ncontexts: " + "[" * 100_000 + "]" * 100_000
    with pytest.raises(KubeconfigError, match="nested"):
        parse_kubeconfig(text)
    assert context_names(text) == []
