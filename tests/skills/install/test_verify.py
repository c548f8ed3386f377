"""Verify runs what the skill runs, on the real Docker engine: every entry script's import
closure resolves and every program it calls is on PATH, as the session user in the built
image, and the skill's own check script runs too. Wheels are written by the tests and
served from a local wheel folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from console.models import JobStatus
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.images import current_image
from skills.models import SkillImage, SkillImageStatus
from tests.conftest import REDIS_URL
from tests.personas import World
from tests.support.skill_install import (
    build_sandboxes,
    import_skill,
    job_error,
    run_install,
    skill_zip,
    skills_config,
    write_wheel_tree,
)

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]

STREAMING_V1 = b"def streamablehttp_client(url):\n    return url\n"
STREAMING_V2 = b"def connect(url):\n    return url\n"


@pytest.fixture
def wheels(settings: Any, tmp_path: Path) -> Path:
    folder = tmp_path / "package-sources" / "wheels"
    # numpy's shape: no top_level.txt, and a `<name>.libs/` folder beside the package.
    write_wheel_tree(
        folder,
        "numpyish",
        "1.0",
        {
            "numpyish/__init__.py": b"from .core import mean\n",
            "numpyish/core.py": b"def mean(xs):\n    return sum(xs) / len(xs)\n",
            "numpyish.libs/libopenblas-x.so": b"\x7fELF not really",
        },
        top_level=False,
    )
    # A name that a later release dropped, like mcp's streamablehttp_client.
    for version, module in (("1.0", STREAMING_V1), ("2.0", STREAMING_V2)):
        write_wheel_tree(
            folder,
            "streamy",
            version,
            {
                "streamy/__init__.py": b"",
                "streamy/client/__init__.py": b"",
                "streamy/client/streamable_http.py": module,
            },
        )
    settings.SKILL_PACKAGE_SOURCES_ROOT = folder.parent
    return folder


@pytest.fixture
def config(world: World, docker_base_image: str, installation: str, wheels: Path) -> Iterator[SandboxConfig]:
    with skills_config(world.space_a, docker_base_image, installation, pip_find_links=wheels.name) as made:
        yield made


def test_a_numpy_style_wheel_and_what_the_scripts_really_use_pass(world: World, config: SandboxConfig) -> None:
    """No top_level.txt, a numpyish.libs folder: the old check imported `numpyish.libs`."""
    skill = skill_zip(
        "stats-skill",
        {
            "requirements.txt": b"numpyish\n",
            "scripts/stats.py": (
                b"#!/usr/bin/env python3\nimport json, subprocess, sys\nimport numpyish\n"
                b"from numpyish.core import mean\nfrom helpers import fmt\n"
                b"try:\n    import ujson\nexcept ImportError:\n    ujson = None\n"
                b"import shutil\nif shutil.which('soffice'):\n    subprocess.run(['soffice', '--version'])\n"
                b"subprocess.run(['jq', '--version'], check=True)\nprint(fmt(mean([1, 2, 3])))\n"
            ),
            "scripts/helpers.py": (
                b"import os.path\nfrom collections import OrderedDict\n\ndef fmt(x):\n    return str(x)\n"
            ),
            "scripts/report.sh": b"#!/bin/bash\nset -e\ncurl --version | head -1\njq -n 1\n",
        },
        executable=("scripts/stats.py", "scripts/report.sh"),
    )
    job = run_install(world.space_a, config, import_skill(skill))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    image = current_image(world.space_a, config)
    assert image is not None
    verified = image.manifest[0]["verified_by"]
    assert verified == "entry checks (3 script(s))"
    assert any("stats-skill: entry checks passed (3 script(s)" in line["message"] for line in job.log)


def test_an_unpinned_requirement_resolving_to_a_release_without_the_name_fails(
    world: World, config: SandboxConfig, installation: str
) -> None:
    skill = skill_zip(
        "stream-skill",
        {
            "requirements.txt": b"streamy>=1.0\n",
            "scripts/connect.py": (
                b"#!/usr/bin/env python3\nimport sys\n"
                b"from streamy.client.streamable_http import streamablehttp_client\n"
                b"print(streamablehttp_client(sys.argv[1]))\n"
            ),
        },
        executable=("scripts/connect.py",),
    )
    job = run_install(world.space_a, config, import_skill(skill))
    assert job.status == JobStatus.FAILED
    assert "step verify failed" in job.error
    assert (
        "scripts/connect.py: from streamy.client.streamable_http import streamablehttp_client (line 3): "
        "streamy.client.streamable_http has no streamablehttp_client (installed: streamy 2.0)"
    ) in job.error
    assert current_image(world.space_a, config) is None
    assert SkillImage.objects.get(space=world.space_a, config=config).status == SkillImageStatus.FAILED
    assert build_sandboxes(config, installation) == []


def test_undeclared_modules_and_missing_programs_fail_naming_script_and_name(
    world: World, config: SandboxConfig
) -> None:
    """The closure follows the skill's own modules; shell scripts' commands are checked too;
    a passing check script does not hide them."""
    skill = skill_zip(
        "pdf-skill",
        {
            "scripts/convert.py": b"#!/usr/bin/env python3\nimport sys\nimport pdfhelpers\npdfhelpers.go(sys.argv)\n",
            "scripts/pdfhelpers.py": (
                b"import subprocess\nimport pypdfish\n\ndef go(argv):\n"
                b"    subprocess.run(['pdftoppmish', '-png', argv[1]], check=True)\n"
            ),
            "scripts/render.sh": b'#!/bin/bash\nset -e\nqpdfish --check "$1"\necho done\n',
            "tools/extract.py": b"import lxmlish\n",
            "scripts/check.sh": b"#!/bin/bash\nexit 0\n",
        },
        executable=("scripts/convert.py", "scripts/render.sh", "scripts/check.sh"),
        body="Run `python3 tools/extract.py FILE` first.",
    )
    job = run_install(world.space_a, config, import_skill(skill))
    assert job.status == JobStatus.FAILED, job_error(job)
    assert "step verify failed" in job.error
    assert (
        "scripts/convert.py -> scripts/pdfhelpers.py: import pypdfish (line 2): pypdfish is not installed in the image"
    ) in job.error
    assert "scripts/pdfhelpers.py: calls pdftoppmish (line 5), which is not on PATH" in job.error
    assert "scripts/render.sh: calls qpdfish (line 3), which is not on PATH" in job.error
    assert "tools/extract.py: import lxmlish (line 1): lxmlish is not installed in the image" in job.error
    assert "check script" not in job.error


def test_what_the_check_script_leaves_as_the_session_user_is_not_in_the_image(
    world: World, config: SandboxConfig
) -> None:
    """A check script runs the skill as uid 1000, and what it writes (caches in $HOME, a line
    in .bashrc, files in /tmp) or leaves running must not become part of every session."""
    skill = skill_zip(
        "cache-skill",
        {
            "scripts/check.sh": (
                b"#!/bin/bash\nset -e\n"
                b'mkdir -p "$HOME/.cache/cache-skill" && echo x > "$HOME/.cache/cache-skill/state"\n'
                b"echo 'echo planted-by-check' >> \"$HOME/.bashrc\"\n"
                b"echo x > /tmp/planted-by-check\n"
                b"nohup bash -c 'sleep 2; echo late > /var/tmp/late-by-check' >/dev/null 2>&1 &\n"
            ),
        },
        executable=("scripts/check.sh",),
    )
    job = run_install(world.space_a, config, import_skill(skill))
    assert job.status == JobStatus.SUCCEEDED, job_error(job)
    assert current_image(world.space_a, config) is not None
    runtime = Runtime(RedisSessionStore(REDIS_URL))
    session = runtime.resolve(world.space_a, "skills").session
    probe = (
        "sleep 3; ls -A ~/.cache /tmp /var/tmp 2>/dev/null; grep -c planted-by-check ~/.bashrc;"
        " test -f ~/.bashrc && test -f ~/.profile && echo home-kept"
    )
    result = runtime.exec(session, ExecRequest(shell=probe, user="user", timeout_s=60))
    out = result.stdout.decode()
    for left in ("cache-skill", "planted-by-check", "late-by-check"):
        assert left not in out, out
    assert "\n0\n" in f"\n{out}", "the .bashrc line is gone"
    assert "home-kept" in out, "the template's own home files stay"
