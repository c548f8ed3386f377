"""Skill images as OCI images: a build sandbox's changes pushed as a layer on the template
image to a real registry (Debian's docker-registry on loopback), pulled back and run by the
Docker engine, as the fake cluster's pods run them.

The build sandbox here is a Docker sandbox of the Docker adapter: the layer is read through
the contract's `Backend.exec` alone, which is all `push_skill_image` asks of a backend.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import docker
import pytest

from sandboxes.backends.base import BackendConfig, ErrorKind, ExecRequest, NetworkSpec, RemoteError, SandboxSpec
from sandboxes.backends.docker.backend import DockerBackend
from sandboxes.backends.kubernetes.images import apply_entry, layer_plan, push_skill_image
from sandboxes.backends.kubernetes.registry import Registry, parse_reference
from tests.support.oci_registry import LocalRegistry, running_registry

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def base_in_registry(oci_registry: LocalRegistry, docker_base_image: str) -> str:
    return oci_registry.push_local_image(docker_base_image, "sandbox-console/base", "latest")


@pytest.fixture
def backend(docker_base_image: str) -> Iterator[DockerBackend]:
    adapter = DockerBackend(BackendConfig(kind="docker"))
    yield adapter
    adapter.close()


def _root(backend: DockerBackend, sandbox_id: str, script: str) -> str:
    result = backend.exec(sandbox_id, ExecRequest(shell=script, user="root"))
    assert result.exit_code == 0, result.stderr
    return result.stdout.decode()


def test_a_build_sandboxs_changes_become_a_layer_the_engine_runs(
    backend: DockerBackend, base_in_registry: str, oci_registry: LocalRegistry, docker_base_image: str, test_run_id: str
) -> None:
    spec = SandboxSpec(
        template_id=docker_base_image,
        network=NetworkSpec.parse(allow_internet_access=False, allow_public_traffic=False),
        metadata={"test-run": test_run_id},
        auto_pause=False,
    )
    info = backend.create(spec)
    engine = docker.from_env(timeout=120)
    image = ""
    try:
        _root(
            backend,
            info.sandbox_id,
            "mkdir -p /opt/skills/demo"
            " && printf '#!/bin/sh\\necho hello from the skill layer\\n' > /opt/skills/demo/run.sh"
            " && chmod 0755 /opt/skills/demo/run.sh && ln -s /opt/skills/demo/run.sh /usr/local/bin/demo"
            " && echo 'changed by the build' >> /etc/motd && rm -f /etc/issue.net && rm -rf /etc/cron.daily"
            " && echo 'a session file' > /workspace/left-behind",
        )
        started = backend.get(info.sandbox_id).started_at
        assert started is not None
        registry = Registry(oci_registry.url, allow_private=True)
        try:
            image, size = push_skill_image(
                registry,
                registry.holds(base_in_registry),
                backend,
                info.sandbox_id,
                since=started.timestamp() - 2,
                tag="snap-" + uuid.uuid4().hex[:12],
                name="skills-demo-g1",
            )
            manifest, _ = registry.manifest(parse_reference(image))
        finally:
            registry.close()
        assert image.startswith(f"{oci_registry.host}/sandbox-console/base@sha256:")
        assert len(manifest["layers"]) == 2
        assert size > manifest["layers"][1]["size"]
        # The new layer is small: the changes, not the file system again.
        assert manifest["layers"][1]["size"] < 1_000_000

        repository, digest = image.split("@")
        engine.images.pull(repository, tag=digest)
        out = engine.containers.run(
            image,
            [
                "sh",
                "-c",
                "demo; tail -n1 /etc/motd; test -e /etc/issue.net && echo issue.net kept;"
                " test -e /etc/cron.daily && echo cron.daily kept; test -e /etc/issue && echo issue kept;"
                " test -e /workspace/left-behind && echo workspace kept; stat -c %a /opt/skills/demo/run.sh",
            ],
            remove=True,
            network_mode="none",
            dns=["127.0.0.1"],
            labels={"test-run": test_run_id},
        ).decode()
        assert out.splitlines() == ["hello from the skill layer", "changed by the build", "issue kept", "755"]
    finally:
        backend.delete(info.sandbox_id)
        if image:
            engine.images.remove(image, force=True)
        engine.close()


def test_a_template_image_outside_the_registry_is_refused_in_words(oci_registry: LocalRegistry) -> None:
    registry = Registry(oci_registry.url, allow_private=True)
    try:
        with pytest.raises(RemoteError) as caught:
            registry.holds("sandbox-console/base:latest")
        assert caught.value.kind == ErrorKind.INVALID
        assert f"not in the registry {oci_registry.host}" in caught.value.message
        assert "pushes the template's image to that registry first" in caught.value.message
    finally:
        registry.close()


def test_a_registry_with_basic_auth_is_read_and_written_with_the_credentials() -> None:
    with running_registry(username="console", password="s3cret") as local:
        anonymous = Registry(local.url, allow_private=True)
        signed_in = Registry(local.url, username="console", password="s3cret", allow_private=True)
        try:
            with pytest.raises(RemoteError) as caught:
                anonymous.upload_bytes("skills/blobs", b"{}")
            assert caught.value.kind == ErrorKind.UNAUTHORIZED
            digest = signed_in.upload_bytes("skills/blobs", b'{"a": 1}')
            assert signed_in.blob("skills/blobs", digest) == b'{"a": 1}'
        finally:
            anonymous.close()
            signed_in.close()


def test_a_loopback_registry_needs_the_private_opt_in(oci_registry: LocalRegistry) -> None:
    registry = Registry(oci_registry.url)
    try:
        with pytest.raises(RemoteError) as caught:
            registry.upload_bytes("skills/blobs", b"{}")
        assert caught.value.kind == ErrorKind.FORBIDDEN
    finally:
        registry.close()


def test_whiteouts_are_the_topmost_paths_gone_and_mounts_are_never_gone() -> None:
    lower: set[str] = set()
    for name in ["etc", "etc/a", "etc/cron.daily", "etc/cron.daily/x", "workspace", "workspace/w", "proc", "etc/hosts"]:
        apply_entry(lower, name)
    listing = [(1, 0.0, "/"), (1, 0.0, "/etc"), (1, 0.0, "/etc/a"), (2, 0.0, "/proc"), (3, 0.0, "/etc/hosts")]
    listing += [(1, 0.0, "/workspace"), (1, 50.0, "/opt"), (1, 50.0, "/opt/new")]
    changed, whiteouts = layer_plan(listing, lower, since=10.0)
    assert changed == ["opt", "opt/new"]
    assert whiteouts == ["etc/.wh.cron.daily"]
    # A lower layer's whiteouts and opaque folders take paths away again.
    apply_entry(lower, "etc/.wh.a")
    apply_entry(lower, "./workspace/.wh..wh..opq")
    assert "etc/a" not in lower
    assert "workspace/w" not in lower
    assert "workspace" in lower
