"""Skills' Debian packages from the platform backend's apt source, on the real Docker engine.

The source is the local apt repository folder `.ci/docker-up` prepares (scripts/apt_repo.py):
as a folder, the build sandbox stays offline and the console copies the index and the .deb
files an install needs into it; as a URL, the same folder is served by the test inside a
network namespace of its own (a mirror's shape), the only address the build sandbox may
reach. Each test gets its own installation id; everything it creates is deleted.
"""

from __future__ import annotations

import posixpath
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.models import JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import PlatformBackend, SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.images import current_image
from tests.conftest import REDIS_URL
from tests.personas import World
from tests.support.file_server import FileServer
from tests.support.netns import Namespace, namespace
from tests.support.skill_install import (
    build_sandboxes,
    clean_up,
    import_skill,
    job_error,
    make_skills_config,
    plain_skill,
    run_install,
    skills_config,
)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]

PDF_TOOLS = 'metadata:\n  debian-packages: "poppler-utils qpdf"\n'


@pytest.fixture
def config(world: World, docker_base_image: str, installation: str, apt_folder: Path) -> Iterator[SandboxConfig]:
    with skills_config(world.space_a, docker_base_image, installation, apt_folder=apt_folder.name) as made:
        yield made


def test_poppler_and_qpdf_install_offline_and_run_as_the_session_user(
    world: World, config: SandboxConfig, installation: str
) -> None:
    job = run_install(world.space_a, config, import_skill(plain_skill("pdf-tools", extra_md=PDF_TOOLS)))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    messages = [str(line.get("message")) for line in job.log]
    assert "build sandbox: outbound network off (no package source to reach over it)" in messages
    assert any(
        m.startswith("plan: Debian qpdf: ") and m.endswith(" in the apt repository folder debian/") for m in messages
    )
    assert any(m.startswith("copied ") and " .deb file(s) " in m for m in messages)
    image = current_image(world.space_a, config)
    assert image is not None
    installed = image.manifest[0]["installed"]
    assert {line.partition("=")[0] for line in installed} == {"poppler-utils", "qpdf"}
    assert build_sandboxes(config, installation) == []

    runtime = Runtime(RedisSessionStore(REDIS_URL))
    session = runtime.resolve(world.space_a, "pdf").session

    def sh(shell: str) -> tuple[int, str]:
        result = runtime.exec(session, ExecRequest(shell=shell, user="user", timeout_s=60))
        return result.exit_code, (result.stdout + result.stderr).decode()

    code, out = sh("pdftoppm -v")
    assert code == 0, out
    assert "pdftoppm version 22." in out
    code, out = sh("qpdf --version")
    assert code == 0, out
    assert out.startswith("qpdf version 11.")
    # Only what the skill needs: no recommends, not the folder's other packages; apt's
    # lists, caches and the copied .deb files left with the scratch folder.
    assert sh("dpkg-query -W -f='${Status}' nodejs")[0] != 0
    debs = "find / -xdev -name '*.deb' 2>/dev/null | wc -l"
    listing = f"{debs}; ls /var/lib/apt/lists | grep -c Packages; ls -A /var/cache/apt | wc -l"
    code, out = sh(f"{listing}; test -e /tmp/skill-build; echo $?")
    assert out.split() == ["0", "0", "0", "1"]


def test_a_package_the_folder_lacks_fails_the_check_naming_it_and_the_folder(
    world: World, config: SandboxConfig, installation: str
) -> None:
    needs = 'metadata:\n  debian-packages: "qpdf cowsay jq"\n'
    job = run_install(world.space_a, config, import_skill(plain_skill("needs-cowsay", extra_md=needs)))
    assert job.status == JobStatus.FAILED
    assert job.error == "step check failed: Debian package cowsay: not in the apt repository folder debian/"
    messages = [str(line.get("message")) for line in job.log]
    assert "step copy" not in " ".join(messages)
    assert build_sandboxes(config, installation) == []


def test_a_name_apt_would_read_as_a_pattern_is_not_in_the_folder(
    world: World, config: SandboxConfig, installation: str
) -> None:
    """apt-get and apt-cache read a name that no package has, holding '.' or '+', as a regular
    expression: "qpd." would install qpdf (and any package it matches). A name is exact."""
    needs = 'metadata:\n  debian-packages: "qpd."\n'
    job = run_install(world.space_a, config, import_skill(plain_skill("needs-pattern", extra_md=needs)))
    assert job.status == JobStatus.FAILED
    assert job.error == "step check failed: Debian package qpd.: not in the apt repository folder debian/"
    assert build_sandboxes(config, installation) == []


def test_a_dependency_the_folder_lacks_fails_the_check_before_anything_installs(
    world: World, docker_base_image: str, installation: str, apt_folder: Path, settings: Any, tmp_path: Path
) -> None:
    # The folder holds qpdf, but its index lacks libqpdf29, which qpdf depends on.
    partial = tmp_path / "partial-apt"
    partial.mkdir()
    stanzas = (apt_folder / "Packages").read_text().split("\n\n")
    kept = [s for s in stanzas if s.strip() and not s.startswith("Package: libqpdf29\n")]
    (partial / "Packages").write_text("\n\n".join(kept) + "\n")
    qpdf = next(apt_folder.glob("qpdf_*.deb"))
    shutil.copy(qpdf, partial / qpdf.name)
    settings.SKILL_PACKAGE_SOURCES_ROOT = tmp_path
    config = make_skills_config(world.space_a, docker_base_image, apt_folder=partial.name)
    try:
        job = run_install(world.space_a, config, import_skill(plain_skill("needs-qpdf", extra_md=PDF_TOOLS)))
        assert job.status == JobStatus.FAILED
        assert job.error.startswith(
            "step check failed: Debian packages poppler-utils, qpdf cannot be installed from the apt repository "
            "folder partial-apt/: "
        ), job.error
        assert "libqpdf29" in job.error
    finally:
        clean_up(config, installation)


@pytest.fixture
def mirror(apt_folder: Path) -> Iterator[tuple[Namespace, FileServer]]:
    """The local apt repository served over HTTP from a namespace of the test's own."""
    with namespace() as host, host.run(lambda: FileServer(host.address, apt_folder)) as served:
        yield host, served


def use_url(config: SandboxConfig, url: str, *, trusted: bool) -> None:
    PlatformBackend.objects.filter(pk=config.backend_id).update(apt_folder="", apt_url=url, apt_trusted=trusted)
    config.refresh_from_db()


def test_a_mirror_url_is_the_only_place_the_build_reaches(
    world: World, config: SandboxConfig, mirror: tuple[Namespace, FileServer], installation: str
) -> None:
    host, served = mirror
    use_url(config, served.url, trusted=True)
    needs = 'metadata:\n  debian-packages: "qpdf"\n'
    job = run_install(world.space_a, config, import_skill(plain_skill("needs-qpdf", extra_md=needs)))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    messages = [str(line.get("message")) for line in job.log]
    assert (
        f"build sandbox: outbound network limited to {host.address}, all else denied, "
        f"to reach the apt source {served.url}" in messages
    )
    assert f"apt reads the apt source {served.url} only: deb [trusted=yes] {served.url} ./" in messages
    paths = [posixpath.normpath(path) for path in served.paths]  # apt asks for /./Packages
    assert "/Packages" in paths
    assert any(path.startswith("/qpdf_") and path.endswith(".deb") for path in paths)
    assert not any(path.startswith(("/nodejs_", "/poppler-utils_")) for path in paths)
    assert {client for client, _ in served.requests} == {host.host_address}
    image = current_image(world.space_a, config)
    assert image is not None
    assert any(line.startswith("qpdf=") for line in image.manifest[0]["installed"])
    assert build_sandboxes(config, installation) == []

    runtime = Runtime(RedisSessionStore(REDIS_URL))
    session = runtime.resolve(world.space_a, "qpdf").session
    result = runtime.exec(session, ExecRequest(shell="qpdf --version", user="user", timeout_s=60))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith(b"qpdf version 11.")


def test_an_unsigned_mirror_is_refused_unless_the_admin_trusts_it(
    world: World, config: SandboxConfig, mirror: tuple[Namespace, FileServer], installation: str
) -> None:
    _, served = mirror
    use_url(config, served.url, trusted=False)
    needs = 'metadata:\n  debian-packages: "qpdf"\n'
    job = run_install(world.space_a, config, import_skill(plain_skill("needs-qpdf", extra_md=needs)))
    assert job.status == JobStatus.FAILED
    assert job.error.startswith(
        f"step check failed: the apt source {served.url} could not be read from the build sandbox: "
    ), job_error(job)
    assert "does not have a Release file" in job.error
    assert not any(path.endswith(".deb") for path in served.paths)
    assert current_image(world.space_a, config) is None
    assert build_sandboxes(config, installation) == []
