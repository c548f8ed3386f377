"""A Docker host registered over ssh://, reached through an sshd of the test's own.

The sshd listens on a free loopback port with a generated host key and lets root in with a
generated client key (the engine socket is root's); `docker system dial-stdio` on its side
pipes to the local engine, so the "remote" host is this machine. docker-py's
`use_ssh_client` shells out to `ssh`, which reads its options from the account's
~/.ssh/config (not $HOME): the test puts an `ssh` on PATH that adds `-F` with its own config
(key, known_hosts, no agent), where an operator would write root's ~/.ssh/config.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.urls import reverse

from sandboxes.backends.base import ExecRequest, NetworkSpec, SandboxSpec
from sandboxes.catalog.bridge import get_backend
from sandboxes.models import PlatformBackend, SandboxConfig
from tests.conftest import IN_CI
from tests.factories import config_form
from tests.personas import World
from tests.sandboxes.catalog.test_platform_backends import backend_form

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"


def _keypair() -> tuple[bytes, bytes]:
    """(private key in OpenSSH format, public key line) of a fresh ed25519 key."""
    key = ed25519.Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class SshHost:
    port: int
    dir: Path
    log: Path

    @property
    def endpoint(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    def client_config(self, known_hosts: Path) -> Path:
        """An ssh client config trusting only the hosts in `known_hosts`."""
        path = self.dir / f"ssh_config.{known_hosts.name}"
        path.write_text(
            "Host *\n"
            f"  IdentityFile {self.dir / 'client_key'}\n"
            "  IdentitiesOnly yes\n"
            "  IdentityAgent none\n"
            f"  UserKnownHostsFile {known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 10\n"
        )
        return path

    def use_client_config(self, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """Make the `ssh` docker-py runs use `config` (it looks `ssh` up on PATH)."""
        bin_dir = self.dir / f"bin.{config.name}"
        bin_dir.mkdir(exist_ok=True)
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec {SSH} -F {config} "$@"\n')
        wrapper.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def ssh_host() -> Iterator[SshHost]:
    if not (os.path.exists(SSHD) and os.path.exists(SSH)):
        message = f"needs {SSHD} and {SSH} (Debian openssh-server; .ci/docker-up installs it)"
        if IN_CI:
            pytest.fail(f"[CI] {message}", pytrace=False)
        pytest.skip(message)
    if os.geteuid() != 0:
        pytest.skip("the sshd must run as root to let root in (the engine socket is root's)")
    with tempfile.TemporaryDirectory(prefix="console-sshd-") as tmp:
        home = Path(tmp)
        host_private, host_public = _keypair()
        client_private, client_public = _keypair()
        (home / "host_key").write_bytes(host_private)
        (home / "host_key").chmod(0o600)
        (home / "client_key").write_bytes(client_private)
        (home / "client_key").chmod(0o600)
        (home / "authorized_keys").write_bytes(client_public + b"\n")
        port = _free_port()
        (home / "known_hosts").write_bytes(f"[127.0.0.1]:{port} ".encode() + host_public + b"\n")
        (home / "sshd_config").write_text(
            f"Port {port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {home / 'host_key'}\n"
            f"AuthorizedKeysFile {home / 'authorized_keys'}\n"
            f"PidFile {home / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
        )
        # sshd refuses to start without its privilege separation directory (the Debian
        # service makes it at start; no service runs here).
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        log = home / "sshd.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(home / "sshd_config")], stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"sshd did not come up: {log.read_text()}")
                    time.sleep(0.05)
            yield SshHost(port=port, dir=home, log=log)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def test_a_platform_admin_registers_an_ssh_docker_host_and_a_space_runs_a_sandbox_on_it(
    world: World, ssh_host: SshHost, docker_base_image: str, test_run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ssh_host.use_client_config(ssh_host.client_config(ssh_host.dir / "known_hosts"), monkeypatch)
    root = world.client_for("root")
    data = backend_form(
        name="ssh engine",
        endpoint=ssh_host.endpoint,
        allow_private_endpoints="on",
        spaces=[str(world.space_a.id)],
        max_cpus="2",
    )
    response = root.post(reverse("sandboxes:backend_create"), data)
    assert response.status_code == 302, response.context["form"].errors
    backend = PlatformBackend.objects.get(name="ssh engine")
    assert (backend.endpoint, list(backend.spaces.all())) == (ssh_host.endpoint, [world.space_a])

    alice = world.client_for("alice")
    create = reverse("sandboxes:config_create", args=[world.space_a.id])
    assert alice.post(create, config_form(backend, name="over ssh")).status_code == 302
    config = SandboxConfig.objects.get(name="over ssh")

    local = docker.from_env(timeout=60)
    try:
        engine = get_backend(config)
        health = engine.health()
        assert health.ok, f"{health.detail}\nsshd log:\n{ssh_host.log.read_text()}"
        assert local.version()["Version"] in health.version
        info = engine.create(
            SandboxSpec(
                template_id=docker_base_image,
                network=NetworkSpec.parse(allow_internet_access=False, allow_public_traffic=False),
                metadata={"test-run": test_run_id},
            )
        )
        try:
            # The sandbox the ssh:// backend made is a container of the local engine.
            container = local.containers.get(info.sandbox_id)
            assert container.labels.get("console.meta.test-run") == test_run_id
            result = engine.exec(info.sandbox_id, ExecRequest(argv=("cat", "/etc/hostname")))
            assert result.exit_code == 0, result
            assert result.stdout.strip()
        finally:
            engine.delete(info.sandbox_id)
        with pytest.raises(docker.errors.NotFound):
            local.containers.get(info.sandbox_id)
        # The session went through this sshd: root logged in with the generated key.
        assert "Accepted publickey for root" in ssh_host.log.read_text()
    finally:
        local.close()


def test_an_ssh_host_whose_key_is_not_known_is_refused(
    world: World, ssh_host: SshHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # known_hosts decides trust (no paramiko AutoAddPolicy): the same host is healthy while
    # its key is known and refused once the client's known_hosts does not list it.
    backend = PlatformBackend.objects.create(
        name="ssh host", kind="docker", endpoint=ssh_host.endpoint, allow_private_endpoints=True
    )
    backend.spaces.add(world.space_a)
    config = SandboxConfig.objects.create(
        space=world.space_a, backend=backend, name="ssh", default_template="sandbox-console/base:latest"
    )
    with monkeypatch.context() as known:
        ssh_host.use_client_config(ssh_host.client_config(ssh_host.dir / "known_hosts"), known)
        engine = get_backend(config)
        health = engine.health()
        assert health.ok, health.detail
    accepted = ssh_host.log.read_text().count("Accepted publickey for root")
    assert accepted >= 1
    empty = ssh_host.dir / "known_hosts.empty"
    empty.write_text("")
    ssh_host.use_client_config(ssh_host.client_config(empty), monkeypatch)
    engine = get_backend(config)
    health = engine.health()
    assert not health.ok
    assert ssh_host.log.read_text().count("Accepted publickey for root") == accepted
