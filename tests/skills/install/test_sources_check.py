"""The install plan's check of every package against its source (skills/install/sources_check.py):
on the real Docker engine, every miss of every kind is named at once, with its source, before
anything installs; npm needs are known before pip runs. npm's range forms on their own."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from console.models import JobStatus
from sandboxes.models import SandboxConfig
from skills.images import current_image
from skills.install.npm import npm_range_matches
from skills.install.sources_check import SOURCE_LISTING
from skills.models import SkillImage
from tests.personas import World
from tests.support.skill_install import (
    build_sandboxes,
    import_skill,
    job_error,
    run_install,
    skill_zip,
    skills_config,
)

RUN = b"#!/usr/bin/env python3\nimport tinydep\nprint(tinydep.VALUE)\n"


@pytest.fixture
def config(world: World, docker_base_image: str, installation: str, wheels: Path) -> Iterator[Any]:
    with skills_config(world.space_a, docker_base_image, installation, pip_find_links=wheels.name) as made:
        yield made


def _failed_step(world: World, config: SandboxConfig) -> str:
    return SkillImage.objects.get(space=world.space_a, config=config).failed_step


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db
def test_npm_needs_fail_before_pip_runs(world: World, config: SandboxConfig, installation: str) -> None:
    package_json = json.dumps({"name": "mixed", "dependencies": {"left-pad": "^1.3.0"}}).encode()
    skill = skill_zip(
        "mixed-skill",
        {"requirements.txt": b"tinydep\n", "package.json": package_json, "scripts/run.py": RUN},
        executable=("scripts/run.py",),
    )
    job = run_install(world.space_a, config, import_skill(skill))
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("step check failed: Debian packages nodejs, npm: not in the image"), job_error(job)
    assert job.error.endswith(
        "; mixed-skill declares npm dependencies (left-pad@^1.3.0) but the config has no npm package source "
        "(set 'npm tarball folder' or 'npm registry URL' on the backend)"
    ), job_error(job)
    assert _failed_step(world, config) == "check"
    assert not any("pip install" in str(line["message"]) for line in job.log)
    assert build_sandboxes(config, installation) == []


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db
def test_every_missing_package_is_named_with_its_source_at_once(world: World, config: SandboxConfig) -> None:
    skill = skill_zip(
        "needy-skill",
        {"requirements.txt": b"tinydep>=2.0\nnothere==1.0\n", "scripts/run.py": RUN},
        executable=("scripts/run.py",),
        extra_md='metadata:\n  debian-packages: "jq cowsay"\n',
    )
    version = import_skill(skill)
    assert version.dependencies["debian"] == ["jq", "cowsay"]
    job = run_install(world.space_a, config, version)
    assert job.status == JobStatus.FAILED
    assert "Debian package cowsay: not in the image, and the platform backend has no apt source" in job.error
    assert "pip tinydep>=2.0: the pip find-links folder offline/ has tinydep 1.0, none matching >=2.0" in job.error
    assert "pip nothere==1.0: no wheel of nothere in the pip find-links folder offline/" in job.error
    assert _failed_step(world, config) == "check"
    log = [str(line["message"]) for line in job.log]
    assert "plan: Debian jq: already in the image" in log
    assert current_image(world.space_a, config) is None


@pytest.mark.docker
@pytest.mark.redis
@pytest.mark.django_db
def test_the_plan_lists_each_package_found_then_installs(world: World, config: SandboxConfig) -> None:
    skill = skill_zip(
        "fine-skill", {"requirements.txt": b"tinydep>=1.0\n", "scripts/run.py": RUN}, executable=("scripts/run.py",)
    )
    job = run_install(world.space_a, config, import_skill(skill))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    log = [str(line["message"]) for line in job.log]
    assert "plan: pip tinydep>=1.0: 1.0 in the pip find-links folder offline/" in log
    assert log.index("step check") < log.index("step copy") < log.index("step dependencies")


def test_npm_ranges() -> None:
    versions = ["0.9.0", "1.0.0", "1.2.3", "1.3.0", "2.0.0", "2.1.0-beta.1"]
    tags = {"latest": "2.0.0", "next": "2.1.0-beta.1"}
    assert npm_range_matches("^1.2", versions, tags) == ["1.2.3", "1.3.0"]
    assert npm_range_matches("~1.2.0", versions, tags) == ["1.2.3"]
    assert npm_range_matches(">=1 <2", versions, tags) == ["1.0.0", "1.2.3", "1.3.0"]
    assert npm_range_matches("1.x", versions, tags) == ["1.0.0", "1.2.3", "1.3.0"]
    assert npm_range_matches("1.0.0 || 2", versions, tags) == ["1.0.0", "2.0.0"]
    assert npm_range_matches("^0.9", versions, tags) == ["0.9.0"]
    assert npm_range_matches("latest", versions, tags) == ["2.0.0"]
    assert npm_range_matches("next", versions, tags) == ["2.1.0-beta.1"]
    assert npm_range_matches("^3", versions, tags) == []
    assert npm_range_matches("*", versions, tags) == ["0.9.0", "1.0.0", "1.2.3", "1.3.0", "2.0.0"]
    assert npm_range_matches("1.0 - 1.2", versions, tags) == ["1.0.0", "1.2.3"]


def test_the_npm_listing_reads_a_registry_document_of_odd_shapes_as_no_versions() -> None:
    """The listing script (run in the build sandbox; here on the host against a loopback
    server): a document that is no object is a miss with a reason, versions or dist-tags of
    the wrong type are none; the other packages are still listed."""
    documents: dict[str, object] = {
        "/good": {"versions": {"1.0.0": {}}, "dist-tags": {"latest": "1.0.0"}},
        "/list": [],
        "/odd": {"versions": "1.0.0", "dist-tags": [1, 2]},
        "/tags": {"versions": {"1.0.0": {}}, "dist-tags": {"latest": {"v": 1}, "next": "1.0.0"}},
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(documents[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        urls = [base + path for path in documents]
        argv = [sys.executable, "-c", SOURCE_LISTING, "npm", "5", json.dumps(urls)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout.splitlines()[-1])
    assert listed[f"{base}/good"] == {"status": 200, "versions": ["1.0.0"], "tags": {"latest": "1.0.0"}}
    assert listed[f"{base}/list"]["status"] == 0
    assert "not a JSON object" in listed[f"{base}/list"]["error"]
    assert listed[f"{base}/odd"] == {"status": 200, "versions": [], "tags": {}}
    assert listed[f"{base}/tags"] == {"status": 200, "versions": ["1.0.0"], "tags": {"next": "1.0.0"}}
