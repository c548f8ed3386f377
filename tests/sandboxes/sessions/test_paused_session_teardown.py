"""A paused session's deletion and a second pause (real Docker, bounded disks): a pause of a
paused session answers in words, and deleting a paused session leaves no container, volume,
loop image or mount behind."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from console.jobs import run_job
from console.models import JobStatus
from console.services import Actor
from sandboxes.api.tokens import do_create_api_token
from sandboxes.backends.docker.loopfs import list_names
from sandboxes.models import SandboxConfig, Session
from sandboxes.sessions import teardown
from tests.personas import World
from tests.sandboxes.api.test_agent_api import Agent
from tests.sandboxes.backends.docker.test_disk_limits import disk_dir, limited, mounted_under  # noqa: F401 - fixtures
from tests.support.pause_support import answer_of

pytestmark = [pytest.mark.docker]


def loops_under(folder: Path) -> list[str]:
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if str(folder) in line]


@pytest.mark.django_db(transaction=True)
def test_a_paused_session_paused_again_then_deleted_leaves_nothing(
    world: World,
    limited: SandboxConfig,  # noqa: F811 - the fixture
    disk_dir: Path,  # noqa: F811 - the fixture
    engine: Any,
) -> None:
    _, token = do_create_api_token(world.space_a, name="pause", actor=Actor(user=world.alice))
    agent = Agent(world.space_a.id, token)
    for key in ("persist", "scratch"):
        if key == "scratch":
            SandboxConfig.objects.filter(pk=limited.pk).update(persistent_workspace=False)
        assert agent.post(key, "resolve").status_code == 200
        assert answer_of(agent.post(key, "pause")) == (200, "")
        assert answer_of(agent.post(key, "pause")) == (200, "")  # paused already: said so, no 502
        ran = agent.post(key, "exec", {"shell": "echo hi", "timeout_s": 30})  # resumes it
        assert ran.status_code == 200, ran.content
        assert ran.json()["stdout"] == "hi\n"
        assert answer_of(agent.post(key, "pause")) == (200, "")
    assert len(loops_under(disk_dir)) == 2  # the persistent workspace's and the scratch's
    session = Session.objects.get(space=world.space_a, key="persist")
    job = teardown.start_teardown(teardown.KIND_SESSION, world.space_a, str(session.pk), actor=teardown.SYSTEM)
    run_job(str(job.id))
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, job.error
    assert not engine.containers(all=True, filters={"id": session.sandbox_id})
    deleted = agent.delete("scratch")
    assert deleted.status_code == 204, deleted.content
    assert list_names(disk_dir) == []
    assert mounted_under(disk_dir) == []
    assert loops_under(disk_dir) == []
