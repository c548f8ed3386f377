"""The bundled examples install on the embedded defaults: imported from the UI's service, the
local engine's pip source being the examples' wheel folder that scripts/setup.sh downloads
(var/package-sources/examples), and jq from the base image. Then a session uses each one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from console.models import JobStatus
from console.services import SYSTEM
from sandboxes.backends.base import ExecRequest
from sandboxes.models import SandboxConfig
from sandboxes.sessions.runtime import Runtime
from sandboxes.sessions.store import RedisSessionStore
from skills.services import do_import_examples
from tests.conftest import REDIS_URL
from tests.personas import World
from tests.support.skill_install import job_error, run_install, skills_config

pytestmark = [pytest.mark.docker, pytest.mark.redis, pytest.mark.django_db]


@pytest.fixture
def config(world: World, docker_base_image: str, examples_source: Path, installation: str) -> Iterator[SandboxConfig]:
    with skills_config(
        world.space_a, docker_base_image, installation, name="defaults", pip_find_links=examples_source.name
    ) as made:
        yield made


def test_every_bundled_example_installs_and_runs_on_the_defaults(world: World, config: SandboxConfig) -> None:
    imported = do_import_examples(actor=SYSTEM)
    assert imported.refused == []
    versions = {result.version.skill.name: result.version for result in imported.results}
    assert set(versions) == {"csv-summary", "text-stats", "commit-message-style"}
    for name in ("csv-summary", "text-stats", "commit-message-style"):
        job = run_install(world.space_a, config, versions[name])
        assert job.status == JobStatus.SUCCEEDED, job_error(job)

    runtime = Runtime(RedisSessionStore(REDIS_URL))
    session = runtime.resolve(world.space_a, "uses-the-examples").session

    def run(shell: str) -> str:
        result = runtime.exec(session, ExecRequest(shell=shell, user="user", timeout_s=60, cwd="/workspace"))
        assert result.exit_code == 0, result.stderr.decode() + result.stdout.decode()
        return result.stdout.decode()

    run("printf 'name,n\\nada,3\\nbob,5\\n' > data.csv && printf 'one two two\\n' > notes.txt")
    table = run("python3 /opt/skills/csv-summary/scripts/summarise.py data.csv")
    assert "name" in table
    assert "mean" in table.lower()
    assert "tabulate" in run("python3 -c 'import tabulate; print(tabulate.__name__)'")
    stats = run("/opt/skills/text-stats/scripts/text-stats.sh notes.txt")
    assert '"words": 3' in stats.replace(":3", ": 3")
    assert run("test -f /opt/skills/commit-message-style/SKILL.md && echo present").strip() == "present"
