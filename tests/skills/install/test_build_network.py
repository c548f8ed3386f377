"""The build sandbox's network and pip's source arguments: pure, no services.

Each adapter's own network check runs on the spec chosen for it, so a spec a backend would
refuse at create (Cube: a domain allowed with outbound on needs 0.0.0.0/0 denied) fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxes.backends.base import Backend, BackendConfig, NetworkSpec
from sandboxes.backends.cube.backend import CubeBackend
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.e2b.backend import E2BBackend
from skills.install.network import OFFLINE, build_network, sources_to_reach
from skills.install.packages import PackageSources, pip_source_args, source_host_port
from skills.install.steps import SkillPayload, StepFailed

INDEX = "http://172.18.0.1:8123/simple/"
REGISTRY = "https://npm.internal.example/"


def skill(*, pip: bool = False, npm: bool = False) -> SkillPayload:
    dependencies = {
        "pip": [{"requirement": "tinydep>=1", "name": "tinydep", "source": "requirements.txt"}] if pip else [],
        "npm": [{"name": "left-pad", "version": "^1.3.0", "source": "package.json"}] if npm else [],
    }
    return SkillPayload(name="demo", version_id="v", content_hash="h", files=(), dependencies=dependencies)


def remote(kind: str, **options: str) -> BackendConfig:
    """A config for an adapter that is built but never dialled."""
    return BackendConfig(
        kind=kind, endpoint="https://api.e2b.example", domain="e2b.example", api_key="k", options=options
    )


def backends() -> list[Backend]:
    return [
        DockerBackend(BackendConfig(kind="docker")),
        E2BBackend(remote("e2b")),
        # Pinned: an unpinned Cube adapter asks the server its release before it answers.
        CubeBackend(remote("cube", protocol="cube-0.5", protocol_pinned="1")),
        CubeBackend(remote("cube", cube_version="may")),
    ]


def accepted_by(backend: Backend, spec: NetworkSpec) -> None:
    """The adapter's own pre-send check of a network spec (raises RemoteError if refused)."""
    if isinstance(backend, DockerBackend):
        backend._check_network_spec(spec)
    elif isinstance(backend, E2BBackend):  # Cube included
        backend._check_network(spec)
        backend._network_body(spec)


def test_without_a_source_to_reach_the_build_sandbox_stays_offline(tmp_path: Path) -> None:
    folder_and_index = PackageSources(pip_index_url=INDEX, pip_folder=tmp_path, npm_registry_url=REGISTRY)
    cases = [
        (PackageSources(), [skill(pip=True, npm=True)]),  # no source at all: the step fails later, offline
        (PackageSources(pip_index_url=INDEX, npm_registry_url=REGISTRY), [skill()]),  # nothing declared
        (folder_and_index, [skill(pip=True)]),  # the folder wins, so the index is not used
    ]
    for sources, skills in cases:
        for backend in backends():
            chosen = build_network(backend.network_capabilities(), backend.label, sources_to_reach(sources, skills))
            assert chosen.spec == OFFLINE
            assert chosen.description == "build sandbox: outbound network off (no package source to reach over it)"


@pytest.mark.parametrize("backend", backends(), ids=lambda b: f"{b.kind}-{getattr(b, 'generation', '')}")
def test_an_index_url_opens_outbound_as_tightly_as_the_backend_allows(backend: Backend) -> None:
    needed = sources_to_reach(
        PackageSources(pip_index_url=INDEX, npm_registry_url=REGISTRY), [skill(pip=True), skill(npm=True)]
    )
    chosen = build_network(backend.network_capabilities(), backend.label, needed)
    accepted_by(backend, chosen.spec)
    assert chosen.spec.allow_internet_access
    assert not chosen.spec.allow_public_traffic
    reason = f"to reach the pip index {INDEX} and the npm registry {REGISTRY}"
    # Every adapter here can honour allow lists (Docker on a local engine too). A non-empty
    # allow list alone lets out only its entries; a deny-all entry would now win
    # over them. The adapters add what their API needs (E2B: denyOut all).
    assert chosen.spec.deny_out == ()
    if not backend.network_capabilities().allow_private:
        # E2B never reaches a private address, and the index is on one: no list can name it.
        assert chosen.spec.allow_out == ()
        assert chosen.description == (
            f"build sandbox: outbound network on ({backend.label} cannot limit it to 172.18.0.1,"
            f" npm.internal.example) {reason}"
        )
        return
    assert chosen.spec.texts()["allow_out"] == ["172.18.0.1/32", "npm.internal.example"]
    assert chosen.description == (
        f"build sandbox: outbound network limited to 172.18.0.1, npm.internal.example, all else denied, {reason}"
    )


def test_a_source_host_no_entry_can_name_leaves_outbound_on_and_says_so() -> None:
    backend = E2BBackend(remote("e2b"))
    needed = sources_to_reach(PackageSources(pip_index_url="http://devpi:3141/simple/"), [skill(pip=True)])
    chosen = build_network(backend.network_capabilities(), backend.label, needed)
    assert chosen.spec.allow_internet_access
    assert chosen.spec.allow_out == ()
    assert "E2B cannot limit it to devpi" in chosen.description


def test_docker_on_a_remote_engine_cannot_limit_and_says_so() -> None:
    backend = DockerBackend(BackendConfig(kind="docker", endpoint="tcp://127.0.0.1:9"))
    needed = sources_to_reach(PackageSources(pip_index_url=INDEX), [skill(pip=True)])
    chosen = build_network(backend.network_capabilities(), backend.label, needed)
    assert (chosen.spec.allow_out, chosen.spec.deny_out) == ((), ())
    assert chosen.description == (
        f"build sandbox: outbound network on (Docker cannot limit it to 172.18.0.1) to reach the pip index {INDEX}"
    )


def test_a_source_url_without_a_usable_host_fails_the_create_step() -> None:
    for url in ("ftp://host/simple/", "http:///simple/", "http://host:99999/simple/"):
        with pytest.raises(StepFailed) as caught:
            sources_to_reach(PackageSources(pip_index_url=url), [skill(pip=True)])
        assert caught.value.step == "create"
        assert f"the pip index URL {url!r} cannot be used" in caught.value.message


def test_source_host_and_port() -> None:
    assert source_host_port("http://172.18.0.1:8123/simple/") == ("172.18.0.1", 8123)
    assert source_host_port("https://pypi.internal/simple/") == ("pypi.internal", 443)
    assert source_host_port("http://user:secret@[fd00::1]/simple/") == ("fd00::1", 80)


def test_pip_uses_the_folder_or_the_index_and_never_pypi_too(tmp_path: Path) -> None:
    assert pip_source_args(PackageSources(pip_index_url=INDEX, pip_folder=tmp_path)) == [
        "--no-index",
        "--find-links",
        "/tmp/skill-build/packages",
    ]
    assert pip_source_args(PackageSources(pip_index_url=INDEX)) == [
        "--index-url",
        INDEX,
        "--trusted-host",
        "172.18.0.1:8123",
    ]
    # https needs no trust exception; credentials in the URL never reach --trusted-host.
    assert pip_source_args(PackageSources(pip_index_url="https://u:p@pypi.internal/simple/")) == [
        "--index-url",
        "https://u:p@pypi.internal/simple/",
    ]
    assert pip_source_args(PackageSources(pip_index_url="http://u:p@pypi.internal/simple/"))[-1] == "pypi.internal"


@pytest.mark.parametrize("backend", backends(), ids=lambda b: f"{b.kind}-{getattr(b, 'generation', '')}")
def test_the_job_log_line_never_shows_a_sources_credentials(backend: Backend) -> None:
    """The network line goes to the job log and the generation's log: a password or token in
    a source URL is shown as ***, as the dependency step shows it."""
    sources = PackageSources(
        pip_index_url="http://ci:pip-secret@172.18.0.1:8123/simple/",
        npm_registry_url="https://npm-token@npm.internal.example/",
        apt_url="http://ci:apt-secret@172.18.0.1:3142/debian",
    )
    debian = SkillPayload(name="pdf", version_id="v", content_hash="h", files=(), dependencies={"debian": ["qpdf"]})
    needed = sources_to_reach(sources, [skill(pip=True, npm=True), debian])
    description = build_network(backend.network_capabilities(), backend.label, needed).description
    for secret in ("pip-secret", "npm-token", "apt-secret"):
        assert secret not in description
    assert "the apt source http://ci:***@172.18.0.1:3142/debian" in description
    assert "the npm registry https://***@npm.internal.example/" in description


def test_a_source_url_that_cannot_be_used_is_named_without_its_credentials() -> None:
    sources = PackageSources(apt_url="http://ci:apt-secret@[::1/debian")
    debian = SkillPayload(name="pdf", version_id="v", content_hash="h", files=(), dependencies={"debian": ["qpdf"]})
    with pytest.raises(StepFailed) as refused:
        sources_to_reach(sources, [debian])
    assert "apt-secret" not in refused.value.message
