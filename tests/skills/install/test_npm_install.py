"""npm installs of skills on the real Docker engine (skills/install/npm.py): from an npm
registry the test serves in a network namespace of its own, or from a folder of tarballs
served inside the build sandbox; never running a package's scripts; npm needs and Node.js
itself checked before anything installs."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.models import JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions.runtime import Runtime
from skills.images import current_image
from skills.models import SkillImage
from tests.personas import World
from tests.support.netns import Namespace, namespace
from tests.support.npm_source import NpmRegistry, write_npm_tarball
from tests.support.skill_install import (
    build_sandboxes,
    import_skill,
    job_error,
    log_lines,
    run_install,
    set_sources,
    skill_zip,
    skills_config,
)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]

# Marks the scripts would leave where both root and the session user could write, and
# which the snapshot keeps (/tmp is a scratch file system of each sandbox).
MARKS = ("/var/tmp/npm-preinstall-ran", "/var/tmp/npm-postinstall-ran", "/var/tmp/npm-skill-script-ran")
SCRIPTED = {"preinstall": f"touch {MARKS[0]}", "postinstall": f"touch {MARKS[1]}"}
RUN_JS = b"#!/usr/bin/env node\nconsole.log(require('greeter'));\n"


@pytest.fixture
def sources_root(wheels: Path) -> Path:
    """The sources' root, holding the wheel folder `offline` (tinydep 1.0)."""
    return wheels.parent


@pytest.fixture
def node_config(world: World, docker_node_image: str, installation: str, sources_root: Path) -> Iterator[SandboxConfig]:
    with skills_config(world.space_a, docker_node_image, installation, pip_find_links="offline") as made:
        yield made


@pytest.fixture
def base_config(world: World, docker_base_image: str, installation: str, sources_root: Path) -> Iterator[SandboxConfig]:
    with skills_config(world.space_a, docker_base_image, installation, pip_find_links="offline") as made:
        yield made


@pytest.fixture
def source_host() -> Iterator[Namespace]:
    """The registry's machine: a namespace of the test's own (tests/support/netns.py)."""
    with namespace() as made:
        yield made


def npm_skill(name: str, dependencies: dict[str, str], *, pip: bool = False, **package: Any) -> bytes:
    document = {"name": name, "version": "1.0.0", "dependencies": dependencies, **package}
    files = {"package.json": json.dumps(document).encode(), "scripts/run.js": RUN_JS}
    if pip:
        files["requirements.txt"] = b"tinydep\n"
    return skill_zip(name, files, executable=("scripts/run.js",))


def sh(runtime: Runtime, session: Session, shell: str) -> tuple[int, str]:
    result = runtime.exec(session, ExecRequest(shell=shell, user="user", timeout_s=60))
    return result.exit_code, (result.stdout + result.stderr).decode()


def test_no_package_script_runs_during_an_npm_install(
    world: World,
    node_config: SandboxConfig,
    source_host: Namespace,
    runtime: Runtime,
    installation: str,
    tmp_path: Path,
) -> None:
    """A dependency's preinstall/postinstall (and the skill's own package.json scripts) would
    run as root inside the build; none runs, and the package still installs."""
    tarballs = [
        write_npm_tarball(tmp_path / "registry", "greeter", "1.2.0", scripts=SCRIPTED),
        write_npm_tarball(tmp_path / "registry", "greeter", "2.0.0"),
    ]
    skill = npm_skill("scripted-skill", {"greeter": "^1.0.0"}, scripts={"postinstall": f"touch {MARKS[2]}"})
    with source_host.run(lambda: NpmRegistry(source_host.address, tarballs)) as registry:
        set_sources(node_config, npm_registry_url=registry.url)
        job = run_install(world.space_a, node_config, import_skill(skill))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    assert "/greeter" in registry.paths
    assert "/-/files/greeter-1.2.0.tgz" in registry.paths
    lines = log_lines(job)
    assert (
        "scripted-skill: warning: npm package greeter@1.2.0 has an install script, which was not run "
        "(npm runs with --ignore-scripts); what it would build is missing"
    ) in lines
    image = current_image(world.space_a, node_config)
    assert image is not None
    assert image.manifest[0]["installed"] == ["greeter@1.2.0"]
    assert build_sandboxes(node_config, installation) == []

    session = runtime.resolve(world.space_a, "after-npm").session
    assert sh(runtime, session, "ls " + " ".join(MARKS)) == (
        2,
        "".join(f"ls: cannot access '{mark}': No such file or directory\n" for mark in MARKS),
    )
    assert sh(runtime, session, "/opt/skills/scripted-skill/scripts/run.js") == (0, "greeter 1.2.0\n")
    assert sh(runtime, session, "stat -c '%U %a' /opt/skills/scripted-skill/node_modules/greeter/index.js") == (
        0,
        "root 644\n",
    )
    assert sh(runtime, session, "test -e /tmp/skill-build-npm; echo $?") == (0, "1\n")


def test_installs_from_a_tarball_folder_offline_with_dependencies(
    world: World, node_config: SandboxConfig, sources_root: Path, runtime: Runtime, installation: str
) -> None:
    folder = sources_root / "npm"
    write_npm_tarball(
        folder,
        "greeter",
        "1.0.0",
        dependencies={"@words/hello": "~2.1.0"},
        files={"index.js": b"module.exports = require('@words/hello') + ' from greeter';\n"},
    )
    write_npm_tarball(folder, "@words/hello", "2.1.3", files={"index.js": b"module.exports = 'hello';\n"})
    write_npm_tarball(folder, "@words/hello", "2.2.0", files={"index.js": b"module.exports = 'too new';\n"})
    set_sources(node_config, npm_folder="npm", npm_registry_url="http://127.0.0.1:9/")  # the folder wins
    job = run_install(world.space_a, node_config, import_skill(npm_skill("folder-skill", {"greeter": "1"})))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    lines = log_lines(job)
    assert "build sandbox: outbound network off (no package source to reach over it)" in lines
    assert "plan: npm greeter@1: 1.0.0 in the npm tarball folder npm/" in lines
    assert any(
        line.startswith("serving the npm tarball folder npm/ (3 tarball(s)) to npm on 127.0.0.1:") for line in lines
    )
    image = current_image(world.space_a, node_config)
    assert image is not None
    assert image.manifest[0]["installed"] == ["@words/hello@2.1.3", "greeter@1.0.0"]

    session = runtime.resolve(world.space_a, "after-folder").session
    assert sh(runtime, session, "/opt/skills/folder-skill/scripts/run.js") == (0, "hello from greeter\n")


def test_a_package_missing_from_the_folder_fails_the_check_before_pip(
    world: World, node_config: SandboxConfig, sources_root: Path, installation: str
) -> None:
    """Every miss, a dependency's too, is named with the folder before pip or npm runs."""
    folder = sources_root / "npm"
    write_npm_tarball(folder, "greeter", "1.0.0", dependencies={"absent": "^3.0.0"})
    write_npm_tarball(folder, "other", "1.0.0")
    set_sources(node_config, npm_folder="npm")
    skill = npm_skill("needy-skill", {"greeter": "^1", "other": ">=2", "nowhere": "*"}, pip=True)
    job = run_install(world.space_a, node_config, import_skill(skill))
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "step check failed: npm other@>=2: the npm tarball folder npm/ has 1.0.0, none in the range >=2; "
        "npm nowhere@*: not in the npm tarball folder npm/; "
        "npm absent@^3.0.0 (a dependency of greeter@1.0.0): not in the npm tarball folder npm/"
    ), job_error(job)
    assert SkillImage.objects.get(space=world.space_a, config=node_config).failed_step == "check"
    assert not any("pip install" in line or "npm install" in line for line in log_lines(job))
    assert build_sandboxes(node_config, installation) == []


def test_a_template_without_npm_is_named_before_pip_runs(
    world: World, base_config: SandboxConfig, sources_root: Path, installation: str
) -> None:
    """Node.js and npm come from Debian packages; with no Debian package source the check says
    which packages and why, before pip runs."""
    write_npm_tarball(sources_root / "npm", "greeter", "1.0.0")
    set_sources(base_config, npm_folder="npm")
    job = run_install(world.space_a, base_config, import_skill(npm_skill("node-skill", {"greeter": "^1"}, pip=True)))
    assert job.status == JobStatus.FAILED
    assert job.error == (
        "step check failed: Debian packages nodejs, npm: not in the image, and the platform backend has no apt "
        "source (set 'apt repository folder' or 'apt mirror or proxy URL' on it) (needed: npm is not in the "
        "template and node-skill declares npm packages)"
    ), job_error(job)
    lines = log_lines(job)
    assert "plan: npm greeter@^1: 1.0.0 in the npm tarball folder npm/" in lines
    assert "plan: pip tinydep: 1.0 in the pip find-links folder offline/" in lines
    assert not any("pip install" in line for line in lines)
    assert current_image(world.space_a, base_config) is None


def test_node_comes_from_the_apt_source_when_the_template_lacks_npm(
    world: World, base_config: SandboxConfig, sources_root: Path, apt_folder: Path, runtime: Runtime, settings: Any
) -> None:
    """The base template has no Node.js: nodejs and npm come from the local apt repository
    (.ci/docker-up prepares it), then the npm packages from the tarball folder, all offline."""
    settings.SKILL_PACKAGE_SOURCES_ROOT = sources_root  # apt_folder pointed it at the prepared ones
    shutil.copytree(apt_folder, sources_root / "debian", copy_function=_link_or_copy)
    write_npm_tarball(sources_root / "npm", "greeter", "1.0.0")
    set_sources(base_config, apt_folder="debian", npm_folder="npm")
    job = run_install(world.space_a, base_config, import_skill(npm_skill("node-skill", {"greeter": "^1"})))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    lines = log_lines(job)
    assert "build sandbox: outbound network off (no package source to reach over it)" in lines
    for package in ("nodejs", "npm"):
        assert any(
            line.startswith(f"plan: Debian {package}: ") and line.endswith(" in the apt repository folder debian/")
            for line in lines
        ), lines
    assert lines.index("step check") < lines.index("step copy")
    session = runtime.resolve(world.space_a, "node-from-apt").session
    assert sh(runtime, session, "/opt/skills/node-skill/scripts/run.js") == (0, "greeter 1.0.0\n")


def _link_or_copy(source: str, target: str) -> None:
    """A hard link where the file system allows (the repository is ~50 MB), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
