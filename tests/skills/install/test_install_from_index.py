"""Skill installs from a pip index URL (and an npm registry URL) on the real Docker engine.

The index is a PEP 503 simple index the test serves itself inside a network namespace of its
own (tests/support/netns.py), which sandboxes reach through the host's forward path as they would a
real index (the host's own addresses, the bridge gateway included, are unreachable from
sandboxes). No sandbox is ever pointed at anything but that server (or a free port on the
same address), and by IP; the build sandbox's allow list holds that address alone.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from console.models import JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from skills.images import current_image
from tests.personas import World
from tests.support.netns import Namespace, namespace
from tests.support.package_index import PackageIndex
from tests.support.skill_install import (
    build_sandboxes,
    import_skill,
    job_error,
    log_lines,
    plain_skill,
    run_install,
    set_sources,
    skill_with_dependency,
    skills_config,
    write_wheel,
)
from tests.support.skills import REGULAR, build_zip

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]


@pytest.fixture
def config(world: World, docker_base_image: str, installation: str) -> Iterator[SandboxConfig]:
    """A Docker config with no package source yet (each test names its own)."""
    with skills_config(world.space_a, docker_base_image, installation) as made:
        yield made


@pytest.fixture
def source_host() -> Iterator[Namespace]:
    """The package source's machine: a namespace of the test's own behind a veth pair."""
    with namespace() as made:
        yield made


@pytest.fixture
def gateway(source_host: Namespace) -> str:
    """The package source's address (the name stays from when it was the bridge's gateway)."""
    return source_host.address


@pytest.fixture
def index(source_host: Namespace, tmp_path: Path) -> Iterator[PackageIndex]:
    wheels = [write_wheel(tmp_path / "wheels")]
    with source_host.run(lambda: PackageIndex(source_host.address, wheels)) as served:
        yield served


def free_port_url(host: Namespace, path: str) -> str:
    """A URL on the source's address where nothing listens (the port was free a moment ago)."""

    def free_port() -> int:
        with socket.socket() as probe:
            probe.bind((host.address, 0))
            return int(probe.getsockname()[1])

    return f"http://{host.address}:{host.run(free_port)}{path}"


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def test_a_pip_index_url_gets_the_build_outbound_and_installs_from_that_index(
    world: World,
    config: SandboxConfig,
    index: PackageIndex,
    source_host: Namespace,
    gateway: str,
    runtime: Runtime,
    installation: str,
) -> None:
    set_sources(config, pip_index_url=index.url)
    job = run_install(world.space_a, config, import_skill(skill_with_dependency()))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    lines = log_lines(job)
    assert (
        f"build sandbox: outbound network limited to {gateway}, all else denied, to reach the pip index {index.url}"
        in lines
    )
    assert (
        f"the pip index answers from the build sandbox ({gateway} port {port_of(index.url)}): "
        f"HTTP 200 for {index.url}tinydep/" in lines
    )
    # pip fetched the project page and the wheel from this server, through the host's forward
    # path (the engine masquerades the bridge network behind the host's end of the veth).
    assert "/simple/tinydep/" in index.paths
    assert "/files/tinydep-1.0-py3-none-any.whl" in index.paths
    assert {client for client, _ in index.requests} == {source_host.host_address}
    image = current_image(world.space_a, config)
    assert image is not None
    assert image.manifest[0]["installed"] == ["tinydep-1.0"]
    assert build_sandboxes(config, installation) == []

    session = runtime.resolve(world.space_a, "uses-the-index-package").session
    result = runtime.exec(
        session, ExecRequest(shell="python3 -c 'import tinydep; print(tinydep.VALUE)'", user="user", timeout_s=60)
    )
    assert (result.exit_code, result.stdout) == (0, b"42\n"), result.stderr


def test_a_pip_index_that_does_not_answer_fails_the_check_step(
    world: World, config: SandboxConfig, source_host: Namespace, gateway: str, installation: str
) -> None:
    first = run_install(world.space_a, config, import_skill(plain_skill("first-skill")))
    assert first.status == JobStatus.SUCCEEDED, job_error(first)
    assert "build sandbox: outbound network off (no package source to reach over it)" in log_lines(first)
    before = current_image(world.space_a, config)
    assert before is not None

    url = free_port_url(source_host, "/simple/")
    set_sources(config, pip_index_url=url)
    job = run_install(world.space_a, config, import_skill(skill_with_dependency()))
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(
        f"step check failed: the pip index {url} does not answer from the build sandbox "
        f"({gateway} port {port_of(url)}: Connection refused)"
    ), job_error(job)
    assert current_image(world.space_a, config) == before
    assert build_sandboxes(config, installation) == []


def test_an_index_without_the_project_fails_naming_the_http_status(
    world: World, config: SandboxConfig, source_host: Namespace, gateway: str, installation: str
) -> None:
    """A server that answers 404 to everything passes a port check; the PEP 503 probe names it."""
    with source_host.run(lambda: PackageIndex(source_host.address, [])) as empty:
        set_sources(config, pip_index_url=empty.url)
        job = run_install(world.space_a, config, import_skill(skill_with_dependency()))
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(
        f"step check failed: the pip index {empty.url} answers HTTP 404 for {empty.url}tinydep/ "
        f"(the index has no such project), from the build sandbox ({gateway} port {port_of(empty.url)})"
    ), job_error(job)
    assert "/simple/tinydep/" in empty.paths
    assert current_image(world.space_a, config) is None
    assert build_sandboxes(config, installation) == []


def test_npm_dependencies_get_the_registry_network_and_name_every_miss(
    world: World, config: SandboxConfig, source_host: Namespace, gateway: str, installation: str
) -> None:
    registry = free_port_url(source_host, "/")  # nothing answers there
    set_sources(config, npm_registry_url=registry)
    md = b"---\nname: npm-skill\ndescription: Needs an npm package. Use when testing installs.\nlicense: MIT\n"
    md += b"---\n\nHi.\n"
    package_json = json.dumps({"name": "npm-skill", "dependencies": {"left-pad": "^1.3.0"}}).encode()
    archive = build_zip([("npm-skill/SKILL.md", md, REGULAR), ("npm-skill/package.json", package_json, REGULAR)])
    job = run_install(world.space_a, config, import_skill(archive))
    assert job.status == JobStatus.FAILED
    assert (
        f"build sandbox: outbound network limited to {gateway}, all else denied, to reach the npm registry {registry}"
        in log_lines(job)
    )
    # Every miss at once: Node.js and npm (Debian packages, with no Debian source), and the registry.
    assert job.error.startswith(
        "step check failed: Debian packages nodejs, npm: not in the image, and the platform backend has no apt "
        "source (set 'apt repository folder' or 'apt mirror or proxy URL' on it) (needed: npm is not in the "
        "template and npm-skill declares npm packages); "
    ), job_error(job)
    assert f"the npm registry {registry} does not answer from the build sandbox" in job.error
    assert current_image(world.space_a, config) is None
    assert build_sandboxes(config, installation) == []
