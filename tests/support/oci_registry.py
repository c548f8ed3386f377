"""A local OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution
registry), one per test session on a free loopback port, its storage and config in a
temporary folder.

Skill images of the Kubernetes backend are pushed to the registry the platform admin
configures; here that is this one. The fake cluster's pods are containers of the local Docker
engine, so the engine must pull what is pushed: a registry on 127.0.0.0/8 is one the engine
talks to over plain HTTP by default (its "insecure registries"), and `push_local_image` proves
the pull works by pulling back what it pushed.

`oci_registry` (session scope) is the fixture; without the `docker-registry` program a test
using it fails in CI (CI=true) and skips elsewhere, saying what is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

PROGRAM = "docker-registry"
START_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class LocalRegistry:
    """A running registry: `host` as image references name it, `url` as the API is dialled."""

    host: str  # "127.0.0.1:PORT"
    username: str = ""
    password: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def reference(self, repository: str, tag: str) -> str:
        return f"{self.host}/{repository}:{tag}"

    def push_local_image(self, image: str, repository: str, tag: str = "latest") -> str:
        """Push an image of the local engine here (as an admin pushes the template image the
        Kubernetes backend builds skill images on), pull it back to prove the engine can, and
        return its reference in this registry."""
        import docker

        reference = self.reference(repository, tag)
        client = docker.from_env(timeout=120)
        try:
            client.images.get(image).tag(f"{self.host}/{repository}", tag)
            auth = {"username": self.username, "password": self.password} if self.username else None
            for line in client.api.push(
                f"{self.host}/{repository}", tag=tag, stream=True, decode=True, auth_config=auth
            ):
                if "error" in line:
                    raise AssertionError(f"pushing {image} to {reference}: {line['error']}")
            client.images.remove(reference)
            client.images.pull(f"{self.host}/{repository}", tag=tag, auth_config=auth)
        finally:
            client.close()
        return reference

    def forget_local_tags(self) -> None:
        """Remove the engine's tags naming this registry (the images stay under their other
        names), so runs leave no `127.0.0.1:PORT/...` names behind."""
        import docker

        client = docker.from_env(timeout=60)
        try:
            for image in client.images.list():
                for tag in [*image.tags, *(image.attrs.get("RepoDigests") or [])]:
                    if tag.startswith(f"{self.host}/"):
                        with contextlib.suppress(docker.errors.APIError):
                            client.images.remove(tag)
        finally:
            client.close()


def registry_missing() -> str | None:
    if shutil.which(PROGRAM) is None:
        return f"the `{PROGRAM}` program (Debian package docker-registry; .ci/docker-up installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(root: Path, port: int, htpasswd: Path | None) -> str:
    auth = f"auth:\n  htpasswd:\n    realm: tests\n    path: {htpasswd}\n" if htpasswd else ""
    return (
        "version: 0.1\n"
        "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'storage'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"{auth}"
    )


@contextlib.contextmanager
def running_registry(*, username: str = "", password: str = "") -> Iterator[LocalRegistry]:
    """A registry on a free loopback port (with basic auth when `username` is given), its
    config and storage in a temporary folder removed at the end."""
    with tempfile.TemporaryDirectory(prefix="oci-registry-") as folder:
        root = Path(folder)
        htpasswd = None
        if username:
            import bcrypt

            htpasswd = root / "htpasswd"
            htpasswd.write_text(f"{username}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}\n")
        port = _free_port()
        config = root / "config.yml"
        config.write_text(_config(root, port, htpasswd))
        log = (root / "registry.log").open("wb")
        process = subprocess.Popen(
            [PROGRAM, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT, env={"PATH": os.environ["PATH"]}
        )
        registry = LocalRegistry(host=f"127.0.0.1:{port}", username=username, password=password)
        try:
            _wait_until_up(registry, process, root / "registry.log")
            yield registry
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


def _wait_until_up(registry: LocalRegistry, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{PROGRAM} exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.TransportError):
            # 200 open, 401 with auth: either way the API answers.
            if httpx.get(f"{registry.url}/v2/", timeout=2).status_code in (200, 401):
                return
        time.sleep(0.1)
    raise AssertionError(f"{PROGRAM} did not answer on {registry.url} within {START_TIMEOUT_S:.0f} s")


def require_registry() -> None:
    from tests.conftest import IN_CI

    problem = registry_missing()
    if problem is None:
        return
    if IN_CI:
        pytest.fail(f"[CI] required program missing: {problem}", pytrace=False)
    pytest.skip(f"needs {problem}")


@pytest.fixture(scope="session")
def oci_registry() -> Iterator[LocalRegistry]:
    """The test session's local registry (no auth)."""
    require_registry()
    with running_registry() as registry:
        try:
            yield registry
        finally:
            registry.forget_local_tags()
